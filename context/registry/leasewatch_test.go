package registry_test

import (
	"context"
	"encoding/hex"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/protocol"
)

// WatchLease tells each ending once, with its reason; a lease that already
// ended is told at once; a stopped watch is told nothing and leaves no
// bookkeeping behind.
func TestWatchLease(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *registry.Config) { c.ReconnectGrace = 5 * time.Second })
	c := e.connect("a", cheetah.Console, nil, worker("w1"), worker("w2"))
	watch := func(l cheetah.Lease) (chan cheetah.LostReason, func()) {
		ch := make(chan cheetah.LostReason, 2)
		stop := e.reg.WatchLease(l, func(r cheetah.LostReason) { ch <- r })
		return ch, stop
	}
	got := func(ch chan cheetah.LostReason) cheetah.LostReason {
		select {
		case r := <-ch:
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("no notice")
			return ""
		}
	}

	l1 := e.mustAcquire("t1", func(r *cheetah.AcquireRequest) { r.TTL = 10 * time.Second })
	ch1, stop1 := watch(l1)
	defer stop1()
	e.clock.Advance(11 * time.Second)
	e.reg.ExpireDue()
	require.Equal(t, cheetah.LostExpired, got(ch1))

	l2 := e.mustAcquire("t2")
	ch2, stop2 := watch(l2)
	stop2()
	ch2b, stop2b := watch(l2)
	defer stop2b()
	e.revoked(user, "a", l2.ContextID)
	require.Equal(t, cheetah.LostRevoked, got(ch2b))
	require.Empty(t, ch2, "a stopped watch hears nothing")

	// Already ended: told at once, with the reason a send would get.
	ch3, stop3 := watch(l2)
	defer stop3()
	require.Equal(t, cheetah.LostRevoked, got(ch3))

	// The reconnect grace runs out: context_gone.
	l4 := e.mustAcquire("t4")
	ch4, stop4 := watch(l4)
	defer stop4()
	e.reg.Disconnect(c.att)
	e.clock.Advance(6 * time.Second)
	require.Equal(t, cheetah.LostContextGone, got(ch4))
	require.Empty(t, ch1)
	require.Eventually(t, func() bool { return e.reg.WatchedLeases() == 0 }, 10*time.Second, time.Millisecond)
}

// A lease that moves to another replica with its client keeps its
// lease_webhook: the LeaseEnded there carries it.
func TestHandOverKeepsLeaseWebhook(t *testing.T) {
	t.Parallel()
	a := setup(t)
	b := setup(t)
	a.connect("c", cheetah.Console, nil, worker("w1"))
	l := a.mustAcquire("t", func(r *cheetah.AcquireRequest) {
		r.LeaseWebhook, r.LeaseWebhookKeyID = "https://example.com/lost", "key_1"
		r.ClearState = true
	})
	ended := make(chan registry.Event, 1)
	unsub := b.reg.Subscribe(func(ev registry.Event) {
		if ev.Kind == registry.LeaseEnded {
			ended <- ev
		}
	})
	defer unsub()
	h, ok := a.reg.HandOver(user, "c", "b")
	require.True(t, ok)
	b.reg.Adopt(b.reg.Forgets(), user, "c", h)
	moved, err := b.reg.TaskContexts(context.Background(), user, "t")
	require.NoError(t, err)
	require.Len(t, moved, 1)
	require.True(t, moved[0].ClearState, "clear_state moves with the lease")
	b.revoked(user, "c", l.ContextID)
	ev := <-ended
	require.Equal(t, "https://example.com/lost", ev.LeaseWebhook)
	require.Equal(t, "key_1", ev.LeaseWebhookKeyID)
	require.Equal(t, cheetah.LostRevoked, ev.Reason)
}

// A client that comes back to a replica still holding it (within its
// grace) brings the leases it got elsewhere meanwhile: they are merged into
// the client there, never dropped.
func TestAdoptMergesIntoAClientStillHere(t *testing.T) {
	t.Parallel()
	a, b := setup(t), setup(t)
	ctx := context.Background()
	// First on b: a lease of its own, released; then the client leaves.
	cb := b.connect("mover", cheetah.Console, nil, worker("w1"), worker("w2"))
	old := b.mustAcquire("t0")
	ok, err := b.reg.Release(ctx, old)
	require.NoError(t, err)
	require.True(t, ok)
	b.reg.Disconnect(cb.att)

	// On a, with the epoch floor a hello among replicas gives, a new lease
	// and a context b never saw.
	att := a.reg.Connect(registry.ClientInfo{UserID: user, ClientID: "mover", Type: cheetah.Console, EpochFloor: old.Epoch}, newFakeConn())
	a.reg.Report(att, []protocol.ContextReport{worker("w1"), worker("w2"), worker("w3")})
	l := a.mustAcquire("t1")
	require.Greater(t, l.Epoch, old.Epoch)

	// Back on b, which still holds the client in its grace.
	h, moved := a.reg.HandOver(user, "mover", "b")
	require.True(t, moved)
	b.reg.Adopt(b.reg.Forgets(), user, "mover", h)
	att = b.reg.Connect(registry.ClientInfo{UserID: user, ClientID: "mover", Type: cheetah.Console}, newFakeConn())
	b.reg.Report(att, []protocol.ContextReport{worker("w1"), worker("w2"), worker("w3")})
	_, err = send(b, l, "echo")
	require.NoError(t, err, "the lease made elsewhere came back with its client")
	leases, err := b.reg.TaskContexts(ctx, user, "t1")
	require.NoError(t, err)
	require.Len(t, leases, 1)
	require.Equal(t, l.Epoch, leases[0].Epoch)
	ok, err = b.reg.Release(ctx, l)
	require.NoError(t, err)
	require.True(t, ok, "and its holder gives it back there")
}

// A context whose lease another replica holds and did not hand over waits
// for it: not leased here, not even once the client reports it, until the
// lease comes (AdoptOrphans), that replica lets it go (StopAwaiting
// without it), or the wait runs out; a client handed on takes the wait
// with it.
func TestContextsAwaitTheirLeaseFromElsewhere(t *testing.T) {
	t.Parallel()
	a, b := setup(t), setup(t)
	until := a.clock.Now().Add(time.Minute)
	a.reg.Adopt(a.reg.Forgets(), user, "back", registry.HandedOver{Contexts: []registry.HandedContext{{ID: "w1", AwaitUntil: until}}})
	att := a.reg.Connect(registry.ClientInfo{UserID: user, ClientID: "back", Type: cheetah.Console}, newFakeConn())
	a.reg.Report(att, []protocol.ContextReport{worker("w1"), worker("w2")})
	l := a.mustAcquire("t1")
	require.Equal(t, "w2", l.ContextID, "w1 awaits its lease")
	_, err := a.acquire("t2")
	require.ErrorIs(t, err, cheetah.ErrNoContextAvailable)

	// Still held elsewhere: it waits on; its client moves on with the wait.
	a.reg.StopAwaiting(user, "back", []string{"w1"})
	_, err = a.acquire("t2")
	require.ErrorIs(t, err, cheetah.ErrNoContextAvailable)
	h, moved := a.reg.HandOver(user, "back", "b")
	require.True(t, moved)
	b.reg.Adopt(b.reg.Forgets(), user, "back", h)
	att = b.reg.Connect(registry.ClientInfo{UserID: user, ClientID: "back", Type: cheetah.Console}, newFakeConn())
	b.reg.Report(att, []protocol.ContextReport{worker("w1")})
	_, err = b.acquire("t2")
	require.ErrorIs(t, err, cheetah.ErrNoContextAvailable, "the wait moved with the client")
	require.Equal(t, [][2]string{{user, "back"}}, b.reg.Awaiting())

	// Its lease comes: it holds the context as it was.
	row := history.PutLease{TokenDigest: registry.TokenDigest("kept-token"), UserID: user, ClientID: "back", ContextID: "w1",
		TaskID: "kept", Epoch: 40, TTL: time.Minute, ExpiresAt: b.clock.Now().Add(time.Minute)}
	adopted, untaken := b.reg.AdoptOrphans(b.reg.Forgets(), user, "back", []history.PutLease{row})
	require.Equal(t, 1, adopted)
	require.Zero(t, untaken)
	require.Empty(t, b.reg.Awaiting())
	_, err = send(b, cheetah.Lease{UserID: user, ClientID: "back", ContextID: "w1", TaskID: "kept", Epoch: 40, LeaseToken: "kept-token"}, "echo")
	require.NoError(t, err)

	// Let go elsewhere, or out of time: the context is free.
	c := setup(t)
	c.reg.Adopt(c.reg.Forgets(), user, "gone", registry.HandedOver{Contexts: []registry.HandedContext{{ID: "x1", AwaitUntil: c.clock.Now().Add(time.Minute)}, {ID: "x2", AwaitUntil: c.clock.Now().Add(time.Minute)}}})
	att = c.reg.Connect(registry.ClientInfo{UserID: user, ClientID: "gone", Type: cheetah.Console}, newFakeConn())
	c.reg.Report(att, []protocol.ContextReport{worker("x1"), worker("x2")})
	c.reg.StopAwaiting(user, "gone", []string{"x2"})
	got := c.mustAcquire("t3")
	require.Equal(t, "x1", got.ContextID, "x1's lease is gone elsewhere")
	_, err = c.acquire("t4")
	require.ErrorIs(t, err, cheetah.ErrNoContextAvailable)
	c.clock.Advance(time.Minute)
	c.reg.StopAwaiting(user, "gone", []string{"x2"})
	require.Equal(t, "x2", c.mustAcquire("t4").ContextID, "x2's wait ran out")
}

// A replica whose client left, handed over to another replica or forgotten
// when the replica was fenced, no longer knows what that client's contexts
// are: a lease that ended there before is unknown_lease there, never
// context_gone (its context lives on elsewhere), and is described again
// once the client is back.
func TestEndedLeaseOfAClientThatLeft(t *testing.T) {
	t.Parallel()
	for _, leave := range []struct {
		name string
		do   func(t *testing.T, e *env)
	}{
		{"handed over", func(t *testing.T, e *env) {
			_, ok := e.reg.HandOver(user, "c", "b")
			require.True(t, ok)
		}},
		{"forgotten", func(_ *testing.T, e *env) { e.reg.Forget(protocol.CloseGoingAway, "fenced") }},
	} {
		t.Run(leave.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := setup(t)
			e.connect("c", cheetah.Console, nil, worker("w1"))
			l := e.mustAcquire("t")
			e.revoked(user, "c", l.ContextID)
			_, err := e.reg.Renew(ctx, l, 0)
			require.Equal(t, cheetah.LostRevoked, lostReason(t, err))

			leave.do(t, e)
			_, err = e.reg.Renew(ctx, l, 0)
			require.Equal(t, cheetah.LostUnknownLease, lostReason(t, err))

			e.connect("c", cheetah.Console, nil, worker("w1"))
			_, err = e.reg.Renew(ctx, l, 0)
			require.Equal(t, cheetah.LostRevoked, lostReason(t, err), "the context is here again, idle")
		})
	}
}

// A hello under way when its replica fenced (Forget) takes nothing in
// afterwards, though the replica is back: what it read or was handed is
// another replica's by then, where its client went. The orphans it claimed
// go back. A current hello takes them, except an orphan whose context was
// leased here since at a later epoch: lost for good, its row is to be
// deleted (given back, it would be adopted once the later lease ended, and
// the context would see an older epoch again).
func TestHelloAcrossAForgetTakesNothingIn(t *testing.T) {
	t.Parallel()
	e := setup(t)
	began := e.reg.Forgets()
	e.reg.Forget(protocol.CloseGoingAway, "fenced")
	require.NotEqual(t, began, e.reg.Forgets())

	lease := func(token string, epoch int64, claimed bool) *registry.HandedLease {
		d := registry.TokenDigest(token)
		return &registry.HandedLease{TokenDigest: hex.EncodeToString(d[:]), TaskID: token, Epoch: epoch,
			TTL: time.Minute, ExpiresAt: e.clock.Now().Add(time.Minute), Generation: 3, Claimed: claimed}
	}
	h := registry.HandedOver{Contexts: []registry.HandedContext{
		{ID: "w1", Lease: lease("handed", 10, false)},
		{ID: "w2", Lease: lease("claimed", 11, true)},
		{ID: "w3", AwaitUntil: e.clock.Now().Add(time.Minute)},
	}}
	untaken, ok := e.reg.Adopt(began, user, "late", h)
	require.False(t, ok)
	require.Equal(t, registry.Untaken{Back: [][32]byte{registry.TokenDigest("claimed")}}, untaken, "the claimed orphan goes back")
	require.Nil(t, e.reg.Connect(registry.ClientInfo{UserID: user, ClientID: "late", Type: cheetah.Console, Forgets: began}, newFakeConn()))
	now := e.reg.Forgets()
	c := e.connect("late", cheetah.Console, nil, worker("w1"), worker("w2"), worker("w3"))
	row := func(token, contextID string, epoch int64) history.PutLease {
		return history.PutLease{TokenDigest: registry.TokenDigest(token), UserID: user, ClientID: "late", ContextID: contextID,
			TaskID: token, Epoch: epoch, TTL: time.Minute, ExpiresAt: e.clock.Now().Add(time.Minute), Generation: 4}
	}
	adopted, untaken := e.reg.AdoptOrphans(began, user, "late", []history.PutLease{row("orphan", "w1", 12)})
	require.Zero(t, adopted)
	require.Equal(t, registry.Untaken{Back: [][32]byte{registry.TokenDigest("orphan")}}, untaken)
	require.Zero(t, e.reg.Stats().Leases, "nothing was taken in")
	require.Empty(t, e.reg.Awaiting())

	e.reg.Disconnect(c.att)
	untaken, ok = e.reg.Adopt(now, user, "late", h)
	require.True(t, ok)
	require.Zero(t, untaken)
	require.Equal(t, 2, e.reg.Stats().Leases)
	stale := registry.HandedOver{Contexts: []registry.HandedContext{{ID: "w2", Lease: lease("stale", 9, true)}}}
	untaken, ok = e.reg.Adopt(now, user, "late", stale)
	require.True(t, ok)
	require.Equal(t, registry.Untaken{Lost: [][32]byte{registry.TokenDigest("stale")}}, untaken)
	e.connect("late", cheetah.Console, nil, worker("w1"), worker("w2"), worker("w3"))
	_, err := send(e, cheetah.Lease{UserID: user, ClientID: "late", ContextID: "w2", TaskID: "claimed", Epoch: 11, LeaseToken: "claimed"}, "echo")
	require.NoError(t, err, "the claimed orphan is held")
	adopted, untaken = e.reg.AdoptOrphans(now, user, "late",
		[]history.PutLease{row("newer", "w1", 12), row("older", "w2", 5), row("elsewhere", "w9", 13)})
	require.Zero(t, adopted)
	require.Equal(t, registry.Untaken{
		Lost: [][32]byte{registry.TokenDigest("older")},
		Back: [][32]byte{registry.TokenDigest("newer"), registry.TokenDigest("elsewhere")},
	}, untaken, "w1 holds the handed lease; w2 was leased at 11; w9 is not here")
}

// A lease that ended on a context that now waits for a lease another
// replica holds (the client came back while that replica had not handed
// it over) is reassigned, not released: the context carries a lease, only
// not one held here yet; a revoke of the context cannot end that lease
// here, and says so (store_unavailable) rather than that there is none.
func TestEndedLeaseOnAContextAwaitingItsLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t)
	e.connect("c", cheetah.Console, nil, worker("w1"))
	l := e.mustAcquire("t")
	ok, err := e.reg.Release(ctx, l)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = e.reg.Renew(ctx, l, 0)
	require.Equal(t, cheetah.LostReleased, lostReason(t, err))

	_, ok = e.reg.Adopt(e.reg.Forgets(), user, "c", registry.HandedOver{Contexts: []registry.HandedContext{
		{ID: "w1", AwaitUntil: e.clock.Now().Add(time.Minute)}}})
	require.True(t, ok)
	_, err = e.reg.Renew(ctx, l, 0)
	require.Equal(t, cheetah.LostReassigned, lostReason(t, err))
	revoked, err := e.reg.Revoke(ctx, user, "c", "w1")
	require.ErrorIs(t, err, cheetah.ErrStoreUnavailable, "its lease is there, if not here")
	require.False(t, revoked)
	e.reg.StopAwaiting(user, "c", nil)
	_, err = e.reg.Renew(ctx, l, 0)
	require.Equal(t, cheetah.LostReleased, lostReason(t, err), "its wait over, the context is idle")
	revoked, err = e.reg.Revoke(ctx, user, "c", "w1")
	require.NoError(t, err)
	require.False(t, revoked)
}

// While a client's leases move (a hand-over from here, an adoption of rows
// claimed for it), a lease of theirs may be in no registry while its row
// is this replica's: a revoke that finds no lease on one of the client's
// contexts says store_unavailable, not that there is none, and only
// until the move is done. Other clients' contexts are not concerned.
func TestRevokeWhileLeasesMove(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t)
	e.connect("c", cheetah.Console, nil, worker("w1"))
	e.connect("d", cheetah.Console, nil, worker("w1"))
	done := e.reg.Moving(user, "c")
	again := e.reg.Moving(user, "c")
	for _, client := range []string{"c", "gone"} {
		_, err := e.reg.Revoke(ctx, user, client, "w1")
		if client == "c" {
			require.ErrorIs(t, err, cheetah.ErrStoreUnavailable)
		} else {
			require.NoError(t, err)
		}
	}
	revoked, err := e.reg.Revoke(ctx, user, "d", "w1")
	require.NoError(t, err)
	require.False(t, revoked)
	done()
	done() // once is what counts
	_, err = e.reg.Revoke(ctx, user, "c", "w1")
	require.ErrorIs(t, err, cheetah.ErrStoreUnavailable, "one move is still under way")
	again()
	revoked, err = e.reg.Revoke(ctx, user, "c", "w1")
	require.NoError(t, err)
	require.False(t, revoked)
}
