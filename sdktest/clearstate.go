package sdktest

import (
	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/protocol"
)

// clearState: an acquire's clear_state reaches the client on the
// assignments that begin and end the lease, and the lease says so; a lease
// without it asks nothing.
func clearState(s *suite) {
	t := s.t
	c := s.raw(userA, "raw-1", worker("c1"))
	h := s.acquire(cheetah.AcquireRequest{TaskID: "slate", ClearState: true})
	require.True(t, c.nextAssignment(protocol.AssignmentAssigned).ClearState, "cleared before the first command")
	leases, err := s.m.TaskContexts(s.ctx, userA, "slate")
	require.NoError(t, err)
	require.Len(t, leases, 1)
	require.True(t, leases[0].ClearState)
	ok, err := s.m.Release(s.ctx, h)
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, c.nextAssignment(protocol.AssignmentReleased).ClearState, "cleared when the lease ends")

	h = s.acquire(cheetah.AcquireRequest{TaskID: "plain"})
	require.False(t, c.nextAssignment(protocol.AssignmentAssigned).ClearState)
	_, err = s.m.Release(s.ctx, h)
	require.NoError(t, err)
	require.False(t, c.nextAssignment(protocol.AssignmentReleased).ClearState)
}
