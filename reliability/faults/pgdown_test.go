package faults

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/reliability/internal/rig"
)

const (
	phaseUp int32 = iota
	phaseDown
	phaseRecovering
)

// TestPostgresGoesAway runs the broker on a PostgreSQL cluster of the
// test's own and stops it (pg_ctl stop, fast and immediate in turn) under
// load, then starts it again. While it is down: /readyz answers 503, and
// from then on every acquire, send and send_and_wait answers 503
// store_unavailable (nothing is dispatched that is not recorded; no lease
// is handed out that no send could use). Once it is back, the same broker
// process serves again without a restart; every command id a caller was
// given, and every command an agent received, has a record; every
// resolution a caller was given is what history shows; and no record is
// left in flight: the ends of commands that finished during the outage were
// held and written once the database answered.
func TestPostgresGoesAway(t *testing.T) {
	needProcesses(t)
	t.Parallel()
	const user, agents, flows, workers = "usr_pgdown", 2, 3, 4
	pg := rig.NewPGCluster(t)
	serve := rig.NewServe(bin, rig.FreeAddr(t), adminKey, pg.URL())
	serve.Start(t)
	api := serve.API
	defer api.HC.CloseIdleConnections()
	cli := api.MakeKey(t, adminKey, "client", user)
	app := api.MakeKey(t, adminKey, "app", "")
	chk := rig.NewChecker()
	startAgents(t, api.Base, cli, user, agents, flows, chk)
	waitAvailable(t, api, app, user, agents*flows)

	var phase atomic.Int32
	led := newLedger()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			worker(api, app, user, uint64(w), stop, led, false, func(op string, a rig.Answer) bool {
				switch {
				case a.Status == 409, a.Status == 423:
					return true
				case a.Status == 503 && a.Code() == cheetah.CodeStoreUnavailable:
					return true
				}
				return false
			})
		})
	}

	// The prober's answers are classified by the phase at both ends of the
	// request: only a request made wholly while the database is down counts
	// as one made during the outage.
	type probe struct {
		op     string
		status int
		code   string
	}
	var probesMu sync.Mutex
	var outage []probe
	var late200 []string       // waits answered 200 whose body is an error envelope
	var recovered atomic.Int64 // unix nanos of the first send admitted after a start
	proberStop := make(chan struct{})
	var pwg sync.WaitGroup
	pwg.Go(func() {
		ctx := context.Background()
		held := ""
		defer func() {
			if held != "" {
				api.Do(ctx, "POST", "/api/v1/lease/release", app, nil, "X-Lease", held)
			}
		}()
		for i := 0; i < 1_000_000; i++ {
			select {
			case <-proberStop:
				return
			default:
			}
			p0 := phase.Load()
			// Each round acquires (and gives back) a lease, and sends
			// through the one the prober holds: acquired while the database
			// answered, it is what a send during the outage would use.
			lease, ans := api.Acquire(ctx, app, map[string]any{"user_id": user, "task_id": "probe", "client_type": "console", "ttl_s": 30})
			got := []probe{{"acquire", ans.Status, ans.Code()}}
			if ans.Status == 201 {
				if held == "" {
					held = lease.LeaseToken
				} else {
					api.Do(ctx, "POST", "/api/v1/lease/release", app, nil, "X-Lease", lease.LeaseToken)
				}
			}
			if held != "" {
				id, sans := api.Send(ctx, app, held, map[string]any{"name": "work", "params": map[string]any{"ms": 1}})
				got = append(got, probe{"send", sans.Status, sans.Code()})
				if sans.Status == 202 {
					led.command(id, outcome{})
				}
				res, wid, wans := api.SendAndWait(ctx, app, held, map[string]any{"name": "work", "params": map[string]any{"ms": 1}})
				got = append(got, probe{"wait", wans.Status, wans.Code()})
				if wans.Status == 200 && wans.Code() != "" {
					// Admitted (200 and X-Command-Id already sent), then an
					// error: it can only travel in the body.
					probesMu.Lock()
					late200 = append(late200, wid+" "+wans.Code())
					probesMu.Unlock()
				}
				if wid != "" {
					led.command(wid, outcome{wait: true, resolved: wans.Status == 200 && wans.Code() == "", status: res.Status})
				}
				if sans.Status == 202 && p0 == phaseRecovering {
					recovered.CompareAndSwap(0, time.Now().UnixNano())
				}
				if sans.Status == 423 {
					held = "" // lost (never during an outage: checked below); acquire another
				}
			}
			if p0 == phaseDown && phase.Load() == phaseDown {
				probesMu.Lock()
				outage = append(outage, got...)
				probesMu.Unlock()
			}
		}
	})

	warm := func() {
		for range 30 {
			select {
			case <-led.progress:
			case <-time.After(30 * time.Second):
				t.Fatal("no command went through")
			}
		}
	}
	warm()
	var recoveries []time.Duration
	for cycle := range *pgCycles {
		mode := []string{"fast", "immediate"}[cycle%2]
		pg.Stop(mode)
		ready := api.Do(context.Background(), "GET", "/readyz", "", nil)
		require.Equal(t, 503, ready.Status, "readyz while the database is down")
		require.Equal(t, cheetah.CodeStoreUnavailable, ready.Code())
		require.NotContains(t, string(ready.Body), fmt.Sprint(pg.Port), "the error names no database address")
		// The broker knows now (readyz asked the database): the outage, as
		// its answers must show it, starts here.
		phase.Store(phaseDown)
		time.Sleep(1500 * time.Millisecond) // the outage lasts a while under load: load shape
		phase.Store(phaseRecovering)
		recovered.Store(0)
		started := time.Now()
		pg.Start()
		ok := rig.PollUntil(context.Background(), 60*time.Second, 10*time.Millisecond, func() bool { return recovered.Load() != 0 })
		require.True(t, ok, "cycle %d: the broker did not recover without a restart", cycle)
		recoveries = append(recoveries, time.Duration(recovered.Load()-started.UnixNano()))
		phase.Store(phaseUp)
		select {
		case <-serve.Proc.Done():
			t.Fatal("the broker process exited")
		default:
		}
		warm()
	}
	close(proberStop)
	pwg.Wait()
	close(stop)
	wg.Wait()
	require.True(t, api.Ready(context.Background()))

	// During the outage: no send was admitted, every failure was
	// store_unavailable.
	tally := map[string]int{}
	for _, p := range outage {
		tally[fmt.Sprintf("%s %d %s", p.op, p.status, p.code)]++
		switch p.op {
		case "send", "wait":
			require.Equal(t, 503, p.status, "a %s during the outage answered %d: a dispatch without a record", p.op, p.status)
			require.Equal(t, cheetah.CodeStoreUnavailable, p.code)
		case "acquire":
			require.Equal(t, 503, p.status, "an acquire during the outage answered %d", p.status)
			require.Equal(t, cheetah.CodeStoreUnavailable, p.code)
		}
	}
	require.NotEmpty(t, outage, "no probe ran wholly inside the outage")
	for _, op := range []string{"acquire", "send", "wait"} {
		n := 0
		for _, p := range outage {
			if p.op == op {
				n++
			}
		}
		require.Positive(t, n, "no %s was tried wholly inside an outage", op)
	}
	require.Empty(t, led.bad, "unexpected answers")

	// Nothing admitted is lost; nothing dispatched is unrecorded.
	var stale, inFlight []string
	for id, o := range led.ids {
		rec, ans := api.Read(context.Background(), app, user, id)
		require.Equal(t, 200, ans.Status, "command %s was returned to a caller but has no record: %s", id, ans)
		if o.resolved && o.status != rec.Status {
			stale = append(stale, fmt.Sprintf("%s resolved %s, history says %s", id, o.status, rec.Status))
		}
		if !rec.Status.Terminal() {
			// Still running on an agent (an async send's 1.5 s command), or
			// its end still being written: it must get there.
			rig.PollUntil(context.Background(), 30*time.Second, 20*time.Millisecond, func() bool {
				rec, _ = api.Read(context.Background(), app, user, id)
				return rec.Status.Terminal()
			})
			if !rec.Status.Terminal() {
				inFlight = append(inFlight, fmt.Sprintf("%s %s", id, rec.Status))
			}
		}
	}
	sort.Strings(stale)
	sort.Strings(inFlight)
	require.Empty(t, stale, "resolutions that history does not show (invariant 8)")
	require.Empty(t, inFlight, "records left in flight after the load ended: an end that was not written once the database was back")
	for id := range chk.Commands() {
		_, ans := api.Read(context.Background(), app, user, id)
		require.Equal(t, 200, ans.Status, "an agent got command %s, which has no record", id)
	}
	require.Empty(t, chk.Errors())
	keys := make([]string, 0, len(tally))
	for k := range tally {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, " [%s]×%d", k, tally[k])
	}
	t.Logf("%d outages survived (recovery after start: %v); %d commands recorded, %d received by agents; outage answers:%s",
		*pgCycles, recoveries, len(led.ids), len(chk.Commands()), b.String())
	noSecrets(t, serve.AllLogs(), adminKey, app, cli)
	// A wait admitted before the outage and ended during it answers 200
	// (sent at admission) with the error envelope as its body; the remote
	// SDK returns that error (behaviour.md, "A wait's late error").
	late := 0
	for k, n := range led.answers {
		if strings.HasPrefix(k, "wait 200 ") && strings.TrimSpace(strings.TrimPrefix(k, "wait 200 ")) != "" {
			late += n
		}
	}
	t.Logf("%d send_and_wait answers were 200 with an error envelope for a body", late+len(late200))
}
