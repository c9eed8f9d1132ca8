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

// connectRoom connects a console client of user that can hold max
// contexts and reports contexts.
func (e *env) connectRoom(clientID string, max int, contexts ...protocol.ContextReport) *client {
	c := &client{conn: newFakeConn(), id: clientID}
	c.att = e.reg.Connect(registry.ClientInfo{UserID: user, ClientID: clientID, Type: cheetah.Console, KeyID: "k1", MaxContexts: max}, c.conn)
	e.reg.Report(c.att, contexts)
	return c
}

type acquired struct {
	l   cheetah.Lease
	err error
}

// acquireCreating starts an acquire that asks for a context to be created
// and returns where its outcome arrives.
func (e *env) acquireCreating(ctx context.Context, timeout time.Duration) <-chan acquired {
	out := make(chan acquired, 1)
	go func() {
		l, err := e.reg.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "t", ClientType: cheetah.Console,
			Create: &cheetah.CreateSpec{URL: "https://example.com/", Timeout: timeout}})
		out <- acquired{l, err}
	}()
	return out
}

func created(id, requestID string) protocol.ContextReport {
	r := worker(id)
	r.RequestID = requestID
	return r
}

func TestCreateSuccess(t *testing.T) {
	e := setup(t)
	small := e.connectRoom("a-small", 2, worker("x"))
	big := e.connectRoom("b-big", 3, worker("y"))
	e.connectRoom("c-none", 0)
	// Both idle contexts are taken: the next acquire must create.
	e.mustAcquire("t")
	e.mustAcquire("t")
	res := e.acquireCreating(context.Background(), 0)
	// b-big has the most room (2 against 1).
	cc := waitFor(t, big.conn, anyFrame[*protocol.CreateContext])
	require.Equal(t, "https://example.com/", cc.URL)
	require.Regexp(t, `^cr_`, cc.RequestID)
	require.Empty(t, framesOf[*protocol.CreateContext](small.conn), "the client with less room is not asked")
	// Another context reported first is not the one: it goes idle.
	e.reg.Report(big.att, []protocol.ContextReport{worker("y"), worker("z")})
	e.reg.Report(big.att, []protocol.ContextReport{worker("y"), worker("z"), created("new", cc.RequestID)})
	r := <-res
	require.NoError(t, r.err)
	require.Equal(t, "new", r.l.ContextID)
	require.Equal(t, "b-big", r.l.ClientID)
	require.True(t, r.l.Created)
	// The lease is an ordinary one: a command reaches the new context.
	id, err := e.reg.Send(context.Background(), r.l, cheetah.Command{Name: "echo"}, cheetah.SendOptions{})
	require.NoError(t, err)
	cmd := waitFor(t, big.conn, func(c *protocol.Command) bool { return c.CommandID == id.CommandID })
	require.Equal(t, "new", cmd.ContextID)
	require.Zero(t, e.reg.Stats().Creations)

	// With an idle context at hand, create asks nobody: the lease is an
	// ordinary one, and its token works.
	idle := e.reg.Stats().Creations
	r = <-e.acquireCreating(context.Background(), 0)
	require.NoError(t, r.err)
	require.False(t, r.l.Created)
	require.Equal(t, idle, e.reg.Stats().Creations)
	_, err = e.reg.Send(context.Background(), r.l, cheetah.Command{Name: "echo"}, cheetah.SendOptions{})
	require.NoError(t, err)
}

func TestCreateTieByClientID(t *testing.T) {
	e := setup(t)
	b := e.connectRoom("b", 2)
	a := e.connectRoom("a", 2)
	res := e.acquireCreating(context.Background(), time.Second)
	cc := waitFor(t, a.conn, anyFrame[*protocol.CreateContext])
	require.Empty(t, framesOf[*protocol.CreateContext](b.conn))
	e.reg.Report(a.att, []protocol.ContextReport{created("n", cc.RequestID)})
	require.NoError(t, (<-res).err)
}

func framesOf[F protocol.Frame](c *fakeConn) []F {
	var out []F
	for _, f := range c.all() {
		if x, ok := f.(F); ok {
			out = append(out, x)
		}
	}
	return out
}

func TestCreateReasons(t *testing.T) {
	t.Run("no client", func(t *testing.T) {
		e := setup(t)
		r := <-e.acquireCreating(context.Background(), 0)
		require.Equal(t, cheetah.ReasonNoEligibleClient, noContextReason(t, r.err))
	})
	t.Run("capacity_exhausted", func(t *testing.T) {
		e := setup(t)
		e.connectRoom("full", 1, worker("x"))
		e.connectRoom("none", 0)
		e.mustAcquire("t")
		r := <-e.acquireCreating(context.Background(), 0)
		require.Equal(t, cheetah.ReasonCapacityExhausted, noContextReason(t, r.err))
	})
	t.Run("creation_failed", func(t *testing.T) {
		e := setup(t)
		c := e.connectRoom("c", 4)
		res := e.acquireCreating(context.Background(), 0)
		cc := waitFor(t, c.conn, anyFrame[*protocol.CreateContext])
		e.reg.CreateFailed(c.att, &protocol.CreateFailed{RequestID: "cr_other", Code: "x"}) // not pending: ignored
		e.reg.CreateFailed(c.att, &protocol.CreateFailed{RequestID: cc.RequestID, Code: "tab_limit", Message: "no"})
		r := <-res
		require.Equal(t, cheetah.ReasonCreationFailed, noContextReason(t, r.err))
		requireCreationsZero(t, e)
	})
	t.Run("creation_timeout and a late report", func(t *testing.T) {
		e := setup(t)
		c := e.connectRoom("c", 4)
		res := e.acquireCreating(context.Background(), 2*time.Second)
		cc := waitFor(t, c.conn, anyFrame[*protocol.CreateContext])
		require.NoError(t, e.clock.BlockUntilContext(context.Background(), 2), "the expiry loop's timer and the creation's")
		e.clock.Advance(2 * time.Second)
		r := <-res
		require.Equal(t, cheetah.ReasonCreationTimeout, noContextReason(t, r.err))
		requireCreationsZero(t, e)
		// Reported after the timeout: an ordinary idle context.
		e.reg.Report(c.att, []protocol.ContextReport{created("late", cc.RequestID)})
		avail, err := e.reg.ListAvailable(context.Background(), user, cheetah.Console)
		require.NoError(t, err)
		require.Len(t, avail, 1)
		l := e.mustAcquire("t")
		require.Equal(t, "late", l.ContextID)
		require.False(t, l.Created)
	})
	t.Run("client drops mid-creation", func(t *testing.T) {
		e := setup(t)
		c := e.connectRoom("c", 4)
		res := e.acquireCreating(context.Background(), 0)
		waitFor(t, c.conn, anyFrame[*protocol.CreateContext])
		e.reg.Disconnect(c.att)
		r := <-res
		require.Equal(t, cheetah.ReasonCreationFailed, noContextReason(t, r.err))
		requireCreationsZero(t, e)
	})
	t.Run("caller goes away", func(t *testing.T) {
		e := setup(t)
		c := e.connectRoom("c", 4)
		ctx, cancel := context.WithCancel(context.Background())
		res := e.acquireCreating(ctx, 0)
		cc := waitFor(t, c.conn, anyFrame[*protocol.CreateContext])
		cancel()
		r := <-res
		require.ErrorIs(t, r.err, context.Canceled)
		requireCreationsZero(t, e)
		// The request is abandoned: its context, reported now, is idle.
		e.reg.Report(c.att, []protocol.ContextReport{created("n", cc.RequestID)})
		require.Zero(t, e.reg.Stats().Leases)
		avail, _ := e.reg.ListAvailable(context.Background(), user, cheetah.Console)
		require.Len(t, avail, 1)
	})
	t.Run("invalid", func(t *testing.T) {
		e := setup(t)
		r := <-e.acquireCreating(context.Background(), 2*time.Minute)
		require.ErrorIs(t, r.err, cheetah.ErrInvalidRequest)
	})
}

func requireCreationsZero(t *testing.T, e *env) {
	t.Helper()
	require.Zero(t, e.reg.Stats().Creations)
}

// TestCreateRaceForLastSlot: two creating acquires on a client with room
// for one more context: one creation is asked, the other acquire finds no
// room; and each creation gets its own context, never the other's.
func TestCreateRaceForLastSlot(t *testing.T) {
	e := setup(t)
	c := e.connectRoom("c", 2, worker("x"))
	e.mustAcquire("t")
	var wg sync.WaitGroup
	results := make(chan acquired, 2)
	for range 2 {
		wg.Go(func() { results <- <-e.acquireCreating(context.Background(), 0) })
	}
	// One of them is refused at once; the other waits for its context.
	first := <-results
	require.Equal(t, cheetah.ReasonCapacityExhausted, noContextReason(t, first.err))
	ccs := framesOf[*protocol.CreateContext](c.conn)
	require.Len(t, ccs, 1)
	e.reg.Report(c.att, []protocol.ContextReport{worker("x"), created("n", ccs[0].RequestID)})
	second := <-results
	require.NoError(t, second.err)
	require.Equal(t, "n", second.l.ContextID)
	wg.Wait()

	// With room for two, two creations each get the context of their id,
	// whatever order the client reports them in.
	e2 := setup(t)
	c2 := e2.connectRoom("c", 2)
	r1 := e2.acquireCreating(context.Background(), 0)
	cc1 := waitFor(t, c2.conn, anyFrame[*protocol.CreateContext])
	r2 := e2.acquireCreating(context.Background(), 0)
	cc2 := waitFor(t, c2.conn, func(f *protocol.CreateContext) bool { return f.RequestID != cc1.RequestID })
	r3 := <-e2.acquireCreating(context.Background(), 0)
	require.Equal(t, cheetah.ReasonCapacityExhausted, noContextReason(t, r3.err), "two pending creations fill the room")
	e2.reg.Report(c2.att, []protocol.ContextReport{created("second", cc2.RequestID), created("first", cc1.RequestID)})
	a1, a2 := <-r1, <-r2
	require.NoError(t, a1.err)
	require.NoError(t, a2.err)
	require.Equal(t, "first", a1.l.ContextID)
	require.Equal(t, "second", a2.l.ContextID)
}

// Two creating acquires for the last quota slot: both clients are asked,
// the first context reported takes the slot, and the second acquire fails
// quota_exceeded while its context becomes an ordinary idle one.
func TestCreateRaceForLastQuotaSlot(t *testing.T) {
	e := setup(t)
	e.reg.SetQuotas(mustQuotas(t, "quotas: [{name: q, levels: {user: 1}}]"))
	c := e.connectRoom("c", 4)
	r1 := e.acquireCreating(context.Background(), 0)
	cc1 := waitFor(t, c.conn, anyFrame[*protocol.CreateContext])
	r2 := e.acquireCreating(context.Background(), 0)
	cc2 := waitFor(t, c.conn, func(f *protocol.CreateContext) bool { return f.RequestID != cc1.RequestID })
	e.reg.Report(c.att, []protocol.ContextReport{created("two", cc2.RequestID)})
	a2 := <-r2
	require.NoError(t, a2.err)
	require.Equal(t, "two", a2.l.ContextID)
	e.reg.Report(c.att, []protocol.ContextReport{created("two", ""), created("one", cc1.RequestID)})
	a1 := <-r1
	require.Equal(t, "user", quotaFull(t, a1.err).Level)
	avail, _ := e.reg.ListAvailable(context.Background(), user, cheetah.Console)
	require.Len(t, avail, 1)
	require.Equal(t, "one", avail[0].ContextID)
	requireCreationsZero(t, e)
}

func TestCreatePlacement(t *testing.T) {
	e := setup(t)
	c := &client{conn: newFakeConn(), id: "eu"}
	c.att = e.reg.Connect(registry.ClientInfo{UserID: user, ClientID: "eu", Type: cheetah.Console, MaxContexts: 2,
		Labels: map[string]string{"region": "eu"}}, c.conn)
	e.reg.Report(c.att, nil)
	req := cheetah.AcquireRequest{UserID: user, TaskID: "t", ClientType: cheetah.Console, Create: &cheetah.CreateSpec{}}
	us := req
	us.Labels = map[string]string{"region": "us"}
	_, err := e.reg.Acquire(context.Background(), us)
	require.Equal(t, cheetah.ReasonPlacementMiss, noContextReason(t, err))
	other := req
	other.ClientID = "nope"
	_, err = e.reg.Acquire(context.Background(), other)
	require.Equal(t, cheetah.ReasonPlacementMiss, noContextReason(t, err))
	browser := req
	browser.ClientType = cheetah.Browser
	_, err = e.reg.Acquire(context.Background(), browser)
	require.Equal(t, cheetah.ReasonNoEligibleClient, noContextReason(t, err))
	// The client's labels place it: asked, with an empty URL.
	eu := req
	eu.Labels = map[string]string{"region": "eu"}
	res := make(chan acquired, 1)
	go func() { l, err := e.reg.Acquire(context.Background(), eu); res <- acquired{l, err} }()
	cc := waitFor(t, c.conn, anyFrame[*protocol.CreateContext])
	require.Empty(t, cc.URL)
	e.reg.Report(c.att, []protocol.ContextReport{created("n", cc.RequestID)})
	require.NoError(t, (<-res).err)
}
