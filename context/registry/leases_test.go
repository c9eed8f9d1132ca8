package registry_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/protocol"
)

func TestAcquireReasons(t *testing.T) {
	t.Parallel()
	e := setup(t)

	_, err := e.acquire("t1")
	require.Equal(t, cheetah.ReasonNoEligibleClient, noContextReason(t, err))

	c := e.connect("agent-1", cheetah.Console, map[string]string{"region": "eu"}, human("h1"))
	_, err = e.acquire("t1")
	require.Equal(t, cheetah.ReasonNoIdleWorker, noContextReason(t, err), "a human context is never assigned")

	e.reg.Report(c.att, []protocol.ContextReport{human("h1"), worker("w1")})
	_, err = e.acquire("t1", func(r *cheetah.AcquireRequest) { r.ClientID = "agent-2" })
	require.Equal(t, cheetah.ReasonPlacementMiss, noContextReason(t, err))
	_, err = e.acquire("t1", func(r *cheetah.AcquireRequest) { r.Labels = map[string]string{"region": "us"} })
	require.Equal(t, cheetah.ReasonPlacementMiss, noContextReason(t, err))

	l := e.mustAcquire("t1", func(r *cheetah.AcquireRequest) { r.Labels = map[string]string{"region": "eu"} })
	require.Equal(t, "w1", l.ContextID)
	require.Len(t, l.LeaseToken, 32, "128-bit token, hex")
	_, err = e.acquire("t2")
	require.Equal(t, cheetah.ReasonNoIdleWorker, noContextReason(t, err))

	_, err = e.acquire("t3", func(r *cheetah.AcquireRequest) { r.ClientType = cheetah.Browser })
	require.Equal(t, cheetah.ReasonNoEligibleClient, noContextReason(t, err))
}

func TestAcquireValidation(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.connect("agent-1", cheetah.Console, nil, worker("w1"))
	for name, mod := range map[string]func(*cheetah.AcquireRequest){
		"bad user":        func(r *cheetah.AcquireRequest) { r.UserID = "bad user" },
		"empty task":      func(r *cheetah.AcquireRequest) { r.TaskID = "" },
		"long task":       func(r *cheetah.AcquireRequest) { r.TaskID = string(make([]byte, 257)) },
		"bad type":        func(r *cheetah.AcquireRequest) { r.ClientType = "robot" },
		"ttl under":       func(r *cheetah.AcquireRequest) { r.TTL = 500 * time.Millisecond },
		"ttl over":        func(r *cheetah.AcquireRequest) { r.TTL = time.Hour + time.Second },
		"wait over":       func(r *cheetah.AcquireRequest) { r.Wait = time.Minute + time.Millisecond },
		"wait negative":   func(r *cheetah.AcquireRequest) { r.Wait = -time.Millisecond },
		"bad client id":   func(r *cheetah.AcquireRequest) { r.ClientID = "-x" },
		"too many labels": func(r *cheetah.AcquireRequest) { r.Labels = manyLabels(33) },
		"NUL in task":     func(r *cheetah.AcquireRequest) { r.TaskID = "t\x00" },
		"bad UTF-8 task":  func(r *cheetah.AcquireRequest) { r.TaskID = "t\xff" },
		"NUL in label":    func(r *cheetah.AcquireRequest) { r.Labels = map[string]string{"k": "v\x00"} },
	} {
		_, err := e.acquire("t", mod)
		require.ErrorIs(t, err, cheetah.ErrInvalidRequest, name)
	}
	// The edges themselves are accepted.
	l := e.mustAcquire("t", func(r *cheetah.AcquireRequest) { r.TTL = time.Hour })
	require.Equal(t, 3600, l.TTLSeconds)
	_, err := e.reg.Release(context.Background(), l)
	require.NoError(t, err)
	l = e.mustAcquire("t", func(r *cheetah.AcquireRequest) { r.TTL = time.Second })
	require.Equal(t, 1, l.TTLSeconds)
	_, _ = e.reg.Release(context.Background(), l)
	l = e.mustAcquire("t")
	require.Equal(t, 300, l.TTLSeconds, "default TTL")
	require.Equal(t, e.clock.Now().Add(300*time.Second), l.ExpiresAt)
}

func manyLabels(n int) map[string]string {
	m := map[string]string{}
	for i := range n {
		m[string(rune('a'+i%26))+string(rune('a'+i/26))] = "v"
	}
	return m
}

func TestSelectionLongestIdleFirst(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.connect("agent-1", cheetah.Console, nil, worker("a"))
	e.clock.Advance(time.Second)
	e.reg.Report(c.att, []protocol.ContextReport{worker("a"), worker("b")})
	e.clock.Advance(time.Second)
	e.reg.Report(c.att, []protocol.ContextReport{worker("a"), worker("b"), worker("c")})

	avail, err := e.reg.ListAvailable(context.Background(), user, cheetah.Console)
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b", "c"}, contextIDs(avail))

	la := e.mustAcquire("t")
	require.Equal(t, "a", la.ContextID)
	e.clock.Advance(time.Second)
	_, err = e.reg.Release(context.Background(), la)
	require.NoError(t, err)
	// a is now the most recently idle: b and c come first.
	require.Equal(t, "b", e.mustAcquire("t").ContextID)
	require.Equal(t, "c", e.mustAcquire("t").ContextID)
	require.Equal(t, "a", e.mustAcquire("t").ContextID)
}

func contextIDs(s []cheetah.ContextSnapshot) []string {
	var out []string
	for _, c := range s {
		out = append(out, c.ContextID)
	}
	return out
}

func TestLabelsFallBackToClient(t *testing.T) {
	t.Parallel()
	e := setup(t)
	w := worker("w1")
	w.Labels = map[string]string{"gpu": "no"}
	e.connect("agent-1", cheetah.Console, map[string]string{"region": "eu", "gpu": "yes"}, w)
	_, err := e.acquire("t", func(r *cheetah.AcquireRequest) { r.Labels = map[string]string{"gpu": "yes"} })
	require.Equal(t, cheetah.ReasonPlacementMiss, noContextReason(t, err), "the context's own label wins")
	l := e.mustAcquire("t", func(r *cheetah.AcquireRequest) { r.Labels = map[string]string{"gpu": "no", "region": "eu"} })
	require.Equal(t, "w1", l.ContextID)
}

func TestStaleHandleWithReusedTaskID(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.connect("agent-1", cheetah.Console, nil, worker("w1"))
	old := e.mustAcquire("same-task")
	ok, err := e.reg.Release(context.Background(), old)
	require.NoError(t, err)
	require.True(t, ok)
	cur := e.mustAcquire("same-task")
	require.Equal(t, old.ContextID, cur.ContextID)
	require.Greater(t, cur.Epoch, old.Epoch)

	_, err = e.reg.Send(context.Background(), old, cheetah.Command{Name: "echo"}, cheetah.SendOptions{})
	require.Equal(t, cheetah.LostReassigned, lostReason(t, err))
	_, err = e.reg.Renew(context.Background(), old, 0)
	require.Equal(t, cheetah.LostReassigned, lostReason(t, err))
	ok, err = e.reg.Release(context.Background(), old)
	require.NoError(t, err)
	require.False(t, ok, "a stale release changes nothing")
	leases, err := e.reg.TaskContexts(context.Background(), user, "same-task")
	require.NoError(t, err)
	require.Len(t, leases, 1)
	require.Equal(t, cur.Epoch, leases[0].Epoch)
	require.Empty(t, leases[0].LeaseToken, "views never show a token")
}

func TestLostReasons(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	send := func(e *env, l cheetah.Lease) error {
		_, err := e.reg.Send(ctx, l, cheetah.Command{Name: "echo"}, cheetah.SendOptions{})
		return err
	}
	t.Run("unknown", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		require.Equal(t, cheetah.LostUnknownLease, lostReason(t, send(e, cheetah.Lease{LeaseToken: "nope"})))
	})
	t.Run("released", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		e.connect("a", cheetah.Console, nil, worker("w1"))
		l := e.mustAcquire("t")
		ok, _ := e.reg.Release(ctx, l)
		require.True(t, ok)
		ok, _ = e.reg.Release(ctx, l)
		require.False(t, ok, "release is idempotent")
		require.Equal(t, cheetah.LostReleased, lostReason(t, send(e, l)))
	})
	t.Run("expired", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		c := e.connect("a", cheetah.Console, nil, worker("w1"))
		l := e.mustAcquire("t", func(r *cheetah.AcquireRequest) { r.TTL = 5 * time.Second })
		e.clock.Advance(4 * time.Second)
		e.reg.ExpireDue()
		require.NoError(t, send(e, l), "still valid before its deadline")
		e.clock.Advance(5 * time.Second) // the send renewed it: deadline is now +5s from t=4
		e.reg.ExpireDue()
		require.Equal(t, cheetah.LostExpired, lostReason(t, send(e, l)))
		waitFor(t, c.conn, func(a *protocol.Assignment) bool { return a.State == protocol.AssignmentExpired && a.Epoch == l.Epoch })
	})
	t.Run("revoked", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		c := e.connect("a", cheetah.Console, nil, worker("w1"))
		l := e.mustAcquire("t")
		e.revoked(user, "a", "w1")
		ok, err := e.reg.Revoke(context.Background(), user, "a", "w1")
		require.NoError(t, err)
		require.False(t, ok)
		require.Equal(t, cheetah.LostRevoked, lostReason(t, send(e, l)))
		waitFor(t, c.conn, func(a *protocol.Assignment) bool { return a.State == protocol.AssignmentRevoked })
	})
	t.Run("context gone", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		c := e.connect("a", cheetah.Console, nil, worker("w1"), worker("w2"))
		l := e.mustAcquire("t")
		e.reg.Report(c.att, []protocol.ContextReport{worker("w2")})
		require.Equal(t, cheetah.LostContextGone, lostReason(t, send(e, l)))
		ok, _ := e.reg.Release(ctx, l)
		require.False(t, ok)
	})
	t.Run("not live then back", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		c := e.connect("a", cheetah.Console, nil, worker("w1"))
		l := e.mustAcquire("t")
		e.reg.Disconnect(c.att)
		require.Equal(t, cheetah.LostNotLive, lostReason(t, send(e, l)))
		_, err := e.reg.Renew(ctx, l, 0)
		require.Equal(t, cheetah.LostNotLive, lostReason(t, err))
		// hello, but no context reported yet
		conn := newFakeConn()
		att := e.reg.Connect(registry.ClientInfo{UserID: user, ClientID: "a", Type: cheetah.Console}, conn)
		require.Equal(t, cheetah.LostNotLive, lostReason(t, send(e, l)), "live only once a state report lists it")
		e.reg.Report(att, []protocol.ContextReport{worker("w1")})
		a := waitFor(t, conn, anyFrame[*protocol.Assignment])
		require.Equal(t, protocol.AssignmentAssigned, a.State, "the new connection hears of the lease it carries")
		require.Equal(t, l.Epoch, a.Epoch)
		require.NoError(t, send(e, l), "the lease survived the grace")
	})
	t.Run("not worker", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		c := e.connect("a", cheetah.Console, nil, worker("w1"))
		l := e.mustAcquire("t")
		e.reg.Report(c.att, []protocol.ContextReport{human("w1")})
		require.Equal(t, cheetah.LostNotWorker, lostReason(t, send(e, l)))
		ok, _ := e.reg.Release(ctx, l)
		require.True(t, ok, "release works whatever the context's state")
	})
	t.Run("grace ends", func(t *testing.T) {
		t.Parallel()
		e := setup(t, func(c *registry.Config) { c.ReconnectGrace = 30 * time.Second })
		c := e.connect("a", cheetah.Console, nil, worker("w1"))
		l := e.mustAcquire("t")
		e.reg.Disconnect(c.att)
		e.clock.Advance(30 * time.Second)
		require.Eventually(t, func() bool { return e.reg.Stats().Clients == 0 }, 5*time.Second, time.Millisecond)
		require.Equal(t, cheetah.LostContextGone, lostReason(t, send(e, l)))
	})
}

// A lease acquired with clear_state asks its client to clear the context on
// the assignment that begins it and on the one that ends it, never when an
// assignment is only told again; a lease without it never asks.
func TestClearStateAtBothEndsOfALease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.connect("a", cheetah.Console, nil, worker("w1"))
	l := e.mustAcquire("t", func(r *cheetah.AcquireRequest) { r.ClearState = true })
	require.True(t, l.ClearState, "the lease says so")
	begun := waitFor(t, c.conn, func(a *protocol.Assignment) bool { return a.State == protocol.AssignmentAssigned })
	require.True(t, begun.ClearState, "cleared before the lease's first command")

	e.reg.Disconnect(c.att)
	again := newFakeConn()
	att := e.reg.Connect(registry.ClientInfo{UserID: user, ClientID: "a", Type: cheetah.Console}, again)
	e.reg.Report(att, []protocol.ContextReport{worker("w1")})
	told := waitFor(t, again, func(a *protocol.Assignment) bool { return a.State == protocol.AssignmentAssigned })
	require.Equal(t, l.Epoch, told.Epoch)
	require.False(t, told.ClearState, "a lease told again after a reconnect is not cleared in the middle")

	e.revoked(user, "a", "w1")
	ended := waitFor(t, again, func(a *protocol.Assignment) bool { return a.State == protocol.AssignmentRevoked })
	require.True(t, ended.ClearState, "cleared when the lease ends, however it ends")

	plain := e.mustAcquire("u")
	require.False(t, plain.ClearState)
	require.False(t, waitFor(t, again, func(a *protocol.Assignment) bool {
		return a.State == protocol.AssignmentAssigned && a.Epoch == plain.Epoch
	}).ClearState)
	ok, err := e.reg.Release(context.Background(), plain)
	require.NoError(t, err)
	require.True(t, ok)
	require.False(t, waitFor(t, again, func(a *protocol.Assignment) bool {
		return a.State == protocol.AssignmentReleased && a.Epoch == plain.Epoch
	}).ClearState)
}

// A renewal with a shorter TTL brings the lease's deadline forward, before
// the one the expiry loop waits for: the loop wakes for it.
func TestShorterRenewalWakesTheExpiryLoop(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.connect("a", cheetah.Console, nil, worker("w1"), worker("w2"))
	e.mustAcquire("first", func(r *cheetah.AcquireRequest) { r.TTL = 30 * time.Second })
	l := e.mustAcquire("second", func(r *cheetah.AcquireRequest) { r.TTL = time.Minute })
	// The loop expires the first lease and, in the same step, takes the
	// second's deadline for its next wake-up.
	e.clock.Advance(30 * time.Second)
	require.Eventually(t, func() bool { return e.reg.Stats().Leases == 1 }, 5*time.Second, time.Millisecond)

	_, err := e.reg.Renew(context.Background(), l, 5*time.Second)
	require.NoError(t, err)
	e.clock.Advance(6 * time.Second)
	require.Eventually(t, func() bool { return e.reg.Stats().Leases == 0 }, 5*time.Second, time.Millisecond,
		"expired at its new deadline, not at the old one")
}
