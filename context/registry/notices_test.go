package registry_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/protocol"
)

// queueConn is a connection with a small bounded outbound queue, as the
// server's session has, that carries coalesced notices
// (registry.NoticeConn). A reader goroutine drains it as a client that
// reads would, taking each batch of notices only when it comes to it, and
// records what went out on the wire in order. A full queue drops the
// connection, as the session does.
type queueConn struct {
	out     chan any // protocol.Frame or *registry.Notices
	stop    chan struct{}
	done    chan struct{}
	pace    time.Duration // the reader's pause between items
	mu      sync.Mutex
	wire    []protocol.Frame
	dropped bool
	closed  protocol.CloseCode
}

var _ registry.NoticeConn = (*queueConn)(nil)

func newQueueConn(t *testing.T, slots int, pace time.Duration) *queueConn {
	c := &queueConn{out: make(chan any, slots), stop: make(chan struct{}), done: make(chan struct{}), pace: pace}
	go c.read()
	t.Cleanup(func() { close(c.stop); <-c.done })
	return c
}

func (c *queueConn) read() {
	defer close(c.done)
	for {
		var item any
		select {
		case item = <-c.out:
		case <-c.stop:
			return
		}
		if c.pace > 0 {
			time.Sleep(c.pace)
		}
		var frames []protocol.Frame
		switch x := item.(type) {
		case *registry.Notices:
			frames = x.Take()
		case protocol.Frame:
			frames = []protocol.Frame{x}
		}
		c.mu.Lock()
		c.wire = append(c.wire, frames...)
		c.mu.Unlock()
	}
}

func (c *queueConn) enqueue(item any) bool {
	select {
	case c.out <- item:
		return true
	default:
		c.mu.Lock()
		c.dropped = true
		c.mu.Unlock()
		return false
	}
}

func (c *queueConn) Send(f protocol.Frame) bool      { return c.enqueue(f) }
func (c *queueConn) Notify(n *registry.Notices) bool { return c.enqueue(n) }
func (c *queueConn) Close(code protocol.CloseCode, _ string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = code
}

func (c *queueConn) frames() []protocol.Frame {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]protocol.Frame(nil), c.wire...)
}

func (c *queueConn) isDropped() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dropped || c.closed != 0
}

// finalStates is, per context, the last assignment the client was told.
func finalStates(frames []protocol.Frame) map[string]protocol.Assignment {
	last := map[string]protocol.Assignment{}
	for _, f := range frames {
		if a, ok := f.(*protocol.Assignment); ok {
			last[a.ContextID] = *a
		}
	}
	return last
}

// A churn of acquires and releases on a client with 64 contexts, through a
// connection whose queue has 8 slots, never drops the client, and the client
// ends told the registry's own view of every context: the notice frames
// queued for it are bounded by its contexts, not by the churn.
func TestNoticesChurnDoesNotDropAReadingClient(t *testing.T) {
	e := setup(t, func(c *registry.Config) { c.EpochBlock = 1 << 16 })
	conn := newQueueConn(t, 8, 20*time.Microsecond)
	var reps []protocol.ContextReport
	for i := range 64 {
		reps = append(reps, worker(fmt.Sprintf("w%d", i)))
	}
	att := e.reg.Connect(registry.ClientInfo{UserID: user, ClientID: "c1", Type: cheetah.Console, KeyID: "k1"}, conn)
	e.reg.Report(att, reps)

	const pairs, workers = 10_000, 16
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range pairs / workers {
				l, err := e.acquire(fmt.Sprintf("t%d", g))
				if err != nil {
					errs <- err
					return
				}
				if _, err := e.reg.Release(ctx, l); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	// Some leases are left held, so the final state is not all ended.
	held := map[string]cheetah.Lease{}
	for range 10 {
		l := e.mustAcquire("final")
		held[l.ContextID] = l
	}
	require.False(t, conn.isDropped(), "a client that reads was dropped")

	require.Eventually(t, func() bool {
		last := finalStates(conn.frames())
		for i := range 64 {
			id := fmt.Sprintf("w%d", i)
			a, ok := last[id]
			if l, isHeld := held[id]; isHeld {
				if !ok || a.State != protocol.AssignmentAssigned || a.Epoch != l.Epoch || a.TaskID != "final" {
					return false
				}
			} else if ok && a.State == protocol.AssignmentAssigned {
				return false
			}
		}
		return true
	}, 10*time.Second, 5*time.Millisecond, "the client's final view differs from the registry's")

	// Checked against the registry's view, not just the test's.
	view, err := e.reg.TaskContexts(ctx, user, "final")
	require.NoError(t, err)
	require.Len(t, view, len(held))
	last := finalStates(conn.frames())
	for _, l := range view {
		require.Equal(t, l.Epoch, last[l.ContextID].Epoch)
	}
	idle, err := e.reg.ListAvailable(ctx, user, cheetah.Console)
	require.NoError(t, err)
	require.Len(t, idle, 64-len(held))
	for _, s := range idle {
		if a, ok := last[s.ContextID]; ok {
			require.NotEqual(t, protocol.AssignmentAssigned, a.State, s.ContextID)
		}
	}
	// What the client read is a view it could have had from every change:
	// leases alternate per context, epochs rise.
	k := newChecker()
	for _, f := range conn.frames() {
		k.see(f)
	}
	require.Empty(t, k.errs)
	// Far fewer frames than changes went out: they were coalesced.
	t.Logf("%d assignment frames for %d changes", len(conn.frames()), 2*pairs+len(held))
	require.False(t, conn.isDropped())

	for _, l := range held {
		_, err := e.reg.Release(ctx, l)
		require.NoError(t, err)
	}
	require.Zero(t, e.reg.Stats().Leases)
}

// Whatever the coalescing, a command for epoch E reaches the client after
// the assignment of E, and after no later news of its context: the last
// assignment frame the client read for that context before the command is
// exactly "assigned E".
func TestNoticesPrecedeTheirCommands(t *testing.T) {
	e := setup(t, func(c *registry.Config) { c.EpochBlock = 1 << 16 })
	// A reader slow enough that batches stay open while commands queue.
	conn := newQueueConn(t, 4096, 50*time.Microsecond)
	var reps []protocol.ContextReport
	for i := range 8 {
		reps = append(reps, worker(fmt.Sprintf("w%d", i)))
	}
	att := e.reg.Connect(registry.ClientInfo{UserID: user, ClientID: "c1", Type: cheetah.Console, KeyID: "k1"}, conn)
	e.reg.Report(att, reps)

	ctx := context.Background()
	var wg sync.WaitGroup
	var sent sync.Map
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 150 {
				l, err := e.acquire(fmt.Sprintf("t%d", g))
				if err != nil {
					t.Error(err)
					return
				}
				if i%3 != 0 {
					id, err := e.reg.Send(ctx, l, cheetah.Command{Name: "x"}, cheetah.SendOptions{ResponseMode: cheetah.ModeNone})
					if err != nil {
						t.Error(err)
						return
					}
					sent.Store(id, true)
				}
				if _, err := e.reg.Release(ctx, l); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	n := 0
	sent.Range(func(any, any) bool { n++; return true })
	require.Eventually(t, func() bool {
		cmds := 0
		for _, f := range conn.frames() {
			if _, ok := f.(*protocol.Command); ok {
				cmds++
			}
		}
		return cmds == n
	}, 10*time.Second, 5*time.Millisecond)
	require.False(t, conn.isDropped())

	k := newChecker()
	last := map[string]protocol.Assignment{}
	for _, f := range conn.frames() {
		k.see(f)
		switch f := f.(type) {
		case *protocol.Assignment:
			if prev, ok := last[f.ContextID]; ok {
				require.GreaterOrEqual(t, f.Epoch, prev.Epoch, "%s: news of epoch %d after epoch %d", f.ContextID, f.Epoch, prev.Epoch)
			}
			last[f.ContextID] = *f
		case *protocol.Command:
			a, ok := last[f.ContextID]
			require.True(t, ok, "%s: command of epoch %d before any assignment", f.ContextID, f.Epoch)
			require.Equal(t, protocol.AssignmentAssigned, a.State, "%s: command of epoch %d after %s of epoch %d", f.ContextID, f.Epoch, a.State, a.Epoch)
			require.Equal(t, a.Epoch, f.Epoch, "%s: command of epoch %d after the assignment of epoch %d", f.ContextID, f.Epoch, a.Epoch)
		}
	}
	require.Empty(t, k.errs)
	require.Eventually(t, func() bool { return e.reg.Stats().Commands == 0 }, 10*time.Second, 5*time.Millisecond)
	require.Zero(t, e.reg.Stats().Leases)
}

// An acquire and its release into an open batch of notices allocate little,
// and nothing under the registry's lock: the token, the lease and the
// acquire's metric attributes, all made off the lock (3; one more under the
// race detector). The idle list, the notice, the memory of ended leases and
// the event queue allocate nothing per pair once warm.
func TestAcquireReleaseAllocs(t *testing.T) {
	e := setup(t, func(c *registry.Config) { c.EpochBlock = 1 << 20 })
	conn := &heldConn{}
	att := e.reg.Connect(registry.ClientInfo{UserID: user, ClientID: "c1", Type: cheetah.Console, KeyID: "k1"}, conn)
	e.reg.Report(att, []protocol.ContextReport{worker("w1"), worker("w2")})
	ctx := context.Background()
	req := cheetah.AcquireRequest{UserID: user, TaskID: "t", ClientType: cheetah.Console}
	allocs := testing.AllocsPerRun(1000, func() {
		l, err := e.reg.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.reg.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("%.1f allocations per acquire+release pair", allocs)
	require.LessOrEqual(t, allocs, float64(4))
}

// heldConn keeps every batch of notices open: nothing is ever written.
type heldConn struct{}

func (heldConn) Send(protocol.Frame) bool         { return true }
func (heldConn) Notify(*registry.Notices) bool    { return true }
func (heldConn) Close(protocol.CloseCode, string) {}
