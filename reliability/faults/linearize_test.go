package faults

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log"
	"math"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/reliability/internal/rig"
	"github.com/cheetahbroker/cheetah/reliability/linearize"
)

// TestClusterLinearizableThroughAKill records concurrent acquire, renew,
// release, send and revoke histories over three `cheetah serve` replicas on
// one PostgreSQL behind a balancer, SIGKILLs the replica that holds the
// contexts' client a third of the way through each history (its client
// reconnects through the balancer, which stops sending to the dead one),
// and halfway through freezes PostgreSQL (every process of its own
// cluster stopped for 2.5 s, over twice the replicas' TTL): the survivors
// fence, forget their clients and leases, and give them up once the
// database answers again, to be adopted where the clients reconnect. Each
// history is checked with porcupine against linearize.FaultModel: a call
// whose answer died with the replica may have taken effect or not, and
// while the client is away what needs it does nothing; otherwise one lease
// per context, epochs rising, an ended lease never used again.
func TestClusterLinearizableThroughAKill(t *testing.T) {
	needProcesses(t)
	t.Parallel()
	const contexts, callers, opsEach = 3, 4, 400
	const stall = 2500 * time.Millisecond
	pg := rig.NewPGCluster(t)
	dsn := pg.URL()
	replicas := make([]*rig.Serve, 3)
	for i := range replicas {
		replicas[i] = rig.NewServe(bin, rig.FreeAddr(t), adminKey, dsn, "--replica-ttl", "1s")
		replicas[i].Start(t)
	}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for i, r := range replicas {
			if f, err := os.CreateTemp("", fmt.Sprintf("cheetah-linearize-kill-replica%d-*.log", i)); err == nil {
				_, _ = f.WriteString(r.AllLogs())
				f.Close()
				t.Logf("replica %d's logs: %s", i, f.Name())
			}
		}
	})
	lb := newBalancer(t, replicas)
	api := rig.NewAPI(lb.URL)
	defer api.HC.CloseIdleConnections()
	app := api.MakeKey(t, adminKey, "app", "")
	ctx := context.Background()

	var total, unknown, lost, notLive, okAfter, kept int
	for round := range *rounds {
		user := fmt.Sprintf("usr_lin_kill_%d", round)
		victim := round % len(replicas)
		fc := &rig.FakeClient{URL: replicas[victim].API.Base, Key: api.MakeKey(t, adminKey, "client", user),
			UserID: user, ClientID: "lin-client", Check: rig.NewChecker()}
		require.NoError(t, fc.Connect(ctx))
		require.NoError(t, fc.Report(linearize.Reports(contexts)...))
		stopClient := reconnectThrough(fc, lb.URL, linearize.Reports(contexts)...)
		// A lease the history never touches (a browser's: the history
		// acquires console contexts), held across the kill.
		keeper := &rig.FakeClient{URL: replicas[victim].API.Base, Key: fc.Key, UserID: user, ClientID: "keeper",
			Type: protocol.ClientBrowser, Check: rig.NewChecker()}
		require.NoError(t, keeper.Connect(ctx))
		require.NoError(t, keeper.Report(rig.Worker("k0")))
		stopKeeper := reconnectThrough(keeper, lb.URL, rig.Worker("k0"))
		// A replica started again in the last round may still be reserving
		// its first block of epochs (503): the set-up waits for it.
		var held cheetah.Lease
		var ans rig.Answer
		require.Eventually(t, func() bool {
			held, ans = api.Acquire(ctx, app, map[string]any{"user_id": user, "task_id": "keep", "client_type": "browser", "ttl_s": 3600})
			return ans.Status != http.StatusServiceUnavailable
		}, 30*time.Second, 50*time.Millisecond)
		require.Equal(t, 201, ans.Status, "%s", ans)

		d := &killing{Driver: linearize.HTTPDriver{API: api, App: app, Admin: adminKey, User: user, Client: "lin-client"},
			at: callers * opsEach / 4, kill: make(chan struct{}), stallAt: callers * opsEach / 2, stall: make(chan struct{})}
		killed, thawed := make(chan struct{}), make(chan error, 1)
		go func() {
			<-d.kill
			replicas[victim].Proc.Kill()
			d.dead.Store(true)
			lb.drop(victim) // as a balancer's health check would, soon after
			close(killed)
		}()
		go func() {
			<-d.stall
			thawed <- pg.Freeze(stall)
		}()
		h := linearize.Record(d, uint64(7000+round), callers, opsEach)
		select {
		case <-killed:
		default:
			t.Fatalf("round %d: the history ended before the kill", round)
		}
		select {
		case err := <-thawed:
			require.NoError(t, err, "round %d: the database's freeze", round)
		default:
			t.Fatalf("round %d: the history ended before the database thawed", round)
		}
		res, info := porcupine.CheckOperationsVerbose(linearize.FaultModel(contexts), h, 2*time.Minute)
		if res != porcupine.Ok {
			f, err := os.CreateTemp("", "cheetah-linearize-kill-*.html")
			if err == nil {
				_ = porcupine.Visualize(linearize.FaultModel(contexts), info, f)
				f.Close()
			}
			dumpHistory(t, h, info) // and the replicas' logs, as the test fails
			t.Fatalf("round %d: %s on %d operations (visualisation: %s): %s", round, res, len(h), f.Name(), linearize.Describe(h))
		}
		for _, op := range h {
			o := op.Output.(linearize.Output)
			unknown += b2i(o.Unknown)
			lost += b2i(o.Lost)
			notLive += b2i(o.Reason == string(cheetah.LostNotLive))
		}
		total += len(h)
		okAfter += int(d.okAfter.Load())
		kept += int(d.keptLeases.Load())
		require.NotZero(t, d.okAfter.Load(), "round %d: nothing succeeded after the kill", round)
		// The kept lease is adopted where its client reconnected, with its
		// epoch; until then it is 503, never lost.
		var renewed struct{ Lease cheetah.Lease }
		ok := rig.PollUntil(ctx, 30*time.Second, 20*time.Millisecond, func() bool {
			ans := api.Do(ctx, "POST", "/api/v1/lease/renew", app, nil, "X-Lease", held.LeaseToken)
			require.Contains(t, []int{200, 503}, ans.Status, "round %d: the kept lease: %s", round, ans)
			return ans.Status == 200 && ans.Decode(&renewed) == nil
		})
		require.True(t, ok, "round %d: the kept lease was never adopted", round)
		require.Equal(t, held.Epoch, renewed.Lease.Epoch, "round %d: the kept lease's epoch", round)
		stopKeeper()
		stopClient()
		require.Empty(t, fc.Check.Errors(), "round %d: what the client was sent", round)
		require.Empty(t, keeper.Check.Errors(), "round %d: what the keeper was sent", round)
		replicas[victim].Start(t)
		lb.restore(victim)
	}
	t.Logf("%d histories, each through a replica's SIGKILL and a %v freeze of the database: %d operations; %d of unknown outcome (%d of them with their answer lost), %d not_live; %d succeeded after the kill, %d of them renews and sends on leases from before it; all linearizable",
		*rounds, stall, total, unknown, lost, notLive, okAfter, kept)
	for _, r := range replicas {
		require.NoError(t, r.Proc.Stop(30*time.Second))
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// killing is a linearize.Driver that closes kill as its at-th call starts
// and stall as its stallAt-th does, and counts, once dead is set, the calls
// that succeed, and among them the renews and sends on leases acquired
// before the kill.
type killing struct {
	linearize.Driver
	at, stallAt int64
	calls       atomic.Int64
	kill, stall chan struct{}

	dead       atomic.Bool
	before     sync.Map // lease tokens acquired before the kill
	okAfter    atomic.Int64
	keptLeases atomic.Int64
}

func (k *killing) count() {
	// The calls are paced so that a history outlasts the dead replica's
	// reaping and its leases' adoption: load shape, not synchronisation.
	time.Sleep(8 * time.Millisecond)
	switch k.calls.Add(1) {
	case k.at:
		close(k.kill)
	case k.stallAt:
		close(k.stall)
	}
}

func (k *killing) after(err error, l cheetah.Lease) {
	if err != nil || !k.dead.Load() {
		return
	}
	k.okAfter.Add(1)
	if _, ok := k.before.Load(l.LeaseToken); ok {
		k.keptLeases.Add(1)
	}
}

func (k *killing) Acquire(ctx context.Context) (cheetah.Lease, error) {
	k.count()
	l, err := k.Driver.Acquire(ctx)
	if err == nil && !k.dead.Load() {
		k.before.Store(l.LeaseToken, true)
	}
	k.after(err, cheetah.Lease{})
	return l, err
}

func (k *killing) Release(ctx context.Context, l cheetah.Lease) (bool, error) {
	k.count()
	ok, err := k.Driver.Release(ctx, l)
	k.after(err, cheetah.Lease{})
	return ok, err
}

func (k *killing) Renew(ctx context.Context, l cheetah.Lease) error {
	k.count()
	err := k.Driver.Renew(ctx, l)
	k.after(err, l)
	return err
}

func (k *killing) Send(ctx context.Context, l cheetah.Lease) error {
	k.count()
	err := k.Driver.Send(ctx, l)
	k.after(err, l)
	return err
}

func (k *killing) Revoke(ctx context.Context, i int) (bool, error) {
	k.count()
	ok, err := k.Driver.Revoke(ctx, i)
	k.after(err, cheetah.Lease{})
	return ok, err
}

// reconnectThrough connects fc again through base, reporting contexts,
// each time its connection drops, until the returned stop is called (which
// closes it).
func reconnectThrough(fc *rig.FakeClient, base string, contexts ...protocol.ContextReport) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-fc.Done():
			case <-done:
				return
			}
			fc.URL = base
			for fc.Connect(context.Background()) != nil || fc.Report(contexts...) != nil {
				select {
				case <-done:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
		fc.Close()
	}
}

// balancer sends each request and connection to the next replica in
// turn, leaving out those dropped.
type balancer struct {
	URL     string
	mu      sync.Mutex
	targets []*url.URL
	out     []bool
	next    int
}

func newBalancer(t *testing.T, rs []*rig.Serve) *balancer {
	b := &balancer{out: make([]bool, len(rs))}
	for _, r := range rs {
		u, err := url.Parse(r.API.Base)
		require.NoError(t, err)
		b.targets = append(b.targets, u)
	}
	hs := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(b.pick())
			pr.Out.Host = pr.In.Host
		},
		FlushInterval: -1,
		ErrorLog:      log.New(io.Discard, "", 0),
	})
	t.Cleanup(hs.Close)
	b.URL = hs.URL
	return b
}

func (b *balancer) pick() *url.URL {
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		b.next = (b.next + 1) % len(b.targets)
		if !b.out[b.next] {
			return b.targets[b.next]
		}
	}
}

func (b *balancer) drop(i int)    { b.mu.Lock(); b.out[i] = true; b.mu.Unlock() }
func (b *balancer) restore(i int) { b.mu.Lock(); b.out[i] = false; b.mu.Unlock() }

// dumpHistory writes h, by call time, and the longest partial
// linearization porcupine found, for whoever reads a failure.
func dumpHistory(t *testing.T, h []porcupine.Operation, info porcupine.LinearizationInfo) {
	f, err := os.CreateTemp("", "cheetah-linearize-kill-*.txt")
	if err != nil {
		return
	}
	defer f.Close()
	m := linearize.FaultModel(3)
	ops := slices.Clone(h)
	slices.SortFunc(ops, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
	for _, op := range ops {
		ret := fmt.Sprint(op.Return / 1000)
		if op.Return == math.MaxInt64 {
			ret = "never"
		}
		fmt.Fprintf(f, "%8d %8s c%d %s\n", op.Call/1000, ret, op.ClientId, m.DescribeOperation(op.Input, op.Output))
	}
	longest := []porcupine.Operation{}
	for _, part := range info.PartialLinearizationsOperations() {
		for _, l := range part {
			if len(l) > len(longest) {
				longest = l
			}
		}
	}
	fmt.Fprintf(f, "\nlongest partial linearization (%d):\n", len(longest))
	for _, op := range longest {
		fmt.Fprintf(f, "%8d c%d %s\n", op.Call/1000, op.ClientId, m.DescribeOperation(op.Input, op.Output))
	}
	t.Logf("history: %s", f.Name())
}
