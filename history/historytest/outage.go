package historytest

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history"
)

// RunOutage is the part of the conformance suite that takes the database
// away (with Outage) while the store runs. open returns a new store as for
// Run; on SQLite it should pass BusyTimeout, so that a write fails in well
// under the default 10 s (Run's concurrent tests need the long one).
func RunOutage(t *testing.T, open func(t *testing.T) *history.Store) {
	run(t, open, []conformanceTest{
		{"HeldThroughOutage", testHeldThroughOutage},
		{"HealthProbe", testHealthProbe},
		{"OutageUnderLoad", testOutageUnderLoad},
		{"HealthHoldsThroughOutage", testHealthHolds},
		{"EmptyWriteAsks", testEmptyWriteAsks},
	})
}

// waitHealthy waits until the writer has noticed that the database answers
// again (its probe runs within half a second) and has written what it held.
func waitHealthy(t *testing.T, s *history.Store) {
	t.Helper()
	require.Eventually(t, func() bool { return s.Health() == nil }, 30*time.Second, 10*time.Millisecond,
		"the store did not recover: %v", s.Health())
}

// testHeldThroughOutage: asynchronous writes that fail because the database
// does not answer are held and written, in order, once it answers again;
// a synchronous Write is failed and not kept; Health says which is which.
func testHeldThroughOutage(t *testing.T, ctx context.Context, s *history.Store) {
	rec := newCommand("usr_1111", "task-1")
	insert(t, ctx, s, rec)
	require.NoError(t, s.Health())

	restore := Outage(t, s)
	done := make(chan error, 3)
	cb := func(err error) { done <- err }
	at := time.Now()
	s.WriteAsync(cb, history.SetStatus{CommandID: rec.CommandID, Status: cheetah.StatusDispatched, At: at})
	s.WriteAsync(cb, progress(rec.CommandID, 0))
	s.WriteAsync(cb,
		history.AppendMessage{CommandID: rec.CommandID, Msg: cheetah.Message{Kind: cheetah.KindResult, Data: json.RawMessage(`{"ok":true}`)}},
		history.SetStatus{CommandID: rec.CommandID, Status: cheetah.StatusCompleted, At: at})
	for range 3 {
		// The caller hears of the failure at once: it does not wait for the
		// outage to end.
		require.ErrorIs(t, <-done, cheetah.ErrStoreUnavailable)
	}
	require.ErrorIs(t, s.Health(), cheetah.ErrStoreUnavailable)
	st := s.Stats()
	require.EqualValues(t, 4, st.Held)
	require.Zero(t, st.Dropped)

	// A Write fails (without its own attempt, behind what is held) and is
	// not kept: its caller decides.
	lost := newCommand("usr_1111", "task-1")
	require.ErrorIs(t, s.Write(ctx, history.InsertCommand{Rec: lost}), cheetah.ErrStoreUnavailable)

	restore()
	waitHealthy(t, s)
	st = s.Stats()
	require.Zero(t, st.Held)
	require.EqualValues(t, 4, st.Recovered)
	require.Zero(t, st.Dropped)

	got := get(t, ctx, s, rec)
	require.Equal(t, cheetah.StatusCompleted, got.Status)
	require.NotNil(t, got.DispatchedAt)
	require.NotNil(t, got.FinishedAt)
	require.Len(t, got.Messages, 2)
	require.Equal(t, cheetah.KindProgress, got.Messages[0].Kind)
	require.EqualValues(t, 1, got.Messages[0].Seq)
	require.Equal(t, cheetah.KindResult, got.Messages[1].Kind)
	require.EqualValues(t, 2, got.Messages[1].Seq)
	_, err := s.Get(ctx, lost.UserID, lost.CommandID)
	require.ErrorIs(t, err, cheetah.ErrNotFound)

	// Writes go on as before, numbered after the recovered messages.
	require.NoError(t, s.Write(ctx, progress(rec.CommandID, 2)))
	require.Len(t, get(t, ctx, s, rec).Messages, 3)
}

// testHealthProbe: with nothing held, the writer's own probe notices that the
// database answers again; nobody has to write for Health to clear.
func testHealthProbe(t *testing.T, ctx context.Context, s *history.Store) {
	restore := Outage(t, s)
	require.ErrorIs(t, s.Write(ctx, history.InsertCommand{Rec: newCommand("usr_1111", "task-1")}), cheetah.ErrStoreUnavailable)
	require.ErrorIs(t, s.Health(), cheetah.ErrStoreUnavailable)
	require.Zero(t, s.Stats().Held, "a Write is not held")
	restore()
	waitHealthy(t, s)
	insert(t, ctx, s, newCommand("usr_1111", "task-1"))
}

// testOutageUnderLoad: many writers append numbered messages to commands of
// their own while the database goes away and comes back. Afterwards every
// message is there, numbered in the order each writer enqueued it: what was
// held kept its place before everything enqueued after it.
func testOutageUnderLoad(t *testing.T, ctx context.Context, s *history.Store) {
	const writers, perWriter = 16, 60
	recs := make([]cheetah.CommandRecord, writers)
	for i := range recs {
		recs[i] = newCommand("usr_1111", "task-1")
	}
	insert(t, ctx, s, recs...)

	var ok, failed atomic.Int64
	third := make(chan struct{})      // a third of the writes committed
	begun := make(chan struct{})      // the outage has begun
	someFailed := make(chan struct{}) // writes failed during the outage
	var thirdOnce, failedOnce sync.Once
	var wg sync.WaitGroup
	for _, rec := range recs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var pending sync.WaitGroup
			for i := range perWriter {
				pending.Add(1)
				s.WriteAsync(func(err error) {
					defer pending.Done()
					if err == nil {
						if ok.Add(1) >= writers*perWriter/3 {
							thirdOnce.Do(func() { close(third) })
						}
						return
					}
					if failed.Add(1) >= writers {
						failedOnce.Do(func() { close(someFailed) })
					}
				}, progress(rec.CommandID, i))
				if i == perWriter/2 {
					// Half way, each writer waits for the outage to have
					// begun, so that writes land on both sides of it.
					pending.Wait()
					<-begun
				}
			}
			pending.Wait()
		}()
	}
	<-third
	restore := Outage(t, s)
	close(begun)
	select {
	case <-someFailed:
	case <-time.After(time.Minute):
		t.Fatal("no write failed during the outage")
	}
	restore()
	wg.Wait()
	waitHealthy(t, s)
	st := s.Stats()
	t.Logf("committed at once %d, failed and held %d, recovered %d", ok.Load(), failed.Load(), st.Recovered)
	require.Zero(t, st.Held)
	require.Zero(t, st.Dropped)
	require.Positive(t, failed.Load())
	for _, rec := range recs {
		requireSeqInOrder(t, get(t, ctx, s, rec).Messages, perWriter)
	}
}

// testHealthHolds: once the store knows the database is away (here from a
// readiness query), Health stays failed, whatever is written meanwhile,
// until the database answers again: the broker refuses acquires on it, so
// a moment of "healthy" would hand out a lease no send could use.
func testHealthHolds(t *testing.T, ctx context.Context, s *history.Store) {
	rec := newCommand("usr_1111", "task-1")
	insert(t, ctx, s, rec)
	restore := Outage(t, s)
	// On SQLite a query still answers while another connection holds the
	// write lock; a Write tells the store instead.
	if s.Ping(ctx) == nil {
		require.ErrorIs(t, s.Write(ctx), cheetah.ErrStoreUnavailable)
	}
	require.ErrorIs(t, s.Health(), cheetah.ErrStoreUnavailable)
	stop := make(chan struct{})
	healthy := make(chan int, 1)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				healthy <- n
				return
			default:
			}
			if s.Health() == nil {
				n++
			}
		}
	}()
	const writes = 8
	for i := range writes {
		require.ErrorIs(t, s.Write(ctx, history.InsertCommand{Rec: newCommand("usr_1111", "task-1")}), cheetah.ErrStoreUnavailable)
		s.WriteAsync(nil, progress(rec.CommandID, i))
	}
	close(stop)
	require.Zero(t, <-healthy, "Health said healthy while the database was away")
	restore()
	waitHealthy(t, s)
	// Healthy says the held writes are written, not that the last ones
	// enqueued are: an empty Write waits for everything enqueued before it.
	require.NoError(t, s.Write(ctx))
	requireSeqInOrder(t, get(t, ctx, s, rec).Messages, writes)
}
