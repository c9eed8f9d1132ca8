package registry_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/protocol"
)

// effects is what the test clients declare: extract observes, everything
// else (navigate, and any name they do not declare) mutates.
var effects = map[string]string{"extract": protocol.EffectObserve, "navigate": protocol.EffectMutate}

// connectFx connects a console client that declares effects.
func (e *env) connectFx(clientID string, contexts ...protocol.ContextReport) *client {
	c := &client{conn: newFakeConn(), id: clientID}
	c.att = e.reg.Connect(registry.ClientInfo{UserID: user, ClientID: clientID, Type: cheetah.Console, KeyID: "k1", Effects: effects}, c.conn)
	e.reg.Report(c.att, contexts)
	return c
}

// holdState waits for the n-th hold_state frame (1-based) on c.
func holdState(t *testing.T, c *client, n int) protocol.HoldState {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		seen := 0
		for _, f := range c.conn.all() {
			if h, ok := f.(*protocol.HoldStateFrame); ok {
				if seen++; seen == n {
					return h.State
				}
			}
		}
		select {
		case <-c.conn.notify:
		case <-deadline:
			t.Fatalf("hold_state %d never arrived; got %v", n, c.conn.all())
		}
	}
}

// holdStates counts the hold_state frames c got so far.
func holdStates(c *client) int {
	n := 0
	for _, f := range c.conn.all() {
		if _, ok := f.(*protocol.HoldStateFrame); ok {
			n++
		}
	}
	return n
}

func requireHeld(t *testing.T, err error, state string) {
	t.Helper()
	var he *cheetah.HeldError
	require.ErrorAs(t, err, &he)
	require.ErrorIs(t, err, cheetah.ErrHeld)
	require.Equal(t, state, he.Hold.State)
	require.False(t, he.Hold.Since.IsZero())
	code, _, _ := cheetah.Classify(err)
	require.Equal(t, cheetah.CodeHeld, code)
	require.Equal(t, state, cheetah.Details(err)["state"])
}

func send(e *env, l cheetah.Lease, name string) (cheetah.Sent, error) {
	return e.reg.Send(context.Background(), l, cheetah.Command{Name: name}, cheetah.SendOptions{})
}

// The ADR's first cases: a pending hold fences new mutations at once,
// lets observations through, and turns active only once the mutations
// admitted before it ended.
func TestHoldDrainsAdmittedMutations(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.connectFx("a", worker("w1"))
	l := e.mustAcquire("t")

	_, err := send(e, l, "navigate")
	require.NoError(t, err)
	nav := cmdFrame(t, c, 1)
	_, err = send(e, l, "click") // undeclared: a mutation
	require.NoError(t, err)
	click := cmdFrame(t, c, 2)

	require.Equal(t, protocol.HoldPending, e.reg.Hold(c.att, "w1", 0))
	require.Equal(t, protocol.HoldPending, holdState(t, c, 1))

	_, err = send(e, l, "navigate")
	requireHeld(t, err, cheetah.HoldPending)
	_, err = send(e, l, "click")
	requireHeld(t, err, cheetah.HoldPending)
	_, err = send(e, l, "extract")
	require.NoError(t, err, "an observation passes a pending hold")
	ext := cmdFrame(t, c, 3)
	require.Equal(t, "extract", ext.Name)
	e.result(c, ext.CommandID, `{}`)

	rl, err := e.reg.Renew(context.Background(), l, 0)
	require.NoError(t, err)
	require.Equal(t, &cheetah.HoldInfo{State: cheetah.HoldPending, Since: rl.Held.Since}, rl.Held)

	e.result(c, nav.CommandID, `{}`)
	require.Equal(t, 1, holdStates(c), "one mutation still runs: still pending")
	e.result(c, click.CommandID, `{}`)
	require.Equal(t, protocol.HoldActive, holdState(t, c, 2))

	_, err = send(e, l, "navigate")
	requireHeld(t, err, cheetah.HoldActive)
	tc, err := e.reg.TaskContexts(context.Background(), user, "t")
	require.NoError(t, err)
	require.Equal(t, cheetah.HoldActive, tc[0].Held.State, "lease views show the hold")

	e.reg.Unhold(c.att, "w1")
	require.Equal(t, protocol.HoldEnded, holdState(t, c, 3))
	_, err = send(e, l, "navigate")
	require.NoError(t, err, "given back: mutations pass again")
	rl, err = e.reg.Renew(context.Background(), l, 0)
	require.NoError(t, err)
	require.Nil(t, rl.Held)
}

// A hold on a context with nothing in flight is active at once.
func TestHoldActiveAtOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.connectFx("a", worker("w1"))
	require.Equal(t, protocol.HoldActive, e.reg.Hold(c.att, "w1", 0))
	require.Equal(t, protocol.HoldActive, holdState(t, c, 1))
	// An unknown context has no hold.
	require.Equal(t, protocol.HoldEnded, e.reg.Hold(c.att, "nope", 0))
	e.reg.Unhold(c.att, "w1")
	require.Equal(t, protocol.HoldEnded, holdState(t, c, 3))
}

// Ending a pending hold (unhold) does not cancel the mutations it was
// draining: they run to their end.
func TestUnholdWhileDrainingKeepsMutations(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.connectFx("a", worker("w1"))
	l := e.mustAcquire("t")
	done := make(chan cheetah.Resolution, 1)
	go func() {
		res, _ := e.reg.SendAndWait(context.Background(), l, cheetah.Command{Name: "navigate"}, cheetah.SendOptions{})
		done <- res
	}()
	nav := cmdFrame(t, c, 1)
	require.Equal(t, protocol.HoldPending, e.reg.Hold(c.att, "w1", 0))
	e.reg.Unhold(c.att, "w1")
	require.Equal(t, protocol.HoldEnded, holdState(t, c, 2))
	for _, f := range c.conn.all() {
		_, isCancel := f.(*protocol.Cancel)
		require.False(t, isCancel, "the drained mutation is not cancelled")
	}
	e.result(c, nav.CommandID, `{"ok":1}`)
	require.Equal(t, cheetah.StatusCompleted, (<-done).Status)
	require.Equal(t, 2, holdStates(c), "an ended hold does not turn active")
}

// A client that drops while its hold drains removes only that hold: the
// other client's hold stays, and the dropped client's lease survives the
// grace with its whole TTL from the drop.
func TestHoldDropWhileDraining(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a := e.connectFx("a", worker("w1"))
	b := e.connectFx("b", worker("w2"))
	la := e.mustAcquire("t", func(r *cheetah.AcquireRequest) { r.ClientID = "a"; r.TTL = 20 * time.Second })
	_, err := send(e, la, "navigate")
	require.NoError(t, err)
	cmdFrame(t, a, 1)
	require.Equal(t, protocol.HoldPending, e.reg.Hold(a.att, "w1", 0))
	require.Equal(t, protocol.HoldActive, e.reg.Hold(b.att, "w2", 0))

	e.clock.Advance(time.Minute) // held: the lease outlives its TTL
	e.reg.ExpireDue()
	e.reg.Disconnect(a.att)
	require.Equal(t, protocol.HoldEnded, holdState(t, a, 2))
	_, err = e.acquire("u", func(r *cheetah.AcquireRequest) { r.ClientID = "b" })
	require.Equal(t, cheetah.ReasonNoIdleWorker, noContextReason(t, err), "b's hold stays")

	// a's lease, preserved by the hold, got its TTL again from the drop.
	a2 := &client{conn: newFakeConn(), id: "a"}
	a2.att = e.reg.Connect(registry.ClientInfo{UserID: user, ClientID: "a", Type: cheetah.Console, KeyID: "k1", Effects: effects}, a2.conn)
	e.reg.Report(a2.att, []protocol.ContextReport{worker("w1")})
	e.clock.Advance(19 * time.Second)
	e.reg.ExpireDue()
	rl, err := e.reg.Renew(context.Background(), la, 0)
	require.NoError(t, err, "alive 19 s after the hold ended with its connection")
	require.Nil(t, rl.Held)
	e.reg.Unhold(b.att, "w2")
	require.Equal(t, protocol.HoldEnded, holdState(t, b, 2))
}

// A held lease never expires, and gets its whole TTL again from the hold's
// end, whichever way it ends.
func TestHoldPreservesLease(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"unhold", "ttl", "disconnect"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			c := e.connectFx("a", worker("w1"))
			l := e.mustAcquire("t", func(r *cheetah.AcquireRequest) { r.TTL = 10 * time.Second })
			require.Equal(t, protocol.HoldActive, e.reg.Hold(c.att, "w1", 100*time.Second))
			e.clock.Advance(30 * time.Second)
			e.reg.ExpireDue()
			_, err := e.reg.Renew(context.Background(), l, 0)
			require.NoError(t, err, "a held lease past its TTL is alive")
			e.clock.Advance(30 * time.Second)
			e.reg.ExpireDue()
			switch end {
			case "unhold":
				e.reg.Unhold(c.att, "w1")
			case "ttl":
				e.clock.Advance(40 * time.Second) // the hold's TTL runs out
			case "disconnect":
				e.reg.Disconnect(c.att)
			}
			require.Equal(t, protocol.HoldEnded, holdState(t, c, 2))
			ended := e.clock.Now()
			tc, err := e.reg.TaskContexts(context.Background(), user, "t")
			require.NoError(t, err)
			require.Len(t, tc, 1)
			require.Equal(t, ended.Add(10*time.Second), tc[0].ExpiresAt, "the TTL runs from the hold's end")
			require.Nil(t, tc[0].Held)
			e.clock.Advance(9 * time.Second)
			e.reg.ExpireDue()
			require.Equal(t, 1, e.reg.Stats().Leases)
			e.clock.Advance(2 * time.Second)
			e.reg.ExpireDue()
			require.Zero(t, e.reg.Stats().Leases, "expired a TTL after the hold ended")
			require.Zero(t, e.reg.Stats().Preserving)
		})
	}
}

// A slow mutation keeps its lease, held or not.
func TestHoldSlowMutationKeepsLease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.connectFx("a", worker("w1"))
	l := e.mustAcquire("t", func(r *cheetah.AcquireRequest) { r.TTL = 5 * time.Second })
	done := make(chan cheetah.Resolution, 1)
	go func() {
		res, _ := e.reg.SendAndWait(context.Background(), l, cheetah.Command{Name: "navigate"},
			cheetah.SendOptions{Timeout: time.Minute})
		done <- res
	}()
	nav := cmdFrame(t, c, 1)
	require.Equal(t, protocol.HoldPending, e.reg.Hold(c.att, "w1", 0))
	e.clock.Advance(20 * time.Second)
	e.reg.ExpireDue()
	e.result(c, nav.CommandID, `{}`)
	require.Equal(t, cheetah.StatusCompleted, (<-done).Status)
	require.Equal(t, protocol.HoldActive, holdState(t, c, 2))
	e.clock.Advance(20 * time.Second)
	e.reg.ExpireDue()
	_, err := e.reg.Renew(context.Background(), l, 0)
	require.NoError(t, err, "the mutation, then the hold, kept the lease")
	e.reg.Unhold(c.att, "w1")
}

// A hold on an idle context keeps it out of selection until it ends; a
// waiting acquire gets it then.
func TestHoldIdleOutOfSelection(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.connectFx("a", worker("w1"))
	require.Equal(t, protocol.HoldActive, e.reg.Hold(c.att, "w1", 0))
	_, err := e.acquire("t")
	require.Equal(t, cheetah.ReasonNoIdleWorker, noContextReason(t, err))
	snaps, err := e.reg.ListAvailable(context.Background(), user, "")
	require.NoError(t, err)
	require.Empty(t, snaps)
	got := make(chan cheetah.Lease, 1)
	go func() {
		l, _ := e.acquire("t", func(r *cheetah.AcquireRequest) { r.Wait = time.Minute })
		got <- l
	}()
	require.Eventually(t, func() bool { return e.reg.Stats().Waiters == 1 }, 10*time.Second, time.Millisecond)
	e.reg.Unhold(c.att, "w1")
	require.Equal(t, "w1", (<-got).ContextID)
}

// Two holds on one context are one hold: the second keeps its state and
// since and restarts its TTL; one unhold ends it. A replaced connection
// cannot end the hold its successor made.
func TestTwoHoldsOnOneContext(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.connectFx("a", worker("w1"))
	l := e.mustAcquire("t")
	require.Equal(t, protocol.HoldActive, e.reg.Hold(c.att, "w1", 10*time.Second))
	rl, err := e.reg.Renew(context.Background(), l, 0)
	require.NoError(t, err)
	since := rl.Held.Since
	e.clock.Advance(8 * time.Second)
	require.Equal(t, protocol.HoldActive, e.reg.Hold(c.att, "w1", 10*time.Second))
	e.clock.Advance(8 * time.Second) // 16 s after the first: the TTL restarted
	rl, err = e.reg.Renew(context.Background(), l, 0)
	require.NoError(t, err)
	require.Equal(t, since, rl.Held.Since)
	require.Equal(t, 1, e.reg.Stats().Preserving, "one hold preserves once")

	// The client reconnects: the old connection's hold ended with it, the
	// new one holds again, and the old one can no longer unhold.
	old := c.att
	c2 := &client{conn: newFakeConn(), id: "a"}
	c2.att = e.reg.Connect(registry.ClientInfo{UserID: user, ClientID: "a", Type: cheetah.Console, KeyID: "k1", Effects: effects}, c2.conn)
	e.reg.Report(c2.att, []protocol.ContextReport{worker("w1")})
	require.Equal(t, protocol.HoldEnded, holdState(t, c, 3))
	require.Equal(t, protocol.HoldActive, e.reg.Hold(c2.att, "w1", 0))
	e.reg.Unhold(old, "w1")
	_, err = send(e, l, "navigate")
	requireHeld(t, err, cheetah.HoldActive)
	e.reg.Unhold(c2.att, "w1")
	require.Equal(t, protocol.HoldEnded, holdState(t, c2, 2))
	require.Zero(t, e.reg.Stats().Preserving)
}

// Many senders, observations and mutations, against a person who holds
// and gives back over and over. Invariants: between a hold's report and
// its end no mutation frame reaches the client; when a hold turns active
// no mutation is in flight; every refused send was a mutation refused held;
// nothing is left over at the end.
func TestHoldStress(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.connectFx("a", worker("w1"))
	l := e.mustAcquire("t", func(r *cheetah.AcquireRequest) { r.TTL = time.Hour })

	// The client answers every command, and checks the invariants on the
	// frames in the order the registry sent them.
	stop := make(chan struct{})
	var clientWG sync.WaitGroup
	var violations atomic.Int64
	clientWG.Add(1)
	go func() {
		defer clientWG.Done()
		// answered is how many frames the registry had sent when the last
		// mutation read so far was answered: a hold that turned active
		// before that (its frame's index is lower) did not wait for it.
		held, answered, next := false, 0, 0
		for {
			frames := c.conn.all()
			for ; next < len(frames); next++ {
				switch f := frames[next].(type) {
				case *protocol.Command:
					mut := f.Name != "extract"
					if mut && held {
						violations.Add(1)
					}
					if mut {
						answered = len(c.conn.all())
					}
					e.result(c, f.CommandID, `{}`)
				case *protocol.HoldStateFrame:
					switch f.State {
					case protocol.HoldPending:
						held = true
					case protocol.HoldActive:
						held = true
						if answered > next {
							violations.Add(1)
						}
					case protocol.HoldEnded:
						held = false
					}
				}
			}
			select {
			case <-c.conn.notify:
			case <-stop:
				return
			}
		}
	}()

	var wg sync.WaitGroup
	var sent, refused atomic.Int64
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				name := "navigate"
				if (g+i)%3 == 0 {
					name = "extract"
				}
				_, err := send(e, l, name)
				switch {
				case err == nil:
					sent.Add(1)
				case name == "extract":
					violations.Add(1)
				default:
					var he *cheetah.HeldError
					if !errorsAs(err, &he) {
						panic(fmt.Sprintf("unexpected error %v", err))
					}
					refused.Add(1)
				}
			}
		}()
	}
	// The person holds and gives back for as long as the senders send.
	sendersDone := make(chan struct{})
	holderDone := make(chan struct{})
	var cycles int
	go func() {
		defer close(holderDone)
		for {
			select {
			case <-sendersDone:
				if cycles >= 30 {
					return
				}
			default:
			}
			e.reg.Hold(c.att, "w1", 0)
			runtime.Gosched()
			e.reg.Unhold(c.att, "w1")
			cycles++
		}
	}()
	wg.Wait()
	close(sendersDone)
	<-holderDone
	require.Eventually(t, func() bool { return e.reg.Stats().Commands == 0 }, 10*time.Second, time.Millisecond)
	close(stop)
	clientWG.Wait()
	require.Zero(t, violations.Load())
	require.Positive(t, sent.Load())
	require.Positive(t, refused.Load(), "the holds overlapped the sends")
	_, err := e.reg.Release(context.Background(), l)
	require.NoError(t, err)
	e.reg.Disconnect(c.att)
	e.clock.Advance(time.Minute) // past the reconnect grace
	require.Eventually(t, func() bool { return e.reg.Stats().Clients == 0 }, 10*time.Second, time.Millisecond)
	requireZero(t, e.reg)
}

func errorsAs(err error, target any) bool { return errors.As(err, target) }
