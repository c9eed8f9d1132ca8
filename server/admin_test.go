package server_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/server"
)

func TestAdminViews(t *testing.T) {
	t.Parallel()
	b := setup(t)
	agent := b.connectAgent("agent-1", "flow-1", "flow-2")
	var acq struct{ Lease cheetah.Lease }
	require.Equal(t, 201, b.do("POST", "/api/v1/acquire", b.appKey, map[string]any{"user_id": user, "task_id": "job", "client_type": "console"}, &acq).StatusCode)
	// The client hears of it before the revoke below: notices of one
	// context not yet written are coalesced, and an assignment revoked
	// before it leaves is never sent.
	a := next[*protocol.Assignment](agent) // assigned
	require.Equal(t, protocol.AssignmentAssigned, a.State)

	var pools struct{ Pools []registry.PoolView }
	require.Equal(t, 200, b.do("GET", "/api/v1/admin/pools", b.adminKey, nil, &pools).StatusCode)
	require.Len(t, pools.Pools, 1)
	require.Equal(t, map[string]int{"idle": 1, "leased": 1, "not_live": 0, "human": 0}, pools.Pools[0].Contexts)
	require.Equal(t, 1, pools.Pools[0].Clients)

	var clients struct{ Clients []registry.ClientView }
	b.do("GET", "/api/v1/admin/clients?user_id="+user, b.adminKey, nil, &clients)
	require.Len(t, clients.Clients, 1)
	require.True(t, clients.Clients[0].Connected)
	require.Equal(t, 2, clients.Clients[0].Contexts)
	b.do("GET", "/api/v1/admin/clients?user_id=usr_other", b.adminKey, nil, &clients)
	require.Empty(t, clients.Clients)

	var raw map[string]any
	b.do("GET", "/api/v1/admin/leases?user_id="+user+"&task_id=job", b.adminKey, nil, &raw)
	require.NotContains(t, fmt.Sprint(raw), acq.Lease.LeaseToken, "admin views never show a token")
	var leases struct{ Leases []cheetah.Lease }
	b.do("GET", "/api/v1/admin/leases?user_id="+user, b.adminKey, nil, &leases)
	require.Len(t, leases.Leases, 1)
	require.Equal(t, acq.Lease.Epoch, leases.Leases[0].Epoch)

	var rv struct{ Revoked bool }
	path := "/api/v1/admin/users/" + user + "/clients/agent-1/contexts/" + acq.Lease.ContextID + "/revoke"
	b.do("POST", path, b.adminKey, nil, &rv)
	require.True(t, rv.Revoked)
	require.Equal(t, protocol.AssignmentRevoked, next[*protocol.Assignment](agent).State)
	b.expectError(423, "lease_lost", "revoked", "POST", "/api/v1/commands", b.appKey, map[string]any{"name": "x"}, "X-Lease", acq.Lease.LeaseToken)
	b.do("POST", path, b.adminKey, nil, &rv)
	require.False(t, rv.Revoked)

	var dc struct{ Disconnected bool }
	b.do("DELETE", "/api/v1/admin/users/"+user+"/clients/agent-1", b.adminKey, nil, &dc)
	require.True(t, dc.Disconnected)
	agent.expectClose(protocol.CloseForbidden)
	b.do("DELETE", "/api/v1/admin/users/"+user+"/clients/nobody", b.adminKey, nil, &dc)
	require.False(t, dc.Disconnected)
}

// TestAuthorizationMatrix sends every endpoint every kind of key.
func TestAuthorizationMatrix(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rk, err := b.keys.Create(context.Background(), "app", "", "to revoke")
	require.NoError(t, err)
	_, err = b.keys.Revoke(context.Background(), rk.ID)
	require.NoError(t, err)
	revoked := rk.Secret
	type endpoint struct{ method, path string }
	app := []endpoint{
		{"POST", "/api/v1/acquire"}, {"POST", "/api/v1/commands"}, {"POST", "/api/v1/commands/wait"},
		{"POST", "/api/v1/lease/renew"}, {"POST", "/api/v1/lease/release"}, {"POST", "/api/v1/lease/release-all"},
		{"GET", "/api/v1/users/" + user + "/contexts/available"}, {"GET", "/api/v1/users/" + user + "/tasks/t/leases"},
		{"GET", "/api/v1/users/" + user + "/commands/x"}, {"GET", "/api/v1/users/" + user + "/commands"},
	}
	admin := []endpoint{
		{"GET", "/api/v1/admin/pools"}, {"GET", "/api/v1/admin/clients"}, {"GET", "/api/v1/admin/leases"},
		{"POST", "/api/v1/admin/users/" + user + "/clients/c/contexts/x/revoke"},
		{"DELETE", "/api/v1/admin/users/" + user + "/clients/c"},
		{"POST", "/api/v1/admin/keys"}, {"GET", "/api/v1/admin/keys"}, {"DELETE", "/api/v1/admin/keys/nope"},
	}
	allowed := func(status int) bool { return status != 401 && status != 403 }
	for _, e := range append(app, admin...) {
		isAdmin := strings.HasPrefix(e.path, "/api/v1/admin/")
		for name, tc := range map[string]struct {
			key    string
			status int // the expected status, or 0 for "allowed"
		}{
			"no key":      {"", 401},
			"bad key":     {"chk_0000_bad", 401},
			"client key":  {b.client, 403},
			"revoked key": {revoked, 401},
			"app key":     {b.appKey, map[bool]int{true: 403, false: 0}[isAdmin]},
			"admin key":   {b.adminKey, 0},
		} {
			resp := b.do(e.method, e.path, tc.key, "{}", nil)
			if tc.status == 0 {
				require.True(t, allowed(resp.StatusCode), "%s %s with %s: %d", e.method, e.path, name, resp.StatusCode)
			} else {
				require.Equal(t, tc.status, resp.StatusCode, "%s %s with %s", e.method, e.path, name)
			}
		}
	}
	// Unauthenticated endpoints.
	for _, p := range []string{"/healthz", "/readyz"} {
		require.Equal(t, http.StatusOK, b.do("GET", p, "", nil, nil).StatusCode, p)
	}
}

// TestCrossUser: nothing of one user is visible through another user's
// paths; a lookup across users answers not found.
func TestCrossUser(t *testing.T) {
	t.Parallel()
	b := setup(t)
	agent := b.connectAgent("agent-1", "flow-1")
	var acq struct{ Lease cheetah.Lease }
	b.do("POST", "/api/v1/acquire", b.appKey, map[string]any{"user_id": user, "task_id": "job", "client_type": "console"}, &acq)
	var sent cheetah.Sent
	require.Equal(t, 202, b.do("POST", "/api/v1/commands", b.appKey, map[string]any{"name": "echo"}, &sent, "X-Lease", acq.Lease.LeaseToken).StatusCode)
	answer(agent, 1)

	other := "usr_2222"
	b.expectError(404, "not_found", "", "GET", "/api/v1/users/"+other+"/commands/"+sent.CommandID, b.appKey, nil)
	var page cheetah.CommandPage
	b.do("GET", "/api/v1/users/"+other+"/commands", b.appKey, nil, &page)
	require.Empty(t, page.Commands)
	var avail struct{ Contexts []cheetah.ContextSnapshot }
	b.do("GET", "/api/v1/users/"+other+"/contexts/available", b.appKey, nil, &avail)
	require.Empty(t, avail.Contexts)
	var tl struct{ Leases []cheetah.Lease }
	b.do("GET", "/api/v1/users/"+other+"/tasks/job/leases", b.appKey, nil, &tl)
	require.Empty(t, tl.Leases)
	b.expectError(409, "no_context_available", "no_eligible_client", "POST", "/api/v1/acquire", b.appKey, map[string]any{"user_id": other, "task_id": "job", "client_type": "console"})
	var rv struct{ Revoked bool }
	b.do("POST", "/api/v1/admin/users/"+other+"/clients/agent-1/contexts/flow-1/revoke", b.adminKey, nil, &rv)
	require.False(t, rv.Revoked, "a path naming another user reaches nothing")
}

func TestStateReportBound(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *server.Config) { c.MaxContextsPerClient = 4 })
	c := b.dial().read()
	c.hello(b.client, "a", protocol.ClientConsole)
	report := func(n int) {
		var reps []protocol.ContextReport
		for i := range n {
			reps = append(reps, protocol.ContextReport{ContextID: fmt.Sprintf("w%d", i), Owner: protocol.OwnerWorker})
		}
		c.send(&protocol.State{Contexts: reps})
	}
	report(4) // at the bound
	c.send(&protocol.Ping{})
	next[*protocol.Pong](c)
	avail, err := b.reg.ListAvailable(context.Background(), user, cheetah.Console)
	require.NoError(t, err)
	require.Len(t, avail, 4)
	report(5) // one past it
	require.Equal(t, server.CodeTooManyContexts, next[*protocol.Error](c).Code)
	avail, _ = b.reg.ListAvailable(context.Background(), user, cheetah.Console)
	require.Len(t, avail, 4, "the refused report changed nothing")
}

func TestOriginAndHost(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *server.Config) {
		c.AllowedOrigins = []string{"chrome-extension://abcdef"}
		c.LoopbackOnly = true
	})
	ws := strings.Replace(b.http.URL, "http", "ws", 1) + "/ws/v1/client"
	status := func(origin, host string) int {
		req, _ := http.NewRequest("GET", ws, nil)
		req.URL.Scheme = "http"
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		req.Header.Set("Sec-WebSocket-Version", "13")
		req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		if host != "" {
			req.Host = host
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusSwitchingProtocols, status("chrome-extension://abcdef", ""))
	require.Equal(t, http.StatusSwitchingProtocols, status("", ""), "a console agent sends no Origin")
	require.Equal(t, http.StatusForbidden, status("https://evil.example", ""))
	require.Equal(t, http.StatusForbidden, status("chrome-extension://abcdef", "evil.example:8420"), "DNS rebinding")
	require.Equal(t, http.StatusSwitchingProtocols, status("chrome-extension://abcdef", "localhost:8420"))
	require.Equal(t, http.StatusForbidden, b.do("GET", "/healthz", "", nil, nil, "Host", "rebind.example").StatusCode)
}

// TestAdminCutDetachesAtOnce: a client an admin disconnects, or whose key is
// revoked, stops being live when the answer comes back, not when its close
// handshake ends: these clients read only when the test says, so the
// broker's close handshake is still waiting for them when the test looks.
func TestAdminCutDetachesAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var key struct {
		ID  string `json:"id"`
		Key string `json:"key"`
	}
	require.Equal(t, 201, b.do("POST", "/api/v1/admin/keys", b.adminKey, map[string]any{"kind": "client", "user_id": user, "name": "k"}, &key).StatusCode)
	acquire := map[string]any{"user_id": user, "task_id": "job", "client_type": "console"}
	for _, cut := range []struct {
		name, method, path string
	}{
		{"admin disconnect", "DELETE", "/api/v1/admin/users/" + user + "/clients/agent-1"},
		{"key revoked", "DELETE", "/api/v1/admin/keys/" + key.ID},
	} {
		c := b.dial()
		readOne := func() (protocol.Frame, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, raw, err := c.conn.Read(ctx)
			if err != nil {
				return nil, err
			}
			return protocol.Decode(raw)
		}
		c.send(&protocol.Hello{Protocol: 1, Token: key.Key, ClientID: "agent-1", ClientType: protocol.ClientConsole, Name: "test"})
		f, err := readOne()
		require.NoError(t, err)
		require.IsType(t, &protocol.Welcome{}, f)
		c.send(&protocol.State{Contexts: []protocol.ContextReport{{ContextID: "flow-1", Owner: protocol.OwnerWorker}}})
		c.send(&protocol.Ping{})
		f, err = readOne()
		require.NoError(t, err)
		require.IsType(t, &protocol.Pong{}, f, "the report is applied")

		var lease struct{ Lease cheetah.Lease }
		require.Equal(t, 201, b.do("POST", "/api/v1/acquire", b.appKey, acquire, &lease).StatusCode, cut.name)
		require.Equal(t, 200, b.do(cut.method, cut.path, b.adminKey, nil, nil).StatusCode, cut.name)
		var clients struct{ Clients []registry.ClientView }
		b.do("GET", "/api/v1/admin/clients?user_id="+user, b.adminKey, nil, &clients)
		require.Len(t, clients.Clients, 1)
		require.False(t, clients.Clients[0].Connected, "%s: still attached", cut.name)
		b.expectError(423, "lease_lost", "not_live", "POST", "/api/v1/commands", b.appKey, map[string]any{"name": "x"},
			"X-Lease", lease.Lease.LeaseToken)

		for { // the lease's assignment, then the error frame of the close
			f, err = readOne()
			require.NoError(t, err)
			if e, ok := f.(*protocol.Error); ok {
				require.Equal(t, protocol.CloseForbidden.ErrorCode(), e.Code, cut.name)
				break
			}
		}
		_, err = readOne()
		var ce websocket.CloseError
		require.ErrorAs(t, err, &ce, cut.name)
		require.Equal(t, websocket.StatusCode(protocol.CloseForbidden), ce.Code, cut.name)
		ok, err := b.reg.Release(context.Background(), lease.Lease)
		require.NoError(t, err)
		require.True(t, ok, "released during the grace")
	}
}
