package sdktest

import (
	"context"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/protocol"
)

// Creation on demand (DESIGN §10), as each SDK backend sees it.

type acquireOutcome struct {
	h   *cheetah.Handle
	err error
}

// acquireCreating starts an acquire that asks for a context to be created.
func (s *suite) acquireCreating(ctx context.Context, timeout time.Duration) <-chan acquireOutcome {
	out := make(chan acquireOutcome, 1)
	go func() {
		h, err := s.m.Acquire(ctx, cheetah.AcquireRequest{UserID: userA, TaskID: "create", ClientType: cheetah.Console,
			Create: &cheetah.CreateSpec{URL: "https://example.com/", Timeout: timeout}})
		out <- acquireOutcome{h, err}
	}()
	return out
}

func (s *suite) outcome(ch <-chan acquireOutcome) acquireOutcome {
	s.t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(guard):
		s.t.Fatal("the acquire did not end")
		return acquireOutcome{}
	}
}

// createContext: the agent opens a flow on request; the lease says created
// and a command reaches the new context.
func createContext(s *suite) {
	s.agentRoom(userA, "agent-1", 1, 2, nil)
	s.acquire(cheetah.AcquireRequest{TaskID: "first"})
	o := s.outcome(s.acquireCreating(s.ctx, 0))
	require.NoError(s.t, o.err)
	l := o.h.Lease()
	require.True(s.t, l.Created)
	require.Equal(s.t, "flow-2", l.ContextID)
	res, err := o.h.SendAndWait(s.ctx, cheetah.Command{Name: "echo", Params: map[string]int{"n": 2}})
	require.NoError(s.t, err)
	require.Equal(s.t, cheetah.StatusCompleted, res.Status)
	// The agent is full now.
	o = s.outcome(s.acquireCreating(s.ctx, 0))
	require.Equal(s.t, cheetah.ReasonCapacityExhausted, noContextReason(s.t, o.err, "no room left"))
}

// createFailures: each way a creation can fail.
func createFailures(s *suite) {
	c := s.rawRoom(userA, "raw-1", 3)
	// The client says it cannot.
	res := s.acquireCreating(s.ctx, 0)
	cc := c.nextCreate()
	require.Equal(s.t, "https://example.com/", cc.URL)
	c.send(&protocol.CreateFailed{RequestID: cc.RequestID, Code: "tab_limit", Message: "no"})
	require.Equal(s.t, cheetah.ReasonCreationFailed, noContextReason(s.t, s.outcome(res).err, "create_failed"))

	// The client does not report in time; reported later, the context is
	// an ordinary idle one.
	res = s.acquireCreating(s.ctx, 100*time.Millisecond)
	cc = c.nextCreate()
	require.Equal(s.t, cheetah.ReasonCreationTimeout, noContextReason(s.t, s.outcome(res).err, "timeout"))
	c.report(createdAs("late", cc.RequestID))
	s.waitAvailable(userA, "raw-1", 1)
	h := s.acquire(cheetah.AcquireRequest{TaskID: "late"})
	require.False(s.t, h.Lease().Created)
	require.Equal(s.t, "late", h.Lease().ContextID)

	// The caller goes away: the request is abandoned, and its context,
	// reported after, is idle.
	ctx, cancel := context.WithCancel(s.ctx)
	res = s.acquireCreating(ctx, 0)
	cc = c.nextCreate()
	cancel()
	require.ErrorIs(s.t, s.outcome(res).err, context.Canceled)
	s.eventually(func() bool { return s.env.PendingCreations() == 0 }, "the broker abandons the request")
	c.report(createdAs("late", ""), createdAs("abandoned", cc.RequestID))
	s.waitAvailable(userA, "raw-1", 1)
	s.acquire(cheetah.AcquireRequest{TaskID: "abandoned"}) // nothing idle is left

	// The client drops mid-creation.
	res = s.acquireCreating(s.ctx, 0)
	c.nextCreate()
	c.conn.CloseNow()
	require.Equal(s.t, cheetah.ReasonCreationFailed, noContextReason(s.t, s.outcome(res).err, "dropped"))
}

// affinity: the key finds the context its last lease carried, and says so.
func affinity(s *suite) {
	s.agent(userA, "agent-1", 2, nil)
	h := s.acquire(cheetah.AcquireRequest{TaskID: "a", AffinityKey: "shop"})
	require.NotNil(s.t, h.Lease().AffinityHit)
	require.False(s.t, *h.Lease().AffinityHit)
	first := h.Lease().ContextID
	_, err := s.m.Release(s.ctx, h)
	require.NoError(s.t, err)
	h = s.acquire(cheetah.AcquireRequest{TaskID: "a", AffinityKey: "shop"})
	require.True(s.t, *h.Lease().AffinityHit)
	require.Equal(s.t, first, h.Lease().ContextID, "not the context idle longest: the one the key names")
	// Leased: a miss, the other context.
	h2 := s.acquire(cheetah.AcquireRequest{TaskID: "a", AffinityKey: "shop"})
	require.False(s.t, *h2.Lease().AffinityHit)
	require.NotEqual(s.t, first, h2.Lease().ContextID)
}

// quotaExceededAndWait: a full level says which, with its count and cap;
// a waiting acquire gets the slot once it frees.
func quotaExceededAndWait(s *suite) {
	s.env.SetQuotas(s.t, "quotas: [{name: consoles, match: {client_type: console}, levels: {global: 4, user: 1}}]")
	s.agent(userA, "agent-1", 2, nil)
	h := s.acquire(cheetah.AcquireRequest{TaskID: "q", TenantID: "acme"})
	require.Equal(s.t, "acme", h.Lease().TenantID)
	_, err := s.m.Acquire(s.ctx, cheetah.AcquireRequest{UserID: userA, TaskID: "q", ClientType: cheetah.Console, TenantID: "acme"})
	require.Equal(s.t, cheetah.ReasonQuotaExceeded, noContextReason(s.t, err, "user level full"))
	var nc *cheetah.NoContextError
	require.ErrorAs(s.t, err, &nc)
	require.Equal(s.t, &cheetah.QuotaFull{Quota: "consoles", Level: "user", Used: 1, Cap: 1}, nc.Quota)
	// Another tenant is another scope.
	other := s.acquire(cheetah.AcquireRequest{TaskID: "q", TenantID: "other"})
	_, err = s.m.Release(s.ctx, other)
	require.NoError(s.t, err)

	res := make(chan acquireOutcome, 1)
	go func() {
		h, err := s.m.Acquire(s.ctx, cheetah.AcquireRequest{UserID: userA, TaskID: "q", ClientType: cheetah.Console,
			TenantID: "acme", Wait: time.Minute})
		res <- acquireOutcome{h, err}
	}()
	// The waiter cannot be seen from here; a release before it waits
	// serves it as well (the slot is free when it arrives).
	_, err = s.m.Release(s.ctx, h)
	require.NoError(s.t, err)
	o := s.outcome(res)
	require.NoError(s.t, o.err)
	require.Equal(s.t, "acme", o.h.Lease().TenantID)
}
