package registry_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/protocol"
)

// cmdFrame waits for the n-th command frame (1-based) on c.
func cmdFrame(t *testing.T, c *client, n int) *protocol.Command {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		seen := 0
		for _, f := range c.conn.all() {
			if cmd, ok := f.(*protocol.Command); ok {
				if seen++; seen == n {
					return cmd
				}
			}
		}
		select {
		case <-c.conn.notify:
		case <-deadline:
			t.Fatalf("command %d never arrived; got %v", n, c.conn.all())
		}
	}
}

func TestSendAndWaitReadYourResult(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.connect("a", cheetah.Console, nil, worker("w1"))
	l := e.mustAcquire("t")
	ctx := context.Background()
	type out struct {
		res cheetah.Resolution
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := e.reg.SendAndWait(ctx, l, cheetah.Command{Name: "echo", Params: map[string]any{"x": 1}},
			cheetah.SendOptions{Options: json.RawMessage(`{ "b":1,"a" : 2 }`)})
		done <- out{res, err}
	}()
	f := cmdFrame(t, c, 1)
	require.Equal(t, "w1", f.ContextID)
	require.Equal(t, l.Epoch, f.Epoch)
	require.Equal(t, "t", f.TaskID)
	require.Equal(t, protocol.ResponseRPC, f.ResponseMode)
	require.JSONEq(t, `{"tab_id":"tab-w1"}`, string(f.Target), "the context's tab when no target is given")
	require.Equal(t, `{ "b":1,"a" : 2 }`, string(f.Options), "options pass through untouched")
	require.Regexp(t, `^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`, f.Traceparent)

	e.reg.ClientMessage(ctx, c.att, &protocol.Ack{CommandID: f.CommandID})
	e.reg.ClientMessage(ctx, c.att, &protocol.Progress{CommandID: f.CommandID, Data: []byte(`{"p":0.5}`)})
	e.reg.ClientMessage(ctx, c.att, protocol.NewCapture(f.CommandID, "image/png", []byte{0x89, 'P', 'N', 'G'}))
	e.result(c, f.CommandID, `{"ok":true}`)
	o := <-done
	require.NoError(t, o.err)
	require.Equal(t, cheetah.StatusCompleted, o.res.Status)
	require.Equal(t, f.CommandID, o.res.CommandID)
	require.Equal(t, f.Traceparent[3:35], o.res.TraceID)

	// Invariant 8: the history already has the terminal message.
	rec, err := e.reg.ReadCommand(ctx, user, f.CommandID)
	require.NoError(t, err)
	require.Equal(t, cheetah.StatusCompleted, rec.Status)
	require.Len(t, rec.Messages, 4)
	kinds := []cheetah.MessageKind{}
	for _, m := range rec.Messages {
		kinds = append(kinds, m.Kind)
		require.False(t, m.Late)
	}
	require.Equal(t, []cheetah.MessageKind{cheetah.KindAck, cheetah.KindProgress, cheetah.KindCapture, cheetah.KindResult}, kinds)
	require.JSONEq(t, `{"ok":true}`, string(rec.Messages[3].Data))
	require.NotNil(t, rec.AckedAt)
	require.NotNil(t, rec.DispatchedAt)
	require.NotNil(t, rec.FinishedAt)
	require.Equal(t, `{ "b":1,"a" : 2 }`, string(rec.Options))

	// A second terminal message is refused and recorded late.
	e.result(c, f.CommandID, `{"again":true}`)
	dup := waitFor(t, c.conn, func(f *protocol.Error) bool { return f.Code == protocol.CodeDuplicateTerminal })
	require.Equal(t, f.CommandID, dup.CommandID)

	// Another user's read is not found.
	_, err = e.reg.ReadCommand(ctx, "usr_2222", f.CommandID)
	require.ErrorIs(t, err, cheetah.ErrNotFound)
}

func TestExplicitTargetPassesThrough(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.connect("a", cheetah.Console, nil, worker("w1"))
	l := e.mustAcquire("t")
	_, err := e.reg.Send(context.Background(), l, cheetah.Command{Name: "x"}, cheetah.SendOptions{Target: json.RawMessage(`{"tab_id":"99","frame":"f1"}`)})
	require.NoError(t, err)
	require.Equal(t, `{"tab_id":"99","frame":"f1"}`, string(cmdFrame(t, c, 1).Target))
}

// The default target follows the context's tab: a report that moves the
// context to another tab moves the commands sent after it.
func TestDefaultTargetFollowsTheTab(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.connect("a", cheetah.Console, nil, worker("w1"))
	l := e.mustAcquire("t")
	ctx := context.Background()
	_, err := e.reg.Send(ctx, l, cheetah.Command{Name: "x"}, cheetah.SendOptions{})
	require.NoError(t, err)
	require.JSONEq(t, `{"tab_id":"tab-w1"}`, string(cmdFrame(t, c, 1).Target))

	moved := worker("w1")
	moved.TabID = "7"
	e.reg.Report(c.att, []protocol.ContextReport{moved})
	_, err = e.reg.Send(ctx, l, cheetah.Command{Name: "x"}, cheetah.SendOptions{})
	require.NoError(t, err)
	require.JSONEq(t, `{"tab_id":"7"}`, string(cmdFrame(t, c, 2).Target))
	rec, err := e.reg.ReadCommand(ctx, user, cmdFrame(t, c, 2).CommandID)
	require.NoError(t, err)
	require.JSONEq(t, `{"tab_id":"7"}`, string(rec.Target), "what history keeps is what was sent")
}

func TestFailedTimeoutAndLate(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.connect("a", cheetah.Console, nil, worker("w1"))
	l := e.mustAcquire("t")
	ctx := context.Background()

	res := make(chan cheetah.Resolution, 2)
	go func() {
		r, _ := e.reg.SendAndWait(ctx, l, cheetah.Command{Name: "fail"}, cheetah.SendOptions{})
		res <- r
	}()
	f := cmdFrame(t, c, 1)
	e.reg.ClientMessage(ctx, c.att, &protocol.Error{CommandID: f.CommandID, Code: "navigation_failed", Message: "boom", Data: []byte(`{"u":1}`)})
	r := <-res
	require.Equal(t, cheetah.StatusFailed, r.Status)
	require.Equal(t, "navigation_failed", r.Error.Code)

	go func() {
		r, _ := e.reg.SendAndWait(ctx, l, cheetah.Command{Name: "slow"}, cheetah.SendOptions{Timeout: 2 * time.Second})
		res <- r
	}()
	f2 := cmdFrame(t, c, 2)
	e.clock.Advance(2 * time.Second)
	r = <-res
	require.Equal(t, cheetah.StatusTimedOut, r.Status)
	require.Equal(t, "timed_out", r.Error.Code)

	// The result arrives after the timeout: recorded, late, not terminal.
	e.result(c, f2.CommandID, `{"finally":1}`)
	require.Eventually(t, func() bool {
		rec, err := e.reg.ReadCommand(ctx, user, f2.CommandID)
		return err == nil && len(rec.Messages) == 1 && rec.Messages[0].Late && rec.Status == cheetah.StatusTimedOut
	}, 5*time.Second, 5*time.Millisecond)
}

func TestUnknownCommandFromAnotherClient(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a := e.connect("a", cheetah.Console, nil, worker("w1"))
	b := e.connect("b", cheetah.Console, nil)
	l := e.mustAcquire("t")
	id, err := e.reg.Send(context.Background(), l, cheetah.Command{Name: "x"}, cheetah.SendOptions{ResponseMode: cheetah.ModeAsync})
	require.NoError(t, err)
	cmdFrame(t, a, 1)
	e.result(b, id.CommandID, `{"forged":true}`)
	waitFor(t, b.conn, func(f *protocol.Error) bool {
		return f.Code == protocol.CodeUnknownCommand && f.CommandID == id.CommandID
	})
	e.result(b, "0193aaaa-0000-7000-8000-000000000000", `{}`)
	waitFor(t, b.conn, func(f *protocol.Error) bool {
		return f.Code == protocol.CodeUnknownCommand && f.CommandID == "0193aaaa-0000-7000-8000-000000000000"
	})
	rec, err := e.reg.ReadCommand(context.Background(), user, id.CommandID)
	require.NoError(t, err)
	require.Empty(t, rec.Messages, "a foreign frame is recorded nowhere")
}

func TestResponseModeNone(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.connect("a", cheetah.Console, nil, worker("w1"))
	l := e.mustAcquire("t")
	ctx := context.Background()
	sent, err := e.reg.Send(ctx, l, cheetah.Command{Name: "fire"}, cheetah.SendOptions{ResponseMode: cheetah.ModeNone})
	require.NoError(t, err)
	f := cmdFrame(t, c, 1)
	require.Equal(t, protocol.ResponseNone, f.ResponseMode)
	require.Zero(t, e.reg.Stats().Commands, "nothing is tracked for a none command")
	e.reg.ClientMessage(ctx, c.att, &protocol.Ack{CommandID: sent.CommandID})
	require.Eventually(t, func() bool {
		rec, err := e.reg.ReadCommand(ctx, user, sent.CommandID)
		return err == nil && rec.Status == cheetah.StatusAcknowledged
	}, 5*time.Second, 5*time.Millisecond)
	_, err = e.reg.SendAndWait(ctx, l, cheetah.Command{Name: "x"}, cheetah.SendOptions{ResponseMode: cheetah.ModeNone})
	require.ErrorIs(t, err, cheetah.ErrInvalidRequest)
}

func TestCallerWentAwayPreservesNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.connect("a", cheetah.Console, nil, worker("w1"))
	l := e.mustAcquire("t", func(r *cheetah.AcquireRequest) { r.TTL = 10 * time.Second })
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := e.reg.SendAndWait(ctx, l, cheetah.Command{Name: "slow"}, cheetah.SendOptions{Timeout: time.Hour})
		errc <- err
	}()
	f := cmdFrame(t, c, 1)
	require.Equal(t, 1, e.reg.Stats().Preserving)
	e.clock.Advance(30 * time.Second)
	e.reg.ExpireDue()
	_, err := e.reg.Renew(context.Background(), l, 0)
	require.NoError(t, err, "admitted work keeps its lease past the TTL")
	// Renew moved the deadline to now+10s; the caller now goes away.
	e.clock.Advance(10 * time.Second)
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	waitFor(t, c.conn, func(x *protocol.Cancel) bool { return x.CommandID == f.CommandID })
	e.reg.ExpireDue()
	_, err = e.reg.Renew(context.Background(), l, 0)
	require.Equal(t, cheetah.LostExpired, lostReason(t, err), "a cancelled wait preserves nothing")
	require.Eventually(t, func() bool {
		rec, err := e.reg.ReadCommand(context.Background(), user, f.CommandID)
		return err == nil && rec.Status == cheetah.StatusCancelled
	}, 5*time.Second, 5*time.Millisecond, "the cancelled status is recorded")
	require.Zero(t, e.reg.Stats().Preserving)
}

func TestAdmittedWorkRenewsWhenItEnds(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.connect("a", cheetah.Console, nil, worker("w1"))
	l := e.mustAcquire("t", func(r *cheetah.AcquireRequest) {
		r.TTL = 10 * time.Second
		f := false
		r.RenewOnUse = &f
	})
	done := make(chan cheetah.Resolution, 1)
	go func() {
		r, _ := e.reg.SendAndWait(context.Background(), l, cheetah.Command{Name: "slow"}, cheetah.SendOptions{Timeout: time.Hour})
		done <- r
	}()
	f := cmdFrame(t, c, 1)
	e.clock.Advance(time.Minute)
	e.reg.ExpireDue()
	e.result(c, f.CommandID, `{}`)
	require.Equal(t, cheetah.StatusCompleted, (<-done).Status)
	e.clock.Advance(9 * time.Second)
	e.reg.ExpireDue()
	views, _ := e.reg.TaskContexts(context.Background(), user, "t")
	require.Len(t, views, 1, "renewed for its TTL from the moment the work ended")
	require.Equal(t, e.clock.Now().Add(time.Second), views[0].ExpiresAt)
	e.clock.Advance(time.Second)
	e.reg.ExpireDue()
	_, err := e.reg.Send(context.Background(), l, cheetah.Command{Name: "x"}, cheetah.SendOptions{})
	require.Equal(t, cheetah.LostExpired, lostReason(t, err))
}

func TestRenewOnUseFalse(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.connect("a", cheetah.Console, nil, worker("w1"))
	no := false
	l := e.mustAcquire("t", func(r *cheetah.AcquireRequest) { r.TTL = 10 * time.Second; r.RenewOnUse = &no })
	e.clock.Advance(8 * time.Second)
	_, err := e.reg.Send(context.Background(), l, cheetah.Command{Name: "x"}, cheetah.SendOptions{})
	require.NoError(t, err)
	e.clock.Advance(2 * time.Second)
	e.reg.ExpireDue()
	_, err = e.reg.Send(context.Background(), l, cheetah.Command{Name: "x"}, cheetah.SendOptions{})
	require.Equal(t, cheetah.LostExpired, lostReason(t, err), "only an explicit renew extends")
}

func TestDisconnectResolvesInFlight(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.connect("a", cheetah.Console, nil, worker("w1"))
	l := e.mustAcquire("t")
	done := make(chan cheetah.Resolution, 1)
	go func() {
		r, _ := e.reg.SendAndWait(context.Background(), l, cheetah.Command{Name: "x"}, cheetah.SendOptions{})
		done <- r
	}()
	cmdFrame(t, c, 1)
	e.reg.Disconnect(c.att)
	r := <-done
	require.Equal(t, cheetah.StatusDisconnected, r.Status)
}

func TestReplacementClosesOlderWith4409(t *testing.T) {
	t.Parallel()
	e := setup(t)
	old := e.connect("a", cheetah.Console, nil, worker("w1"))
	l := e.mustAcquire("t")
	nw := e.connect("a", cheetah.Console, nil, worker("w1"))
	require.Equal(t, protocol.CloseReplaced, old.conn.closeCode())
	e.reg.Disconnect(old.att) // the old session ends afterwards: no effect
	_, err := e.reg.Send(context.Background(), l, cheetah.Command{Name: "x"}, cheetah.SendOptions{})
	require.NoError(t, err, "the lease continues on the new connection")
	cmdFrame(t, nw, 1)
}

func TestSlowClientCommandEndsDisconnected(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.connect("a", cheetah.Console, nil, worker("w1"))
	l := e.mustAcquire("t")
	c.conn.mu.Lock()
	c.conn.full = true
	c.conn.mu.Unlock()
	r, err := e.reg.SendAndWait(context.Background(), l, cheetah.Command{Name: "x"}, cheetah.SendOptions{})
	require.NoError(t, err)
	require.Equal(t, cheetah.StatusDisconnected, r.Status)
}

func TestSendValidation(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *registry.Config) { c.MaxMessageBytes = 4096 })
	e.connect("a", cheetah.Console, nil, worker("w1"))
	l := e.mustAcquire("t")
	ctx := context.Background()
	bad := map[string]struct {
		cmd cheetah.Command
		so  cheetah.SendOptions
	}{
		"no name":       {cheetah.Command{}, cheetah.SendOptions{}},
		"long name":     {cheetah.Command{Name: string(make([]byte, 129))}, cheetah.SendOptions{}},
		"bad mode":      {cheetah.Command{Name: "x"}, cheetah.SendOptions{ResponseMode: "later"}},
		"target array":  {cheetah.Command{Name: "x"}, cheetah.SendOptions{Target: json.RawMessage(`[1]`)}},
		"options str":   {cheetah.Command{Name: "x"}, cheetah.SendOptions{Options: json.RawMessage(`"s"`)}},
		"bad params":    {cheetah.Command{Name: "x", Params: json.RawMessage(`{`)}, cheetah.SendOptions{}},
		"timeout big":   {cheetah.Command{Name: "x"}, cheetah.SendOptions{Timeout: time.Hour + time.Millisecond}},
		"timeout small": {cheetah.Command{Name: "x"}, cheetah.SendOptions{Timeout: time.Microsecond}},
		"NUL in name":   {cheetah.Command{Name: "x\x00"}, cheetah.SendOptions{}},
		"deep params":   {cheetah.Command{Name: "x", Params: json.RawMessage(strings.Repeat("[", 65) + strings.Repeat("]", 65))}, cheetah.SendOptions{}},
		"dup params":    {cheetah.Command{Name: "x", Params: json.RawMessage(`{"a":1,"a":2}`)}, cheetah.SendOptions{}},
		"dup options":   {cheetah.Command{Name: "x"}, cheetah.SendOptions{Options: json.RawMessage(`{"a":1,"a":2}`)}},
	}
	for name, b := range bad {
		_, err := e.reg.Send(ctx, l, b.cmd, b.so)
		require.ErrorIs(t, err, cheetah.ErrInvalidRequest, name)
	}
	_, err := e.reg.Send(ctx, l, cheetah.Command{Name: "x", Params: map[string]string{"big": string(make([]byte, 5000))}}, cheetah.SendOptions{})
	require.ErrorIs(t, err, cheetah.ErrPayloadTooLarge)
	page, err := e.reg.ListCommands(ctx, user, cheetah.ListQuery{})
	require.NoError(t, err)
	require.Empty(t, page.Commands, "nothing half-written persists")
}

func TestWaitFirstComeFirstServed(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.connect("a", cheetah.Console, nil, worker("w1"), worker("w2"))
	l1 := e.mustAcquire("t1")
	l2 := e.mustAcquire("t2")
	type got struct {
		l   cheetah.Lease
		err error
	}
	first, second := make(chan got, 1), make(chan got, 1)
	go func() {
		l, err := e.acquire("first", func(r *cheetah.AcquireRequest) { r.Wait = time.Minute })
		first <- got{l, err}
	}()
	require.Eventually(t, func() bool { return e.reg.Stats().Waiters == 1 }, 5*time.Second, time.Millisecond)
	go func() {
		l, err := e.acquire("second", func(r *cheetah.AcquireRequest) { r.Wait = time.Minute })
		second <- got{l, err}
	}()
	require.Eventually(t, func() bool { return e.reg.Stats().Waiters == 2 }, 5*time.Second, time.Millisecond)
	_, _ = e.reg.Release(context.Background(), l2)
	g := <-first
	require.NoError(t, g.err)
	require.Equal(t, "first", g.l.TaskID)
	require.Equal(t, l2.ContextID, g.l.ContextID)
	_, _ = e.reg.Release(context.Background(), l1)
	g = <-second
	require.NoError(t, g.err)
	require.Equal(t, l1.ContextID, g.l.ContextID)

	// A waiter that finds nothing in time fails with the reason.
	go func() {
		l, err := e.acquire("third", func(r *cheetah.AcquireRequest) { r.Wait = 2 * time.Second })
		first <- got{l, err}
	}()
	require.Eventually(t, func() bool { return e.reg.Stats().Waiters == 1 }, 5*time.Second, time.Millisecond)
	e.clock.Advance(2 * time.Second)
	g = <-first
	require.Equal(t, cheetah.ReasonNoIdleWorker, noContextReason(t, g.err))
	require.Zero(t, e.reg.Stats().Waiters)
}

func TestEpochsRiseAcrossRestart(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.connect("a", cheetah.Console, nil, worker("w1"))
	var last int64
	for range 20 { // crosses several blocks of 8
		// An acquire never waits for a reservation; this test does.
		require.NoError(t, e.reg.ReserveEpochs(context.Background()))
		l := e.mustAcquire("t")
		require.Greater(t, l.Epoch, last)
		last = l.Epoch
		_, _ = e.reg.Release(context.Background(), l)
	}
	e.reg.Close()
	reg2, err := registry.New(context.Background(), registry.Config{Clock: e.clock, Store: e.store, EpochBlock: 8})
	require.NoError(t, err)
	defer reg2.Close()
	c := newFakeConn()
	att := reg2.Connect(registry.ClientInfo{UserID: user, ClientID: "a", Type: cheetah.Console}, c)
	reg2.Report(att, []protocol.ContextReport{worker("w1")})
	l, err := reg2.Acquire(context.Background(), cheetah.AcquireRequest{UserID: user, TaskID: "t", ClientType: cheetah.Console})
	require.NoError(t, err)
	require.Greater(t, l.Epoch, last, "epochs are never reused, across restarts too")
}

func TestInFlightBound(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *registry.Config) { c.MaxInFlightPerContext = 2 })
	c := e.connect("a", cheetah.Console, nil, worker("w1"))
	l := e.mustAcquire("t")
	ctx := context.Background()
	first, err := e.reg.Send(ctx, l, cheetah.Command{Name: "x"}, cheetah.SendOptions{})
	require.NoError(t, err)
	_, err = e.reg.Send(ctx, l, cheetah.Command{Name: "x"}, cheetah.SendOptions{})
	require.NoError(t, err, "at the bound")
	_, err = e.reg.Send(ctx, l, cheetah.Command{Name: "x"}, cheetah.SendOptions{})
	require.ErrorIs(t, err, cheetah.ErrOverloaded, "one past it")
	cmdFrame(t, c, 1)
	e.result(c, first.CommandID, `{}`)
	require.Eventually(t, func() bool {
		_, err := e.reg.Send(ctx, l, cheetah.Command{Name: "x"}, cheetah.SendOptions{})
		return err == nil
	}, 5*time.Second, time.Millisecond, "room again once one ends")
}
