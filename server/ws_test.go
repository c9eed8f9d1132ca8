package server_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/server"
)

func TestHelloWelcome(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.dial().read()
	w := c.hello(b.client, "agent-1", protocol.ClientConsole)
	require.Equal(t, user, w.UserID)
	require.Equal(t, 20, w.HeartbeatS)
	require.EqualValues(t, 64<<10, w.MaxMessageBytes)
	require.NotEmpty(t, w.SessionID)
	c.send(&protocol.Ping{})
	next[*protocol.Pong](c)
}

func TestCloseCodes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("4408 no hello in time", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.dial().read()
		require.NoError(t, b.clock.BlockUntilContext(ctx, 1)) // the hello timer
		b.clock.Advance(10 * time.Second)
		c.expectClose(protocol.CloseTimeout)
	})
	t.Run("4401 first frame not hello", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.dial().read()
		c.send(&protocol.Ping{})
		c.expectClose(protocol.CloseUnauthorized)
	})
	t.Run("4401 bad token", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.dial().read()
		c.send(&protocol.Hello{Protocol: 1, Token: "chk_nope_nope", ClientID: "a", ClientType: protocol.ClientConsole})
		c.expectClose(protocol.CloseUnauthorized)
	})
	t.Run("4401 missing token", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.dial().read()
		c.sendRaw([]byte(`{"type":"hello","protocol":1,"client_id":"a","client_type":"console"}`))
		c.expectClose(protocol.CloseUnauthorized)
	})
	t.Run("4401 app key", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.dial().read()
		c.send(&protocol.Hello{Protocol: 1, Token: b.appKey, ClientID: "a", ClientType: protocol.ClientConsole})
		c.expectClose(protocol.CloseUnauthorized)
	})
	t.Run("4400 malformed hello", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.dial().read()
		c.sendRaw([]byte(`{"type":"hello","protocol":1,"token":"x","client_id":"a","client_type":7}`))
		c.expectClose(protocol.CloseMalformed)
	})
	t.Run("4400 malformed frame", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.connectAgent("a", "w1")
		c.sendRaw([]byte(`{"type":"ack"}`))
		c.expectClose(protocol.CloseMalformed)
	})
	t.Run("4400 bad json", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.connectAgent("a", "w1")
		c.sendRaw([]byte(`{"type":`))
		c.expectClose(protocol.CloseMalformed)
	})
	t.Run("4413 frame too large", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.connectAgent("a", "w1")
		c.sendRaw([]byte(`{"type":"progress","command_id":"x","data":"` + strings.Repeat("a", 64<<10) + `"}`))
		c.expectClose(protocol.CloseTooLarge)
	})
	t.Run("a frame at the limit is read", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.connectAgent("a", "w1")
		head, tail := `{"type":"progress","command_id":"x","data":"`, `"}`
		c.sendRaw([]byte(head + strings.Repeat("a", 64<<10-len(head)-len(tail)) + tail))
		e := next[*protocol.Error](c)
		require.Equal(t, protocol.CodeUnknownCommand, e.Code, "read and answered, not closed")
	})
	t.Run("4408 silent client", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.dial()
		c.send(&protocol.Hello{Protocol: 1, Token: b.client, ClientID: "a", ClientType: protocol.ClientConsole})
		_, msg, err := c.conn.Read(ctx) // the welcome; then it reads nothing, so it answers no ping
		require.NoError(t, err)
		require.Contains(t, string(msg), `"welcome"`)
		require.NoError(t, b.clock.BlockUntilContext(ctx, 1)) // the heartbeat ticker
		for range 3 {
			b.clock.Advance(20 * time.Second)
		}
		c.read()
		c.expectClose(protocol.CloseTimeout)
	})
	t.Run("4409 replaced", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		old := b.connectAgent("a", "w1")
		b.connectAgent("a", "w1")
		old.expectClose(protocol.CloseReplaced)
	})
	t.Run("4403 key revoked", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.connectAgent("a", "w1")
		keys, err := b.keys.List(ctx)
		require.NoError(t, err)
		var id string
		for _, k := range keys {
			if k.Kind == "client" {
				id = k.ID
			}
		}
		resp := b.do("DELETE", "/api/v1/admin/keys/"+id, b.adminKey, nil, nil)
		require.Equal(t, 200, resp.StatusCode)
		c.expectClose(protocol.CloseForbidden)
		// The revoked key cannot say hello again.
		c2 := b.dial().read()
		c2.send(&protocol.Hello{Protocol: 1, Token: b.client, ClientID: "a", ClientType: protocol.ClientConsole})
		c2.expectClose(protocol.CloseUnauthorized)
	})
	t.Run("1001 shutdown", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.connectAgent("a", "w1")
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		require.NoError(t, b.srv.Shutdown(sctx))
		c.expectClose(protocol.CloseGoingAway)
	})
}

func TestUnknownTypeKeepsConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.connectAgent("a", "w1")
	c.sendRaw([]byte(`{"type":"teleport","to":"mars"}`))
	require.Equal(t, protocol.CodeUnknownType, next[*protocol.Error](c).Code)
	c.send(&protocol.Welcome{SessionID: "s", UserID: "u", HeartbeatS: 1, MaxMessageBytes: 1})
	require.Equal(t, protocol.CodeUnknownType, next[*protocol.Error](c).Code, "a broker frame from a client")
	c.send(&protocol.Ping{})
	next[*protocol.Pong](c)
}

func TestGraceAndReturn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c := b.connectAgent("a", "w1")
	l, err := b.reg.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "t", ClientType: cheetah.Console})
	require.NoError(t, err)
	next[*protocol.Assignment](c)
	c.conn.CloseNow()
	require.Eventually(t, func() bool {
		_, err := b.reg.Send(ctx, l, cheetah.Command{Name: "x"}, cheetah.SendOptions{})
		var lost *cheetah.LeaseLostError
		return err != nil && errorsAs(err, &lost) && lost.Reason == cheetah.LostNotLive
	}, 10*time.Second, 5*time.Millisecond)

	c2 := b.connectAgent("a", "w1")
	_, err = b.reg.Send(ctx, l, cheetah.Command{Name: "x"}, cheetah.SendOptions{})
	require.NoError(t, err, "the lease survived the reconnect")
	require.Equal(t, l.Epoch, next[*protocol.Command](c2).Epoch)
}

func TestForeignCommandID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	a := b.connectAgent("a", "w1")
	other := b.connectAgent("b", "w9")
	l, err := b.reg.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "t", ClientType: cheetah.Console, ClientID: "a"})
	require.NoError(t, err)
	sent, err := b.reg.Send(ctx, l, cheetah.Command{Name: "x"}, cheetah.SendOptions{})
	require.NoError(t, err)
	next[*protocol.Command](a)
	other.send(&protocol.Result{CommandID: sent.CommandID, Data: []byte(`{"forged":1}`)})
	e := next[*protocol.Error](other)
	require.Equal(t, protocol.CodeUnknownCommand, e.Code)
	rec, err := b.reg.ReadCommand(ctx, user, sent.CommandID)
	require.NoError(t, err)
	require.Empty(t, rec.Messages)
}

func TestClientThatStopsReading(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *server.Config) {
		c.OutboundQueue = 4
		c.WriteTimeout = time.Second
		c.MaxMessageBytes = 4 << 20
	})
	ctx := context.Background()
	// The stuck client says hello and reports, then never reads again.
	stuck := b.dial()
	stuck.send(&protocol.Hello{Protocol: 1, Token: b.client, ClientID: "stuck", ClientType: protocol.ClientConsole})
	stuck.send(&protocol.State{Contexts: []protocol.ContextReport{{ContextID: "w1", Owner: protocol.OwnerWorker}}})
	healthy := b.connectAgent("healthy", "h1")
	require.Eventually(t, func() bool {
		av, _ := b.reg.ListAvailable(ctx, user, cheetah.Console)
		return len(av) == 2
	}, 10*time.Second, 5*time.Millisecond)

	ls, err := b.reg.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "t", ClientType: cheetah.Console, ClientID: "stuck"})
	require.NoError(t, err)
	lh, err := b.reg.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "t", ClientType: cheetah.Console, ClientID: "healthy"})
	require.NoError(t, err)
	big := map[string]string{"pad": strings.Repeat("x", 1<<20)}
	var lastErr error
	for range 64 {
		if _, lastErr = b.reg.Send(ctx, ls, cheetah.Command{Name: "x", Params: big}, cheetah.SendOptions{}); lastErr != nil {
			break
		}
	}
	var lost *cheetah.LeaseLostError
	require.ErrorAs(t, lastErr, &lost, "the stuck client was disconnected")
	require.Equal(t, cheetah.LostNotLive, lost.Reason)

	// The healthy client was never held up.
	done := make(chan cheetah.Resolution, 1)
	go func() {
		r, _ := b.reg.SendAndWait(ctx, lh, cheetah.Command{Name: "echo"}, cheetah.SendOptions{})
		done <- r
	}()
	cmd := next[*protocol.Command](healthy)
	healthy.send(&protocol.Result{CommandID: cmd.CommandID})
	require.Equal(t, cheetah.StatusCompleted, (<-done).Status)
}

// Frames queued for a client while its writer is busy go out together, in
// one write of the connection: bursts of commands take fewer writes than
// frames (a burst whose sends never overlapped a write is tried again).
func TestQueuedFramesGoOutInOneWrite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const contexts, each = 8, 10
	var ids []string
	for i := range contexts {
		ids = append(ids, fmt.Sprintf("w%d", i))
	}
	c := b.connectAgent("a", ids...)
	var leases []cheetah.Lease
	for range contexts {
		l, err := b.reg.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "t", ClientType: cheetah.Console})
		require.NoError(t, err)
		leases = append(leases, l)
		next[*protocol.Assignment](c)
	}
	for burst := range 20 {
		before := b.writes.Load()
		var wg sync.WaitGroup
		for _, l := range leases {
			wg.Go(func() {
				for range each {
					if _, err := b.reg.Send(ctx, l, cheetah.Command{Name: "x"}, cheetah.SendOptions{}); err != nil {
						t.Errorf("send: %v", err)
					}
				}
			})
		}
		wg.Wait()
		for range contexts * each {
			next[*protocol.Command](c)
		}
		if writes := b.writes.Load() - before; writes < contexts*each {
			t.Logf("burst %d: %d commands in %d writes", burst, contexts*each, writes)
			return
		}
	}
	t.Fatal("every command frame took a write of its own")
}
