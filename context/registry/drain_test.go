package registry_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/protocol"
)

type waited struct {
	res cheetah.Resolution
	err error
}

func (e *env) sendAndWait(l cheetah.Lease, name string) chan waited {
	done := make(chan waited, 1)
	go func() {
		res, err := e.reg.SendAndWait(context.Background(), l, cheetah.Command{Name: name}, cheetah.SendOptions{})
		done <- waited{res, err}
	}()
	return done
}

func receive[T any](t *testing.T, ch chan T) T {
	t.Helper()
	select {
	case w := <-ch:
		return w
	case <-time.After(10 * time.Second):
		t.Fatal("no answer")
		var zero T
		return zero
	}
}

// A graceful stop: after Drain no work is taken, commands in flight run on
// (one completes), and Interrupt ends the rest interrupted, in history and
// for their callers. Nothing admitted is missing.
func TestDrainThenInterrupt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	c := e.connect("a", cheetah.Console, nil, worker("w1"), worker("w2"), worker("w3"))
	l1, l2 := e.mustAcquire("t1"), e.mustAcquire("t2")
	first := e.sendAndWait(l1, "quick")
	f1 := cmdFrame(t, c, 1)
	second := e.sendAndWait(l2, "slow")
	f2 := cmdFrame(t, c, 2)
	async, err := e.reg.Send(ctx, l2, cheetah.Command{Name: "async"}, cheetah.SendOptions{})
	require.NoError(t, err)
	cmdFrame(t, c, 3)
	require.Equal(t, 3, e.reg.InFlight())

	// An acquire waiting for a context fails when the drain begins.
	waiting := make(chan error, 1)
	go func() {
		_, err := e.reg.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "later", ClientType: cheetah.Console,
			ClientID: "nobody", Wait: time.Minute})
		waiting <- err
	}()
	require.Eventually(t, func() bool { return e.reg.Stats().Waiters == 1 }, 10*time.Second, time.Millisecond)

	e.reg.Drain()
	select {
	case err := <-waiting:
		require.ErrorIs(t, err, cheetah.ErrOverloaded)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting acquire did not fail")
	}
	_, err = e.acquire("t3")
	require.ErrorIs(t, err, cheetah.ErrOverloaded, "no acquire once draining")
	_, err = e.reg.Send(ctx, l1, cheetah.Command{Name: "more"}, cheetah.SendOptions{})
	require.ErrorIs(t, err, cheetah.ErrOverloaded, "no send once draining")
	_, err = e.reg.Renew(ctx, l1, 0)
	require.NoError(t, err, "renew goes on")

	short, cancel := context.WithCancel(ctx)
	cancel()
	require.Error(t, e.reg.WaitIdle(short), "two commands are still in flight")

	// The quick one finishes in time.
	e.result(c, f1.CommandID, `{"ok":true}`)
	require.Equal(t, cheetah.StatusCompleted, receive(t, first).res.Status)

	n, err := e.reg.Interrupt(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	w := receive(t, second)
	require.NoError(t, w.err)
	require.Equal(t, cheetah.StatusInterrupted, w.res.Status)
	require.Equal(t, "interrupted", w.res.Error.Code)
	require.NoError(t, e.reg.WaitIdle(ctx))
	require.Zero(t, e.reg.InFlight())

	for id, want := range map[string]cheetah.Status{f1.CommandID: cheetah.StatusCompleted, f2.CommandID: cheetah.StatusInterrupted,
		async.CommandID: cheetah.StatusInterrupted} {
		rec, err := e.store.Get(ctx, user, id)
		require.NoError(t, err)
		require.Equal(t, want, rec.Status, rec.Name)
		require.NotNil(t, rec.FinishedAt)
	}

	// A late result is recorded as late.
	e.result(c, f2.CommandID, `{"late":true}`)
	require.Eventually(t, func() bool {
		rec, err := e.store.Get(ctx, user, f2.CommandID)
		return err == nil && len(rec.Messages) == 1 && rec.Messages[0].Late
	}, 10*time.Second, time.Millisecond)
}

// WaitIdle returns at once when nothing is in flight, and only drains.
func TestWaitIdle(t *testing.T) {
	t.Parallel()
	e := setup(t)
	require.Error(t, e.reg.WaitIdle(context.Background()), "not draining")
	e.reg.Drain()
	e.reg.Drain()
	require.NoError(t, e.reg.WaitIdle(context.Background()))
	n, err := e.reg.Interrupt(context.Background())
	require.NoError(t, err)
	require.Zero(t, n)
}

// A command whose record is being written when Interrupt comes was
// dispatched already (dispatch overlaps the record's commit): it ends
// interrupted, its end written after its record, and its caller hears so
// only once the record is durable too.
func TestInterruptWhileWriting(t *testing.T) {
	t.Parallel()
	hs := &historytest.Holding{}
	e := setup(t, func(cfg *registry.Config) {
		hs.Store = cfg.Store.(*history.Store)
		cfg.Store = hs
	})
	c := e.connect("a", cheetah.Console, nil, worker("w1"))
	l := e.mustAcquire("t")
	hs.SetHold(true)
	done := e.sendAndWait(l, "pending")
	f := cmdFrame(t, c, 1)

	// An Interrupt that stops waiting at once still ends the command.
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	n, err := e.reg.Interrupt(cctx)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 1, n)
	select {
	case w := <-done:
		t.Fatalf("answered %+v before the record's commit came back", w)
	case <-time.After(50 * time.Millisecond):
	}
	require.NoError(t, hs.Store.Write(context.Background()), "everything handed over is written")
	hs.Release()
	w := receive(t, done)
	require.NoError(t, w.err)
	require.Equal(t, cheetah.StatusInterrupted, w.res.Status)
	require.Equal(t, f.CommandID, w.res.CommandID)
	n, err = e.reg.Interrupt(context.Background())
	require.NoError(t, err)
	require.Zero(t, n)
	rec, err := e.store.Get(context.Background(), user, w.res.CommandID)
	require.NoError(t, err)
	require.Equal(t, cheetah.StatusInterrupted, rec.Status)
	require.NotNil(t, rec.DispatchedAt)
}

// Every command has a valid W3C trace id. With a recording tracer it is the
// command span's, the frame's traceparent names the dispatch span, and the
// caller's trace is continued; without one the caller's trace is still
// continued, and with no trace at all the id is random.
func TestTraceIDs(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder() // sees spans as they start
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	traced := setup(t, func(cfg *registry.Config) { cfg.TracerProvider = tp })
	plain := setup(t)
	parent := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled, Remote: true,
	})
	withParent := trace.ContextWithRemoteSpanContext(context.Background(), parent)

	clients := 0
	send := func(e *env, ctx context.Context) (cheetah.Sent, *protocol.Command) {
		t.Helper()
		clients++
		c := e.connect(fmt.Sprintf("c%d", clients), cheetah.Console, nil, worker("w"))
		l, err := e.reg.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "t", ClientType: cheetah.Console, ClientID: c.id})
		require.NoError(t, err)
		s, err := e.reg.Send(ctx, l, cheetah.Command{Name: "n"}, cheetah.SendOptions{})
		require.NoError(t, err)
		return s, cmdFrame(t, c, 1)
	}

	s, f := send(traced, withParent)
	require.Equal(t, parent.TraceID().String(), s.TraceID, "the caller's trace goes on")
	var dispatch sdktrace.ReadWriteSpan
	for _, sp := range rec.Started() {
		if sp.Name() == "cheetah.dispatch" {
			dispatch = sp
		}
	}
	require.NotNil(t, dispatch)
	require.Equal(t, "00-"+s.TraceID+"-"+dispatch.SpanContext().SpanID().String()+"-01", f.Traceparent)
	require.Equal(t, parent.SpanID(), rec.Started()[0].Parent().SpanID(), "the acquire's parent is the caller's span")

	s, f = send(plain, withParent)
	require.Equal(t, parent.TraceID().String(), s.TraceID, "continued without an SDK too")
	require.Equal(t, "00-"+s.TraceID+"-"+parent.SpanID().String()+"-01", f.Traceparent)

	s1, f1 := send(plain, context.Background())
	s2, _ := send(plain, context.Background())
	require.Regexp(t, `^[0-9a-f]{32}$`, s1.TraceID)
	require.NotEqual(t, s1.TraceID, s2.TraceID)
	require.Regexp(t, `^00-`+s1.TraceID+`-[0-9a-f]{16}-01$`, f1.Traceparent)
	require.NotContains(t, f1.Traceparent, "0000000000000000")
}

// A replica that fences forgets its clients, which ends the commands
// dispatched to them disconnected; its rows are marked interrupted when it
// gives them up (AbandonReplica) or is reaped, and when that mark lands
// first, the disconnected end changes nothing in history: the waiting
// caller hears what history holds.
func TestForgetTellsTheEndHistoryHolds(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.connect("a", cheetah.Console, nil, worker("w1"))
	l := e.mustAcquire("t1")
	waiting := e.sendAndWait(l, "slow")
	f := cmdFrame(t, c, 1)
	e.awaitRecord(t, f.CommandID)

	e.markInterrupted(t, 1)
	e.reg.Forget(protocol.CloseGoingAway, "fenced")

	e.requireToldAsHistoryHolds(t, waiting, f.CommandID, cheetah.StatusInterrupted)
	require.Zero(t, e.reg.InFlight())
}

// awaitRecord waits until the record of command id is durable.
func (e *env) awaitRecord(t *testing.T, id string) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, err := e.store.Get(context.Background(), user, id)
		return err == nil
	}, 10*time.Second, time.Millisecond, "the record of %s is durable", id)
}

// markInterrupted marks the commands in flight in history interrupted, as
// a replica's rows are when it gives them up, and checks it marked n.
func (e *env) markInterrupted(t *testing.T, n int64) {
	t.Helper()
	got, err := e.store.MarkInterrupted(context.Background(), time.Now())
	require.NoError(t, err)
	require.Equal(t, n, got, "the mark lands first")
}

// requireToldAsHistoryHolds checks that the wait on command id was told
// what history holds, with status.
func (e *env) requireToldAsHistoryHolds(t *testing.T, waiting chan waited, id string, status cheetah.Status) {
	t.Helper()
	w := receive(t, waiting)
	require.NoError(t, w.err)
	rec, err := e.store.Get(context.Background(), user, id)
	require.NoError(t, err)
	require.Equal(t, status, rec.Status)
	require.Equal(t, rec.Resolution(), w.res, "what history holds")
}

// pausedWrites is a history store whose WriteAsync waits while it is
// paused, as the writer's does while its queue is full: what the registry
// decided reaches the database later.
type pausedWrites struct {
	*history.Store
	mu   sync.Mutex
	gate chan struct{} // nil while not paused
}

func (s *pausedWrites) pause() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gate = make(chan struct{})
}

func (s *pausedWrites) resume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.gate)
	s.gate = nil
}

func (s *pausedWrites) WriteAsync(done func(error), ops ...history.Op) {
	s.mu.Lock()
	gate := s.gate
	s.mu.Unlock()
	if gate != nil {
		<-gate
	}
	s.Store.WriteAsync(done, ops...)
}

// An end decided before the replica fenced and written only after a mark
// of its rows (others reaped it while it was cut off from the database)
// changes nothing in history: its caller hears what history holds, not
// what the registry had decided.
func TestEndOverruledByAMarkIsToldAsHistoryHoldsIt(t *testing.T) {
	t.Parallel()
	ps := &pausedWrites{}
	e := setup(t, func(cfg *registry.Config) {
		ps.Store = cfg.Store.(*history.Store)
		cfg.Store = ps
	})
	c := e.connect("a", cheetah.Console, nil, worker("w1"))
	l := e.mustAcquire("t")
	waiting := e.sendAndWait(l, "quick")
	f := cmdFrame(t, c, 1)
	e.awaitRecord(t, f.CommandID)

	ps.pause()
	e.result(c, f.CommandID, `{"ok":true}`)
	require.Eventually(t, func() bool { return e.reg.InFlight() == 0 }, 10*time.Second, time.Millisecond, "completed, not written")
	e.markInterrupted(t, 1)
	e.reg.Forget(protocol.CloseGoingAway, "fenced")
	ps.resume()

	e.requireToldAsHistoryHolds(t, waiting, f.CommandID, cheetah.StatusInterrupted)
}
