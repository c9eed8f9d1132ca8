package rig

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cheetahbroker/cheetah/protocol"
)

func assigned(ctx string, e int64) *protocol.Assignment {
	return &protocol.Assignment{ContextID: ctx, TaskID: "t", Epoch: e, State: protocol.AssignmentAssigned}
}

func ended(ctx string, e int64, s protocol.AssignmentState) *protocol.Assignment {
	return &protocol.Assignment{ContextID: ctx, TaskID: "t", Epoch: e, State: s}
}

func command(ctx, id string, e int64, params string) *protocol.Command {
	return &protocol.Command{CommandID: id, ContextID: ctx, TaskID: "t", Epoch: e, Name: "n", ResponseMode: protocol.ResponseAsync, Params: []byte(params)}
}

// TestChecker makes sure the soak's checker is not vacuous: it accepts
// what the broker may send and refuses what it must not.
func TestChecker(t *testing.T) {
	const p = "u/c/"
	good := NewChecker()
	for _, f := range []protocol.Frame{
		assigned("x", 1), command("x", "a", 1, `{"seq":1}`), command("x", "b", 1, `{"seq":2}`), ended("x", 1, protocol.AssignmentReleased),
		assigned("x", 5), command("x", "c", 5, `{"seq":1}`), ended("x", 5, protocol.AssignmentRevoked),
		assigned("y", 3), // another context, an epoch lower than x's: fine
	} {
		good.See(p, f)
	}
	good.Reconnected(p)
	good.See(p, assigned("y", 3)) // sent again after the reconnect
	good.See(p, ended("y", 3, protocol.AssignmentExpired))
	good.Reconnected(p)
	good.See(p, ended("x", 9, protocol.AssignmentReleased)) // its assigned was lost with the old connection
	require.Empty(t, good.Errors())

	bad := map[string][]protocol.Frame{
		"two leases interleaved":  {assigned("x", 1), assigned("x", 2)},
		"older epoch after newer": {assigned("x", 2), ended("x", 2, protocol.AssignmentReleased), assigned("x", 1)},
		"command of an old epoch": {assigned("x", 2), command("x", "a", 1, `{}`)},
		"command with no lease":   {assigned("x", 2), ended("x", 2, protocol.AssignmentReleased), command("x", "a", 2, `{}`)},
		"out of admission order":  {assigned("x", 2), command("x", "a", 2, `{"seq":2}`), command("x", "b", 2, `{"seq":1}`)},
		"delivered twice":         {assigned("x", 2), command("x", "a", 2, `{}`), command("x", "a", 2, `{}`)},
		"end of another epoch":    {assigned("x", 2), ended("x", 1, protocol.AssignmentReleased)},
		"epoch reused":            {assigned("x", 2), ended("x", 2, protocol.AssignmentReleased), assigned("x", 2)},
	}
	for name, frames := range bad {
		k := NewChecker()
		for _, f := range frames {
			k.See(p, f)
		}
		require.NotEmpty(t, k.Errors(), name)
	}

	// The end of an older lease after the assignment of a newer one (an old
	// bug of the broker's, fixed) is a violation like any other.
	k := NewChecker()
	for _, f := range []protocol.Frame{assigned("x", 1), assigned("x", 2), ended("x", 2, protocol.AssignmentReleased), ended("x", 1, protocol.AssignmentContextGone)} {
		k.See(p, f)
	}
	require.NotEmpty(t, k.Errors())
}
