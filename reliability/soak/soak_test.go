// Package soak holds the broker under churn for a while with an
// independent checker outside it: fake clients record the epoch of every
// frame they get, applications record every command id they were given and
// every lease they held, and the run ends by checking that bookkeeping,
// goroutines and heap come back to where they started.
package soak

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/reliability/internal/rig"
	"github.com/cheetahbroker/cheetah/remote"
	"github.com/cheetahbroker/cheetah/server"
)

// Long mode: `make soak` sets these (SOAK_DURATION, SOAK_CLIENTS, …).
var (
	duration = flag.Duration("soak.duration", 5*time.Second, "how long each store is soaked")
	clients  = flag.Int("soak.clients", 6, "fake clients (split between two users)")
	contexts = flag.Int("soak.contexts", 3, "contexts per client")
	workers  = flag.Int("soak.workers", 12, "application workers (half in process, half over HTTP)")
	stores   = flag.String("soak.stores", "sqlite,postgres", "stores to soak, comma separated")
)

const adminKey = "soak-admin-key-0123456789abcdef0123"

var users = []string{"usr_soak_a", "usr_soak_b"}

func TestSoak(t *testing.T) {
	for _, store := range []string{"sqlite", "postgres"} {
		t.Run(store, func(t *testing.T) {
			if !contains(*stores, store) {
				t.Skip("not in -soak.stores")
			}
			if store == "postgres" && testing.Short() {
				t.Skip("PostgreSQL tests do not run with -short")
			}
			soak(t, store)
		})
	}
}

func contains(list, s string) bool {
	for len(list) > 0 {
		var item string
		item, list, _ = cut(list, ',')
		if item == s {
			return true
		}
	}
	return false
}

func cut(s string, sep byte) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == sep {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// record is what the application side knows of one command.
type record struct {
	user, context string
	epoch         int64
	status        cheetah.Status // the resolution, when a wait returned one
}

// tally counts outcomes under a lock; its bad list fails the run.
type tally struct {
	mu     sync.Mutex
	counts map[string]int
	bad    []string
	cmds   map[string]record
}

func (k *tally) add(what string) {
	k.mu.Lock()
	k.counts[what]++
	k.mu.Unlock()
}

func (k *tally) badf(format string, args ...any) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.bad) < 50 {
		k.bad = append(k.bad, fmt.Sprintf(format, args...))
	}
}

func (k *tally) command(id string, r record) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.cmds[id] = r
}

func soak(t *testing.T, store string) {
	ctx := context.Background()
	opts := server.Options{AdminKey: adminKey, ReconnectGrace: 1500 * time.Millisecond, DataDir: t.TempDir()}
	if store == "postgres" {
		opts.DatabaseURL = historytest.EmptyPostgres(t)
	}
	heapBase0 := rig.Heap()
	b, err := server.Open(ctx, opts)
	require.NoError(t, err)
	hs := httptest.NewServer(b.Server.Handler())
	closed := false
	closeAll := func() {
		if closed {
			return
		}
		closed = true
		hs.CloseClientConnections()
		hs.Close()
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		require.NoError(t, b.Close(cctx))
	}
	t.Cleanup(closeAll)
	api := rig.NewAPI(hs.URL)
	keys := map[string]string{}
	for _, u := range users {
		keys[u] = api.MakeKey(t, adminKey, "client", u)
	}
	appKey := api.MakeKey(t, adminKey, "app", "")
	api.HC.CloseIdleConnections()
	inproc := b.Manager()
	rm := remote.New(hs.URL, appKey)

	// Baselines: the broker is up, nobody is connected.
	baseG := goleak.IgnoreCurrent()
	baseGoroutines := runtime.NumGoroutine()
	baseHeap := rig.Heap()

	chk := rig.NewChecker()
	var fcs []*rig.FakeClient
	reports := map[*rig.FakeClient][]protocol.ContextReport{}
	for i := range *clients {
		u := users[i%len(users)]
		fc := &rig.FakeClient{URL: hs.URL, Key: keys[u], UserID: u, ClientID: fmt.Sprintf("fake-%d", i), Check: chk}
		require.NoError(t, fc.Connect(ctx))
		var reps []protocol.ContextReport
		for j := range *contexts {
			reps = append(reps, rig.Worker(fmt.Sprintf("c%d", j)))
		}
		require.NoError(t, fc.Report(reps...))
		fcs = append(fcs, fc)
		reports[fc] = reps
	}

	led := &tally{counts: map[string]int{}, cmds: map[string]record{}}
	deadline := time.Now().Add(*duration)
	var wg sync.WaitGroup
	var admitted atomic.Int64
	var peak registryPeak
	for w := range *workers {
		mgr, via := inproc, "inproc"
		if w%2 == 1 {
			mgr, via = rm, "http"
		}
		wg.Go(func() { work(t, w, mgr, via, api, deadline, led, &admitted) })
	}
	// Client churn: reconnects inside the grace, long absences past it,
	// contexts dropped from a report and handed to a person and back.
	var churned atomic.Int64
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(7, 7))
		for i := 0; i < 1_000_000 && time.Now().Before(deadline); i++ {
			time.Sleep(time.Duration(100+rng.IntN(200)) * time.Millisecond) // churn pace: load shape
			fc := fcs[rng.IntN(len(fcs))]
			reps := reports[fc]
			var err error
			switch op := rng.IntN(10); {
			case op < 4: // reconnect within the grace
				fc.Close()
				if err = fc.Connect(ctx); err == nil {
					err = fc.Report(reps...)
				}
				led.add("churn reconnect")
			case op < 5: // away past the grace: its leases end context_gone
				fc.Close()
				time.Sleep(opts.ReconnectGrace + 300*time.Millisecond)
				if err = fc.Connect(ctx); err == nil {
					err = fc.Report(reps...)
				}
				led.add("churn away past grace")
			case op < 8: // one context gone, then back
				k := rng.IntN(len(reps))
				less := append(append([]protocol.ContextReport{}, reps[:k]...), reps[k+1:]...)
				if err = fc.Report(less...); err == nil {
					err = fc.Report(reps...)
				}
				led.add("churn context gone")
			default: // a context handed to a person, then back
				k := rng.IntN(len(reps))
				mixed := append([]protocol.ContextReport{}, reps...)
				mixed[k] = rig.Human(reps[k].ContextID)
				if err = fc.Report(mixed...); err == nil {
					err = fc.Report(reps...)
				}
				led.add("churn human")
			}
			if err != nil {
				led.badf("churn: %v", err)
			}
			churned.Add(1)
			peak.sample(b)
		}
	})
	wg.Wait()
	elapsed := *duration

	// Drain: every client reports no contexts (their leases end
	// context_gone), then goes. Server.Shutdown returns once every session
	// has ended and detached from the registry: that is the signal.
	for _, fc := range fcs {
		require.NoError(t, fc.Report())
		fc.Close()
		fc.Wait()
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	require.NoError(t, b.Server.Shutdown(sctx))
	cancel()
	require.NoError(t, b.Store.Write(ctx)) // every earlier write has landed
	st := b.Registry.Stats()
	t.Logf("registry after the run: %+v", st)
	require.Zero(t, st.Leases, "leases")
	require.Zero(t, st.Heap, "deadline heap")
	require.Zero(t, st.Commands, "commands")
	require.Zero(t, st.Waiters, "waiters")
	require.Zero(t, st.Preserving, "preserving")
	require.Zero(t, st.Clients, "clients")
	require.Zero(t, st.Contexts, "contexts")

	// History: every command a caller was given has a record on the
	// context and epoch of its handle, ended; a resolution the caller saw
	// is what history says; every command a client got has a record.
	led.mu.Lock()
	cmds := led.cmds
	led.mu.Unlock()
	for id, r := range cmds {
		rec, err := b.Store.Get(ctx, r.user, id)
		require.NoError(t, err, "command %s was returned to a caller but has no record", id)
		require.Equal(t, r.epoch, rec.Epoch, "command %s", id)
		require.Equal(t, r.context, rec.ContextID, "command %s", id)
		if rec.ResponseMode != cheetah.ModeNone {
			require.True(t, rec.Status.Terminal(), "command %s still %s after every client left", id, rec.Status)
		}
		if r.status != "" {
			require.Equal(t, r.status, rec.Status, "command %s resolved %s", id, r.status)
		}
	}
	received := chk.Commands()
	for id, rc := range received {
		ref, err := b.Store.Lookup(ctx, id)
		require.NoError(t, err, "a client got command %s, which has no record", id)
		require.Equal(t, rc.Key, ref.UserID+"/"+ref.ClientID+"/"+rc.Key[len(ref.UserID+"/"+ref.ClientID+"/"):], "command %s went to its own client", id)
	}
	require.Empty(t, chk.Errors(), "the clients' checker")
	led.mu.Lock()
	require.Empty(t, led.bad, "unexpected outcomes")
	counts := led.counts
	led.mu.Unlock()

	// Goroutines and heap back to the baseline. goleak retries for a while:
	// goroutines that are ending send no signal.
	api.HC.CloseIdleConnections()
	hs.CloseClientConnections()
	require.NoError(t, goleak.Find(baseG), "goroutines left behind by the run")
	goroutines := runtime.NumGoroutine()
	heapEnd := rig.Heap()
	// The registry remembers ended leases and finished commands for 10
	// minutes by design (bounded); allow for them.
	memo := int64(st.Ended+st.Finished) * 1024
	growth := int64(heapEnd) - int64(baseHeap)
	t.Logf("%s: %d clients × %d contexts, %d workers, %s: %d commands admitted (%.0f/s), %d received by clients, %d churn events; peak %d leases, %d commands in flight; goroutines %d→%d; heap base %d MiB (before Open %d MiB), after %+d KiB with %d remembered ends; outcomes %v",
		store, *clients, *contexts, *workers, elapsed, admitted.Load(), float64(admitted.Load())/elapsed.Seconds(), len(received), churned.Load(),
		peak.leases, peak.commands, baseGoroutines, goroutines, baseHeap>>20, heapBase0>>20, growth>>10, st.Ended+st.Finished, counts)
	require.Less(t, growth, int64(16<<20)+memo, "heap did not return to its baseline")
	closeAll()
}

type registryPeak struct {
	mu               sync.Mutex
	leases, commands int
}

func (p *registryPeak) sample(b *server.Broker) {
	s := b.Registry.Stats()
	p.mu.Lock()
	p.leases, p.commands = max(p.leases, s.Leases), max(p.commands, s.Commands)
	p.mu.Unlock()
}

// lostOK are the reasons a lease may be lost under this churn.
var lostOK = map[cheetah.LostReason]bool{
	cheetah.LostNotLive: true, cheetah.LostContextGone: true, cheetah.LostNotWorker: true,
	cheetah.LostRevoked: true, cheetah.LostReassigned: true, cheetah.LostExpired: true,
}

// work is one application worker: acquire, a few operations, release,
// until the deadline.
func work(t *testing.T, w int, mgr *cheetah.Manager, via string, api *rig.API, deadline time.Time, led *tally, admitted *atomic.Int64) {
	rng := rand.New(rand.NewPCG(uint64(w), 42))
	ctx := context.Background()
	for i := 0; i < 1_000_000 && time.Now().Before(deadline); i++ {
		user := users[rng.IntN(len(users))]
		ttl := []time.Duration{time.Second, 2 * time.Second, 30 * time.Second}[rng.IntN(3)]
		req := cheetah.AcquireRequest{UserID: user, TaskID: fmt.Sprintf("task-%d", rng.IntN(5)), ClientType: cheetah.Console, TTL: ttl}
		renewOnUse := rng.IntN(3) != 0
		if !renewOnUse {
			req.RenewOnUse = new(bool)
		}
		if rng.IntN(2) == 0 {
			req.Wait = time.Duration(rng.IntN(300)) * time.Millisecond
		}
		h, err := mgr.Acquire(ctx, req)
		if errors.Is(err, cheetah.ErrNoContextAvailable) {
			led.add(via + " acquire: no context")
			continue
		}
		if err != nil {
			led.badf("%s acquire: %v", via, err)
			continue
		}
		led.add(via + " acquire")
		lastRenew := time.Now() // at the latest the broker renewed then; earlier if the answer was slow
		var seq int64
		lost := false
		onLost := func(op string, err error, since time.Time) bool {
			var ll *cheetah.LeaseLostError
			if !errors.As(err, &ll) {
				return false
			}
			if !lostOK[ll.Reason] {
				led.badf("%s %s: lease lost %s", via, op, ll.Reason)
			}
			if ll.Reason == cheetah.LostExpired && time.Since(since) < ttl-200*time.Millisecond {
				led.badf("%s %s: expired %s after the last renewal, TTL %s", via, op, time.Since(since), ttl)
			}
			led.add(via + " lost " + string(ll.Reason))
			lost = true
			return true
		}
		abandon := false
		for k := 0; k < 1+rng.IntN(6) && !lost; k++ {
			switch op := rng.IntN(60); {
			case op < 22: // send_and_wait
				seq++
				act, want, timeout := "ok", cheetah.StatusCompleted, 5*time.Second
				switch rng.IntN(6) {
				case 0:
					act, want = "fail", cheetah.StatusFailed
				case 1:
					act = "chatty"
				case 2:
					act = "slow"
				case 3:
					act, want, timeout = "drop", cheetah.StatusTimedOut, 150*time.Millisecond
				}
				if ttl == time.Second && !renewOnUse && rng.IntN(2) == 0 {
					act, want, timeout = "long", cheetah.StatusCompleted, 5*time.Second // longer than the TTL: invariant 5
				}
				params := map[string]any{"act": act, "ms": rng.IntN(30), "seq": seq}
				if act == "long" {
					params["act"], params["ms"] = "slow", 1300
				}
				before := time.Now()
				res, err := h.SendAndWait(ctx, cheetah.Command{Name: "work", Params: params}, cheetah.WithTimeout(timeout))
				if err != nil {
					if !onLost("send_and_wait", err, lastRenew) {
						led.badf("%s send_and_wait: %v", via, err)
					}
					continue
				}
				admitted.Add(1)
				led.command(res.CommandID, record{user: user, context: h.ContextID(), epoch: h.Epoch(), status: res.Status})
				if renewOnUse {
					lastRenew = before
				}
				switch {
				case res.Status == want:
					lastRenew = time.Now() // a wait that ends while wanted renews
					led.add(via + " wait " + string(res.Status))
				case res.Status == cheetah.StatusDisconnected:
					led.add(via + " wait disconnected")
				default:
					led.badf("%s send_and_wait %s: %s, want %s", via, act, res.Status, want)
				}
				if res.Status == cheetah.StatusCompleted || res.Status == cheetah.StatusFailed {
					// Invariant 8: the terminal message is already in history.
					rec, err := mgr.History().Read(ctx, user, res.CommandID)
					if err != nil || rec.Status != res.Status || len(rec.Messages) == 0 || !isTerminal(rec.Messages[len(rec.Messages)-1].Kind) {
						led.badf("%s read your result %s: %v %s", via, res.CommandID, err, rec.Status)
					}
				}
				if act == "long" && res.Status == cheetah.StatusCompleted {
					// The lease outlived its TTL while the wait held it, and
					// was renewed when the wait ended.
					if err := h.Renew(ctx); err != nil {
						var ll *cheetah.LeaseLostError
						if errors.As(err, &ll) && ll.Reason == cheetah.LostExpired {
							led.badf("%s: a lease expired although a send_and_wait held it (invariant 5)", via)
						} else {
							onLost("renew after long wait", err, lastRenew)
						}
					} else {
						lastRenew = time.Now()
						led.add(via + " held past TTL")
					}
				}
			case op < 42: // send
				seq++
				act := []string{"ok", "ok", "slow", "drop", "chatty"}[rng.IntN(5)]
				before := time.Now()
				id, err := h.Send(ctx, cheetah.Command{Name: "work", Params: map[string]any{"act": act, "ms": rng.IntN(30), "seq": seq}}, cheetah.WithTimeout(2*time.Second))
				if err != nil {
					if !onLost("send", err, lastRenew) {
						led.badf("%s send: %v", via, err)
					}
					continue
				}
				admitted.Add(1)
				led.command(id, record{user: user, context: h.ContextID(), epoch: h.Epoch()})
				led.add(via + " send")
				if renewOnUse {
					lastRenew = before
				}
			case op < 52: // renew
				before := time.Now()
				if err := h.Renew(ctx); err != nil {
					if !onLost("renew", err, lastRenew) {
						led.badf("%s renew: %v", via, err)
					}
					continue
				}
				lastRenew = before
				led.add(via + " renew")
			case op < 55: // revoke through the admin API
				ans := api.Do(ctx, "POST", fmt.Sprintf("/api/v1/admin/users/%s/clients/%s/contexts/%s/revoke", user, h.ClientID(), h.ContextID()), adminKey, nil)
				if ans.Status != 200 {
					led.badf("revoke: %s", ans)
				}
				led.add("revoke")
			case op < 56: // let it expire
				if ttl > 2*time.Second {
					continue
				}
				time.Sleep(ttl + 100*time.Millisecond) // past the TTL: load shape, the broker's timer decides
				err := h.Renew(ctx)
				if err == nil {
					// The design lets expiry come up to a second late.
					if since := time.Since(lastRenew); since > ttl+time.Second {
						led.badf("%s: renew after the TTL passed succeeded (last renewal %s ago, TTL %s)", via, since, ttl)
					}
					continue
				}
				if !onLost("renew after TTL", err, lastRenew) {
					led.badf("%s renew after TTL: %v", via, err)
				}
			default: // walk away: expiry or the client's end cleans up
				if ttl <= 2*time.Second {
					abandon = true
					k = 1 << 30
				}
			}
		}
		if abandon {
			led.add(via + " abandoned")
			continue
		}
		if _, err := mgr.Release(ctx, h); err != nil {
			led.badf("%s release: %v", via, err)
		}
	}
}

func isTerminal(k cheetah.MessageKind) bool { return k == cheetah.KindResult || k == cheetah.KindError }
