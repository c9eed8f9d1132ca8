package faults

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cheetahbroker/cheetah/reliability/internal/rig"
	"github.com/cheetahbroker/cheetah/server/clustertest"
)

// TestReplicaKilledUnderLoad runs three `cheetah serve` replicas on one
// PostgreSQL behind a round-robin balancer, agents and callers going
// through it, and SIGKILLs one replica at a random moment of the load, then
// starts it again at its address, round after round (-chaos.rounds). After
// each round: every command id a caller was given has a record, and every
// one ends (those in flight on the dead replica interrupted, by the
// survivors or the restart); no epoch was handed out twice; the agents never
// got a command twice, nor one of an older epoch after a newer one.
func TestReplicaKilledUnderLoad(t *testing.T) {
	needProcesses(t)
	t.Parallel()
	const user, agents, flows, workers = "usr_cluster", 3, 3, 6
	dsn := emptyPostgres(t)
	replicas := make([]*rig.Serve, 3)
	urls := make([]string, len(replicas))
	for i := range replicas {
		replicas[i] = rig.NewServe(bin, rig.FreeAddr(t), adminKey, dsn, "--replica-ttl", "1s")
		replicas[i].Start(t)
		urls[i] = replicas[i].API.Base
	}
	lb := clustertest.BalancerOf(t, urls)
	api := rig.NewAPI(lb)
	defer api.HC.CloseIdleConnections()
	cli := api.MakeKey(t, adminKey, "client", user)
	app := api.MakeKey(t, adminKey, "app", "")
	chk := rig.NewChecker()
	startAgents(t, lb, cli, user, agents, flows, chk)

	epochs := map[int64]bool{}
	var total, interrupted int
	for round := range *rounds {
		// Leases a worker held when its round stopped outlive the kill
		// (they are durable) until their TTL: some contexts are enough.
		waitAvailable(t, api, app, user, 1)
		led := newLedger()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				worker(api, app, user, uint64(round*100+w), stop, led, false, func(op string, a rig.Answer) bool {
					// No context now, a lease lost with its replica, or the
					// balancer's and the replicas' answers while one is away.
					return a.Status == 409 || a.Status == 423 || a.Status == 502 || a.Status == 503
				})
			})
		}
		for range 20 {
			select {
			case <-led.progress:
			case <-time.After(30 * time.Second):
				t.Fatalf("round %d: no command went through", round)
			}
		}
		time.Sleep(time.Duration(rand.Int64N(int64(*loadFor)))) // load shape, not synchronisation
		victim := replicas[round%len(replicas)]
		victim.Proc.Kill()
		// The load goes on through the survivors for a while.
		time.Sleep(time.Duration(rand.Int64N(int64(*loadFor)))) // load shape, not synchronisation
		close(stop)
		wg.Wait()
		victim.Start(t)

		require.Empty(t, led.bad, "round %d: unexpected answers", round)
		for _, e := range led.epochs {
			require.False(t, epochs[e], "round %d: epoch %d was handed out twice", round, e)
			epochs[e] = true
		}
		for id := range led.ids {
			ok := rig.PollUntil(context.Background(), 30*time.Second, 20*time.Millisecond, func() bool {
				rec, ans := api.Read(context.Background(), app, user, id)
				return ans.Status == 200 && rec.Status.Terminal()
			})
			rec, ans := api.Read(context.Background(), app, user, id)
			require.Equal(t, 200, ans.Status, "round %d: command %s was returned to a caller but has no record: %s", round, id, ans)
			require.True(t, ok, "round %d: command %s is still %s", round, id, rec.Status)
			if o := led.ids[id]; o.resolved {
				require.Equal(t, o.status, rec.Status, "round %d: %s resolved %s but history says %s", round, id, o.status, rec.Status)
			}
			if rec.Status == "interrupted" {
				interrupted++
			}
			total++
		}
	}
	require.Empty(t, chk.Errors(), "the agents' checker")
	t.Logf("%d replica SIGKILLs survived: %d command ids returned and found ended, %d interrupted, %d distinct epochs",
		*rounds, total, interrupted, len(epochs))
	for _, r := range replicas {
		require.NoError(t, r.Proc.Stop(30*time.Second))
		noSecrets(t, r.AllLogs(), adminKey, app, cli)
	}
}
