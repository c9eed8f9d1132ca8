package faults

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/reliability/internal/rig"
	"github.com/cheetahbroker/cheetah/server"
)

// TestClientStopsReading connects a client that reads its welcome and then
// nothing more, and floods it with 32 KiB commands. The broker must cut it
// off (its outbound queue is bounded), keep its own memory bounded, and
// keep serving another client meanwhile. The broker runs in process here so
// that its heap can be measured; and it does not run in parallel, since
// the heap is the whole test process's: the package's parallel tests wait
// until it is done.
func TestClientStopsReading(t *testing.T) {
	ctx := context.Background()
	const user = "usr_slow"
	b, hs := rig.OpenBroker(t, server.Options{DataDir: t.TempDir(), AdminKey: adminKey, ReconnectGrace: time.Hour})
	api := rig.NewAPI(hs.URL)
	defer api.HC.CloseIdleConnections()
	cli := api.MakeKey(t, adminKey, "client", user)
	mgr := b.Manager()

	healthy := &rig.FakeClient{URL: hs.URL, Key: cli, UserID: user, ClientID: "healthy", Check: rig.NewChecker()}
	require.NoError(t, healthy.Connect(ctx))
	t.Cleanup(healthy.Close)
	require.NoError(t, healthy.Report(rig.Worker("h1")))

	// The stuck client: hello, a state report, a ping; it reads up to the
	// pong (so the report is applied) and then never reads again.
	wsURL := "ws" + strings.TrimPrefix(hs.URL, "http") + "/ws/v1/client"
	dctx, cancel := context.WithTimeout(ctx, rig.Guard)
	defer cancel()
	stuck, _, err := websocket.Dial(dctx, wsURL, nil)
	require.NoError(t, err)
	t.Cleanup(func() { stuck.CloseNow() })
	for _, f := range []protocol.Frame{
		&protocol.Hello{Protocol: 1, Token: cli, ClientID: "stuck", ClientType: protocol.ClientConsole},
		&protocol.State{Contexts: []protocol.ContextReport{rig.Worker("s1")}},
		&protocol.Ping{},
	} {
		raw, err := protocol.Encode(f)
		require.NoError(t, err)
		require.NoError(t, stuck.Write(dctx, websocket.MessageText, raw))
	}
	for {
		_, raw, err := stuck.Read(dctx)
		require.NoError(t, err)
		if f, _ := protocol.Decode(raw); f != nil && f.FrameType() == protocol.TypePong {
			break
		}
	}

	hStuck, err := mgr.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "flood", ClientType: cheetah.Console, ClientID: "stuck"})
	require.NoError(t, err)
	hHealthy, err := mgr.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "steady", ClientType: cheetah.Console, ClientID: "healthy"})
	require.NoError(t, err)

	base := rig.Heap()
	// The healthy client keeps working while the other is flooded.
	var wg sync.WaitGroup
	floodDone := make(chan struct{})
	var slowest time.Duration
	var steady int
	wg.Go(func() {
		for i := 0; i < 100_000; i++ {
			select {
			case <-floodDone:
				if i > 0 {
					return
				}
			default:
			}
			start := time.Now()
			res, err := hHealthy.SendAndWait(ctx, cheetah.Command{Name: "echo", Params: map[string]int{"i": i}}, cheetah.WithTimeout(10*time.Second))
			if err != nil || res.Status != cheetah.StatusCompleted {
				t.Errorf("healthy client: %v %v", res.Status, err)
				return
			}
			slowest = max(slowest, time.Since(start))
			steady++
		}
	})
	payload := strings.Repeat("x", 32<<10)
	var peak uint64
	sent, cut := 0, false
	for i := range 20_000 {
		_, err := hStuck.Send(ctx, cheetah.Command{Name: "flood", Params: map[string]string{"blob": payload}})
		var lost *cheetah.LeaseLostError
		if errors.As(err, &lost) {
			require.Equal(t, cheetah.LostNotLive, lost.Reason)
			cut = true
			break
		}
		require.NoError(t, err)
		sent++
		if i%32 == 0 {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			peak = max(peak, m.HeapAlloc)
		}
	}
	close(floodDone)
	wg.Wait()
	require.True(t, cut, "the client that does not read was never disconnected (%d commands sent)", sent)
	// The cut client's session lets go of its queue once its close is
	// done, which on a loaded machine takes a moment: memory must come
	// back, not within a given time.
	after := rig.Heap()
	for deadline := time.Now().Add(20 * time.Second); int64(after)-int64(base) >= 16<<20 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		after = rig.Heap()
	}
	growth := int64(peak) - int64(base)
	t.Logf("stuck client cut off after %d commands of 32 KiB; heap base %d MiB, peak %+d MiB, after %+d MiB; healthy client: %d round trips meanwhile, slowest %s",
		sent, base>>20, growth>>20, (int64(after)-int64(base))>>20, steady, slowest.Round(time.Millisecond))
	// 256 queued frames of 32 KiB are 8 MiB; the encoded copies and the
	// records add a few times that. Far more than that is not bounded.
	require.Less(t, growth, int64(96<<20), "memory grew without bound while the client did not read")
	require.Less(t, int64(after)-int64(base), int64(16<<20), "memory did not come back after the client was cut off")
	require.Less(t, slowest, 5*time.Second, "the other client was held up")
	require.Empty(t, healthy.Check.Errors())
	_, err = mgr.Release(ctx, hHealthy)
	require.NoError(t, err)
	_, err = mgr.Release(ctx, hStuck)
	require.NoError(t, err)
}
