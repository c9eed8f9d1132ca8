package registry_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/protocol"
)

// A disconnect ends every command dispatched to that connection, and no
// other client's: theirs run on and complete.
func TestDisconnectEndsOnlyItsOwnCommands(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *registry.Config) { c.EpochBlock = 1024 })
	ctx := context.Background()
	type sent struct {
		client string
		res    chan cheetah.Resolution
	}
	var all []sent
	clients := map[string]*client{}
	for _, id := range []string{"a", "b", "c"} {
		clients[id] = e.connect(id, cheetah.Console, nil, worker("w1"), worker("w2"))
		for range 2 {
			l := e.mustAcquire("t", func(r *cheetah.AcquireRequest) { r.ClientID = id })
			for range 3 {
				s := sent{client: id, res: make(chan cheetah.Resolution, 1)}
				all = append(all, s)
				go func() {
					res, _ := e.reg.SendAndWait(ctx, l, cheetah.Command{Name: "x"}, cheetah.SendOptions{Timeout: time.Hour})
					s.res <- res
				}()
			}
		}
	}
	for _, c := range clients {
		cmdFrame(t, c, 6)
	}
	require.Equal(t, 18, e.reg.Stats().Commands)
	e.reg.Disconnect(clients["b"].att)
	for _, s := range all {
		if s.client == "b" {
			require.Equal(t, cheetah.StatusDisconnected, (<-s.res).Status)
		}
	}
	require.Equal(t, 12, e.reg.Stats().Commands, "only b's commands ended")
	for _, id := range []string{"a", "c"} {
		for _, f := range clients[id].conn.all() {
			if cmd, ok := f.(*protocol.Command); ok {
				e.result(clients[id], cmd.CommandID, `{}`)
			}
		}
	}
	for _, s := range all {
		if s.client != "b" {
			require.Equal(t, cheetah.StatusCompleted, (<-s.res).Status)
		}
	}
	require.Zero(t, e.reg.Stats().Commands)
}

// BenchmarkDisconnect measures a client's disconnect and reconnect while
// 10,000 commands of other clients are in flight: it visits only the
// client's own commands.
func BenchmarkDisconnect(b *testing.B) {
	// Asynchronous writes are dropped: the store's work is not measured.
	store := nopAsync{historytest.NewSQLite(b)}
	reg, err := registry.New(context.Background(), registry.Config{Store: store, Clock: clockwork.NewRealClock(), EpochBlock: 1 << 16, MaxInFlightPerContext: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer reg.Close()
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 10 {
		att := reg.Connect(registry.ClientInfo{UserID: user, ClientID: fmt.Sprintf("busy-%d", i), Type: cheetah.Console}, newFakeConn())
		reg.Report(att, []protocol.ContextReport{worker("w")})
		l, err := reg.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "busy", ClientType: cheetah.Console, ClientID: fmt.Sprintf("busy-%d", i)})
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				if _, err := reg.Send(ctx, l, cheetah.Command{Name: "x"}, cheetah.SendOptions{Timeout: time.Hour}); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	info := registry.ClientInfo{UserID: user, ClientID: "flaky", Type: cheetah.Console}
	b.ResetTimer()
	for range b.N {
		att := reg.Connect(info, newFakeConn())
		reg.Report(att, []protocol.ContextReport{worker("w")})
		reg.Disconnect(att)
	}
}

// nopAsync drops asynchronous writes as if they committed at once.
type nopAsync struct{ *history.Store }

func (nopAsync) WriteAsync(done func(error), _ ...history.Op) {
	if done != nil {
		done(nil)
	}
}
