package server_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/protocol"
)

// Human control over the wire: a client that declares its effects holds a
// context with a hold frame; an application's mutation is refused 423 held
// with the hold's state, an observation passes, renew shows the hold, and
// after unhold the mutation passes.
func TestHoldOverTheWire(t *testing.T) {
	t.Parallel()
	onBothStores(t, func(t *testing.T, b *broker) {
		c := b.dial().read()
		c.send(&protocol.Hello{Protocol: 1, Token: b.client, ClientID: "agent-1", ClientType: protocol.ClientConsole, Name: "test",
			Effects: map[string]string{"extract": protocol.EffectObserve, "navigate": protocol.EffectMutate}})
		next[*protocol.Welcome](c)
		c.send(&protocol.State{Contexts: []protocol.ContextReport{{ContextID: "flow-1", TabID: "t1", Owner: protocol.OwnerWorker}}})
		// The report is applied soon after it is sent.
		require.Eventually(t, func() bool { return b.reg.Stats().Contexts == 1 }, 10*time.Second, time.Millisecond)
		var acq struct{ Lease cheetah.Lease }
		resp := b.do("POST", "/api/v1/acquire", b.appKey, map[string]any{"user_id": user, "task_id": "job", "client_type": "console"}, &acq)
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		lease := []string{"X-Lease", acq.Lease.LeaseToken}
		next[*protocol.Assignment](c)

		c.send(&protocol.Hold{ContextID: "flow-1", TTLSeconds: 60})
		hs := next[*protocol.HoldStateFrame](c)
		require.Equal(t, protocol.HoldActive, hs.State)

		var env cheetah.Envelope
		resp = b.do("POST", "/api/v1/commands", b.appKey, map[string]any{"name": "navigate"}, &env, lease...)
		require.Equal(t, http.StatusLocked, resp.StatusCode)
		require.Equal(t, cheetah.CodeHeld, env.Error.Code)
		require.Equal(t, "active", env.Error.Details["state"])
		require.NotEmpty(t, env.Error.Details["since"])
		resp = b.do("POST", "/api/v1/commands", b.appKey, map[string]any{"name": "extract"}, nil, lease...)
		require.Equal(t, http.StatusAccepted, resp.StatusCode)
		answer(c, 1)
		var renewed struct{ Lease cheetah.Lease }
		b.do("POST", "/api/v1/lease/renew", b.appKey, map[string]any{}, &renewed, lease...)
		require.NotNil(t, renewed.Lease.Held)
		require.Equal(t, cheetah.HoldActive, renewed.Lease.Held.State)

		c.send(&protocol.Unhold{ContextID: "flow-1"})
		require.Equal(t, protocol.HoldEnded, next[*protocol.HoldStateFrame](c).State)
		resp = b.do("POST", "/api/v1/commands", b.appKey, map[string]any{"name": "navigate"}, nil, lease...)
		require.Equal(t, http.StatusAccepted, resp.StatusCode)
		answer(c, 1)

	})
}

// POST /api/v1/lease/wait: 200 alive while the lease lives, 423 lease_lost
// with the reason once it ended, 400 for a bad timeout.
func TestLeaseWait(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.connectAgent("agent-1", "flow-1")
	var acq struct{ Lease cheetah.Lease }
	b.do("POST", "/api/v1/acquire", b.appKey, map[string]any{"user_id": user, "task_id": "job", "client_type": "console"}, &acq)
	next[*protocol.Assignment](c)
	lease := []string{"X-Lease", acq.Lease.LeaseToken}
	var alive cheetah.LeaseWaitAnswer
	resp := b.do("POST", "/api/v1/lease/wait", b.appKey, map[string]any{"timeout_ms": 10}, &alive, lease...)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.True(t, alive.Alive)
	b.expectError(400, "invalid_request", "", "POST", "/api/v1/lease/wait", b.appKey, map[string]any{"timeout_ms": -1}, lease...)
	b.expectError(400, "invalid_request", "", "POST", "/api/v1/lease/wait", b.appKey, map[string]any{"timeout_ms": 60001}, lease...)
	b.expectError(400, "invalid_request", "", "POST", "/api/v1/lease/wait", b.appKey, map[string]any{})
	b.expectError(423, "lease_lost", "unknown_lease", "POST", "/api/v1/lease/wait", b.appKey, map[string]any{}, "X-Lease", "0123456789abcdef0123456789abcdef")
	b.do("POST", "/api/v1/lease/release", b.appKey, nil, nil, lease...)
	b.expectError(423, "lease_lost", "released", "POST", "/api/v1/lease/wait", b.appKey, map[string]any{}, lease...)
}
