package registry_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/protocol"
)

// eventLog collects the events a subscriber sees.
type eventLog struct {
	mu     sync.Mutex
	events []registry.Event
	notify chan struct{}
}

func subscribe(t *testing.T, reg *registry.Registry, also func(registry.Event)) *eventLog {
	l := &eventLog{notify: make(chan struct{}, 1)}
	cancel := reg.Subscribe(func(ev registry.Event) {
		if also != nil {
			also(ev)
		}
		l.mu.Lock()
		l.events = append(l.events, ev)
		l.mu.Unlock()
		select {
		case l.notify <- struct{}{}:
		default:
		}
	})
	t.Cleanup(cancel)
	return l
}

// waitFor waits until an event matching ok was seen and returns every event
// seen so far.
func (l *eventLog) waitFor(t *testing.T, ok func(registry.Event) bool) []registry.Event {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		l.mu.Lock()
		evs := append([]registry.Event(nil), l.events...)
		l.mu.Unlock()
		for _, ev := range evs {
			if ok(ev) {
				return evs
			}
		}
		select {
		case <-l.notify:
		case <-deadline:
			t.Fatalf("no such event; got %+v", evs)
		}
	}
}

func kindIs(k registry.EventKind) func(registry.Event) bool {
	return func(ev registry.Event) bool { return ev.Kind == k }
}

// One stream of events, one per transition, in the order the registry
// decided them; a command's end is announced once it is durable.
func TestEventStream(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	// The subscriber reads history when it hears of an end: it is there.
	var readErr, admittedErr error
	var readStatus cheetah.Status
	log := subscribe(t, e.reg, func(ev registry.Event) {
		switch ev.Kind {
		case registry.CommandAdmitted:
			_, admittedErr = e.store.Get(ctx, user, ev.CommandID)
		case registry.CommandEnded:
			rec, err := e.store.Get(ctx, user, ev.CommandID)
			readErr, readStatus = err, rec.Status
		}
	})
	c := e.connect("a", cheetah.Console, nil, worker("w1"))
	l := e.mustAcquire("t")
	done := make(chan cheetah.Resolution, 1)
	go func() {
		res, err := e.reg.SendAndWait(ctx, l, cheetah.Command{Name: "echo"}, cheetah.SendOptions{CallbackURL: "https://example.com/hook"})
		require.NoError(t, err)
		done <- res
	}()
	f := cmdFrame(t, c, 1)
	e.reg.ClientMessage(ctx, c.att, &protocol.Error{CommandID: f.CommandID, Code: "boom", Message: "it broke"})
	res := <-done
	require.Equal(t, cheetah.StatusFailed, res.Status)
	_, err := e.reg.Renew(ctx, l, 0)
	require.NoError(t, err)
	ok, err := e.reg.Release(ctx, l)
	require.NoError(t, err)
	require.True(t, ok)
	e.reg.Disconnect(c.att)
	e.clock.Advance(time.Minute) // past the reconnect grace
	evs := log.waitFor(t, kindIs(registry.ClientGone))

	var kinds []registry.EventKind
	for i, ev := range evs {
		kinds = append(kinds, ev.Kind)
		require.Equal(t, uint64(i+1), ev.Seq, "events are numbered without gaps")
		require.Equal(t, user, ev.UserID)
		require.Equal(t, "a", ev.ClientID)
	}
	require.Equal(t, []registry.EventKind{
		registry.ClientConnected,
		registry.LeaseAcquired,
		registry.CommandAdmitted, registry.CommandDispatched, registry.CommandEnded,
		registry.LeaseRenewed,
		registry.LeaseEnded,
		registry.ClientDisconnected,
		registry.ClientGone,
	}, kinds)
	acq, ended, leaseEnd := evs[1], evs[4], evs[6]
	require.Equal(t, l.Epoch, acq.Epoch)
	require.Equal(t, "w1", acq.ContextID)
	require.Equal(t, "t", acq.TaskID)
	require.Equal(t, f.CommandID, ended.CommandID)
	require.Equal(t, "echo", ended.CommandName)
	require.Equal(t, l.Epoch, ended.Epoch)
	require.Equal(t, cheetah.StatusFailed, ended.Status)
	require.Equal(t, "boom", ended.Error.Code)
	require.Equal(t, cheetah.KindError, ended.Terminal)
	require.True(t, ended.HasCallback)
	require.True(t, ended.Durable)
	require.NoError(t, admittedErr, "a command is announced once its record is durable")
	require.NoError(t, readErr)
	require.Equal(t, cheetah.StatusFailed, readStatus, "the end is durable when it is announced")
	require.Equal(t, cheetah.LostReleased, leaseEnd.Reason)
}

// Events keep the order in which the registry decided the transitions,
// whichever goroutines decided them.
func TestEventsOrderedAcrossGoroutines(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *registry.Config) { c.EpochBlock = 1024 })
	log := subscribe(t, e.reg, nil)
	var reps []protocol.ContextReport
	for _, id := range []string{"w1", "w2", "w3", "w4"} {
		reps = append(reps, worker(id))
	}
	e.connect("a", cheetah.Console, nil, reps...)
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 25 {
				l, err := e.acquire("t")
				if err != nil {
					continue
				}
				_, _ = e.reg.Renew(ctx, l, 0)
				_, _ = e.reg.Release(ctx, l)
			}
		}()
	}
	wg.Wait()
	// A marker: a client that comes and goes.
	e.reg.Disconnect(e.reg.Connect(registry.ClientInfo{UserID: user, ClientID: "marker", Type: cheetah.Console}, newFakeConn()))
	evs := log.waitFor(t, kindIs(registry.ClientGone))
	// Per context, acquired and ended alternate with rising epochs.
	held := map[string]int64{}
	for i, ev := range evs {
		require.Equal(t, uint64(i+1), ev.Seq)
		switch ev.Kind {
		case registry.LeaseAcquired:
			require.Zero(t, held[ev.ContextID], "%s acquired while held", ev.ContextID)
			held[ev.ContextID] = ev.Epoch
		case registry.LeaseRenewed:
			require.Equal(t, held[ev.ContextID], ev.Epoch, "renewed a lease that is not held")
		case registry.LeaseEnded:
			require.Equal(t, held[ev.ContextID], ev.Epoch)
			held[ev.ContextID] = 0
		}
	}
	for ctxID, h := range held {
		require.Zero(t, h, "%s still held", ctxID)
	}
}

// A cancelled subscription hears nothing more; the others go on.
func TestSubscribeCancel(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var mu sync.Mutex
	var heard []registry.EventKind
	cancel := e.reg.Subscribe(func(ev registry.Event) {
		mu.Lock()
		heard = append(heard, ev.Kind)
		mu.Unlock()
	})
	other := subscribe(t, e.reg, nil)
	c := e.connect("a", cheetah.Console, nil, worker("w1"))
	other.waitFor(t, kindIs(registry.ClientConnected))
	cancel()
	e.reg.Disconnect(c.att)
	other.waitFor(t, kindIs(registry.ClientDisconnected))
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []registry.EventKind{registry.ClientConnected}, heard)
}
