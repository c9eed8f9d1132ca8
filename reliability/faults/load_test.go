package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/agent"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/reliability/internal/rig"
)

// startAgents runs n agents of the agent library in this process, each
// with flows contexts, reconnecting fast, feeding every command they get to
// chk. Their "work" command holds for params.ms (or until its context
// ends) and then answers.
func startAgents(t *testing.T, url, key, user string, n, flows int, chk *rig.Checker) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range n {
		id := fmt.Sprintf("agent-%d", i)
		a := agent.New(agent.Config{URL: url, Token: key, ClientID: id, Flows: flows,
			MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, PingInterval: time.Second})
		prefix := user + "/" + id + "/"
		a.Handle("work", func(ctx context.Context, cmd *protocol.Command, _ agent.Output) (any, error) {
			chk.SeeCommand(prefix, cmd)
			var p struct {
				MS int `json:"ms"`
			}
			_ = json.Unmarshal(cmd.Params, &p)
			tm := time.NewTimer(time.Duration(p.MS) * time.Millisecond)
			defer tm.Stop()
			select {
			case <-tm.C:
				return map[string]bool{"ok": true}, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})
		wg.Go(func() { _ = a.Run(ctx) })
	}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
}

// waitAvailable polls the broker process until n contexts are idle.
func waitAvailable(t *testing.T, api *rig.API, key, user string, n int) {
	t.Helper()
	ok := rig.PollUntil(context.Background(), 60*time.Second, 20*time.Millisecond, func() bool {
		var out struct{ Contexts []cheetah.ContextSnapshot }
		ans := api.Do(context.Background(), "GET", "/api/v1/users/"+user+"/contexts/available?client_type=console", key, nil)
		return ans.Status == 200 && ans.Decode(&out) == nil && len(out.Contexts) >= n
	})
	require.True(t, ok, "%d contexts never became available", n)
}

// outcome is what a caller learnt of one command it got an id for.
type outcome struct {
	wait     bool
	resolved bool // the wait returned a resolution
	status   cheetah.Status
}

// ledger records, outside the broker, every command id a caller was given,
// every epoch an acquire returned, and every unexpected answer.
type ledger struct {
	mu       sync.Mutex
	ids      map[string]outcome
	epochs   []int64
	bad      []string
	answers  map[string]int // "acquire 201", "send 503 store_unavailable", …
	progress chan struct{}  // gets a token per command id recorded
}

func newLedger() *ledger {
	return &ledger{ids: map[string]outcome{}, answers: map[string]int{}, progress: make(chan struct{}, 1<<16)}
}

func (l *ledger) command(id string, o outcome) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ids[id] = o
	select {
	case l.progress <- struct{}{}:
	default:
	}
}

func (l *ledger) epoch(e int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.epochs = append(l.epochs, e)
}

func (l *ledger) answer(op string, a rig.Answer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := fmt.Sprintf("%s %d %s", op, a.Status, a.Code())
	if a.Err != nil {
		k = op + " no-answer"
	}
	l.answers[k]++
}

func (l *ledger) badf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.bad) < 50 {
		l.bad = append(l.bad, fmt.Sprintf(format, args...))
	}
}

// worker churns acquire → sends and waits → release until stop closes, the
// broker stops answering (when stopOnNoAnswer), or max iterations pass.
// allowed reports whether a non-2xx answer is expected in this test.
func worker(api *rig.API, key, user string, seed uint64, stop <-chan struct{}, led *ledger, stopOnNoAnswer bool, allowed func(op string, a rig.Answer) bool) {
	rng := rand.New(rand.NewPCG(seed, 99))
	ctx := context.Background()
	for range 100_000 {
		select {
		case <-stop:
			return
		default:
		}
		lease, ans := api.Acquire(ctx, key, map[string]any{"user_id": user, "task_id": fmt.Sprintf("t-%d", rng.IntN(8)),
			"client_type": "console", "ttl_s": 60, "wait_ms": 200})
		led.answer("acquire", ans)
		if ans.Err != nil {
			if stopOnNoAnswer {
				return
			}
			continue
		}
		if ans.Status != 201 {
			if !allowed("acquire", ans) {
				led.badf("acquire: %s", ans)
			}
			continue
		}
		led.epoch(lease.Epoch)
		for range 1 + rng.IntN(4) {
			params := map[string]any{"ms": rng.IntN(20)}
			if rng.IntN(3) == 0 {
				id, ans := api.Send(ctx, key, lease.LeaseToken, map[string]any{"name": "work", "params": params, "timeout_ms": 10000})
				led.answer("send", ans)
				if ans.Status == 202 {
					led.command(id, outcome{})
				} else if ans.Err == nil && !allowed("send", ans) {
					led.badf("send: %s", ans)
				}
				if ans.Err != nil && stopOnNoAnswer {
					return
				}
				continue
			}
			res, id, ans := api.SendAndWait(ctx, key, lease.LeaseToken, map[string]any{"name": "work", "params": params, "timeout_ms": 10000})
			led.answer("wait", ans)
			if id != "" {
				// A 200 whose body is an error envelope is not a resolution.
				led.command(id, outcome{wait: true, resolved: ans.Err == nil && ans.Status == 200 && ans.Code() == "", status: res.Status})
			}
			if ans.Err == nil && ans.Status != 200 && !allowed("wait", ans) {
				led.badf("send_and_wait: %s", ans)
			}
			if ans.Err != nil && stopOnNoAnswer {
				return
			}
		}
		if rng.IntN(6) == 0 {
			// A long command, still running at the next fault.
			id, ans := api.Send(ctx, key, lease.LeaseToken, map[string]any{"name": "work", "params": map[string]any{"ms": 1500}, "timeout_ms": 2000})
			if ans.Status == 202 {
				led.command(id, outcome{})
			}
		}
		ans = api.Do(ctx, "POST", "/api/v1/lease/release", key, nil, "X-Lease", lease.LeaseToken)
		led.answer("release", ans)
		if ans.Err != nil && stopOnNoAnswer {
			return
		}
	}
}

// TestBrokerKilledUnderLoad kills `cheetah serve` with SIGKILL in the
// middle of a load, again and again, on SQLite and on PostgreSQL. After each
// restart: every command id a caller was given has a record; none is left
// in flight (the ones that were are interrupted); a caller that saw
// completed or failed still reads it; epochs keep rising; the agents never
// got a command of an older epoch after a newer one, nor one twice.
func TestBrokerKilledUnderLoad(t *testing.T) {
	needProcesses(t)
	t.Parallel()
	for _, store := range []string{"sqlite", "postgres"} {
		t.Run(store, func(t *testing.T) {
			dsn := t.TempDir()
			if store == "postgres" {
				dsn = emptyPostgres(t)
			}
			killLoop(t, dsn)
		})
	}
}

func killLoop(t *testing.T, dsn string) {
	const user, agents, flows, workers = "usr_chaos", 3, 3, 6
	serve := rig.NewServe(bin, rig.FreeAddr(t), adminKey, dsn)
	serve.Start(t)
	api := serve.API
	defer api.HC.CloseIdleConnections()
	cli := api.MakeKey(t, adminKey, "client", user)
	app := api.MakeKey(t, adminKey, "app", "")
	chk := rig.NewChecker()
	startAgents(t, api.Base, cli, user, agents, flows, chk)

	var maxEpoch int64
	var total, interrupted, cut int
	verified := map[string]bool{}
	for round := range *rounds {
		waitAvailable(t, api, app, user, agents*flows)
		led := newLedger()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				worker(api, app, user, uint64(round*100+w), stop, led, true, func(op string, a rig.Answer) bool {
					return a.Status == 409 || a.Status == 423 // no context now; a lease revoked by the restart
				})
			})
		}
		// Let some work be recorded, then kill at a random moment.
		for range 20 {
			select {
			case <-led.progress:
			case <-time.After(30 * time.Second):
				t.Fatalf("round %d: no command went through", round)
			}
		}
		time.Sleep(time.Duration(rand.Int64N(int64(*loadFor)))) // load shape, not synchronisation
		serve.Proc.Kill()
		close(stop)
		wg.Wait()
		serve.Start(t)

		require.Empty(t, led.bad, "round %d: unexpected answers", round)
		minEpoch := int64(-1)
		for _, e := range led.epochs {
			if minEpoch < 0 || e < minEpoch {
				minEpoch = e
			}
		}
		require.Greater(t, minEpoch, maxEpoch, "round %d: an epoch of this run is not above every epoch of the runs before", round)
		for _, e := range led.epochs {
			maxEpoch = max(maxEpoch, e)
		}
		for id, o := range led.ids {
			rec, ans := api.Read(context.Background(), app, user, id)
			require.Equal(t, 200, ans.Status, "round %d: command %s was returned to a caller but has no record: %s", round, id, ans)
			require.True(t, rec.Status.Terminal(), "round %d: command %s is still %s after the restart", round, id, rec.Status)
			if o.resolved {
				require.Equal(t, o.status, rec.Status, "round %d: %s resolved %s but history says %s", round, id, o.status, rec.Status)
			} else if o.wait {
				cut++
			}
			if rec.Status == cheetah.StatusInterrupted {
				interrupted++
				require.NotNil(t, rec.Error)
				require.Equal(t, "interrupted", rec.Error.Code)
			}
			verified[id] = true
			total++
		}
	}
	// A command an agent was sent may have no record: dispatch overlaps the
	// record's commit (invariant 9), and a kill between the two leaves a
	// command that no caller was told of (every id a caller was given is
	// checked above). Those are counted, not refused.
	received := chk.Commands()
	unrecorded := 0
	for id := range received {
		if verified[id] {
			continue
		}
		_, ans := api.Read(context.Background(), app, user, id)
		if ans.Status == 404 {
			unrecorded++
			continue
		}
		require.Equal(t, 200, ans.Status, "reading command %s an agent got: %s", id, ans)
	}
	require.Empty(t, chk.Errors(), "the agents' checker")
	t.Logf("%d SIGKILLs survived: %d command ids returned and found, %d waits cut by the kill, %d commands interrupted, %d commands received by agents (%d of them never recorded, told to no caller), highest epoch %d",
		*rounds, total, cut, interrupted, len(received), unrecorded, maxEpoch)
	require.NoError(t, serve.Proc.Stop(30*time.Second))
	noSecrets(t, serve.AllLogs(), adminKey, app, cli)
}
