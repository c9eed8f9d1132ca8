package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/server"
)

// do sends a request with key as bearer (none when empty) and decodes a JSON
// answer into out when out is not nil.
func (b *broker) do(method, path, key string, body any, out any, headers ...string) *http.Response {
	b.t.Helper()
	var rd io.Reader
	switch v := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(v)
	default:
		buf, err := json.Marshal(v)
		require.NoError(b.t, err)
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequest(method, b.http.URL+path, rd)
	require.NoError(b.t, err)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i] == "Host" {
			req.Host = headers[i+1]
			continue
		}
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(b.t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(b.t, err)
	if out != nil {
		require.NoError(b.t, json.Unmarshal(raw, out), string(raw))
	}
	return resp
}

type envelope struct {
	Error struct {
		Code, Message, Reason string
	} `json:"error"`
}

// expectError asserts status and the envelope's code and reason.
func (b *broker) expectError(status int, code, reason, method, path, key string, body any, headers ...string) {
	b.t.Helper()
	var env envelope
	resp := b.do(method, path, key, body, &env, headers...)
	require.Equal(b.t, status, resp.StatusCode, "%s %s: %+v", method, path, env)
	require.Equal(b.t, code, env.Error.Code)
	require.Equal(b.t, reason, env.Error.Reason)
	require.NotEmpty(b.t, env.Error.Message)
}

// answer plays the agent: it answers every command with ack, progress and
// a result echoing its params.
func answer(c *wsClient, n int) {
	for range n {
		cmd := next[*protocol.Command](c)
		c.send(&protocol.Ack{CommandID: cmd.CommandID})
		c.send(&protocol.Progress{CommandID: cmd.CommandID, Data: []byte(`{"step":1}`)})
		c.send(&protocol.Result{CommandID: cmd.CommandID, Data: cmd.Params})
	}
}

func TestAPIFlow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	agent := b.connectAgent("agent-1", "flow-1", "flow-2")

	var acq struct{ Lease cheetah.Lease }
	resp := b.do("POST", "/api/v1/acquire", b.appKey, map[string]any{"user_id": user, "task_id": "job-1", "client_type": "console", "ttl_s": 60}, &acq)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	l := acq.Lease
	require.Equal(t, "flow-1", l.ContextID)
	require.Equal(t, 60, l.TTLSeconds)
	require.Len(t, l.LeaseToken, 32)
	next[*protocol.Assignment](agent)

	// commands/wait → completed, and history already has the result.
	go answer(agent, 1)
	var waited struct{ Resolution cheetah.Resolution }
	resp = b.do("POST", "/api/v1/commands/wait", b.appKey, map[string]any{"name": "echo", "params": map[string]any{"hello": "world"}}, &waited, "X-Lease", l.LeaseToken)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, cheetah.StatusCompleted, waited.Resolution.Status)
	require.Regexp(t, `^[0-9a-f]{32}$`, waited.Resolution.TraceID)
	var read struct{ Command cheetah.CommandRecord }
	resp = b.do("GET", "/api/v1/users/"+user+"/commands/"+waited.Resolution.CommandID, b.appKey, nil, &read)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, cheetah.StatusCompleted, read.Command.Status)
	require.Len(t, read.Command.Messages, 3)
	require.JSONEq(t, `{"hello":"world"}`, string(read.Command.Messages[2].Data))
	require.Equal(t, "job-1", read.Command.TaskID)
	require.Equal(t, l.Epoch, read.Command.Epoch)

	// commands (async) → 202 with an id.
	var sent cheetah.Sent
	resp = b.do("POST", "/api/v1/commands", b.appKey, map[string]any{"name": "echo", "params": map[string]any{"n": 2}}, &sent, "X-Lease", l.LeaseToken)
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	require.NotEmpty(t, sent.CommandID)
	answer(agent, 1)

	// renew, available, task leases.
	var renewed struct{ Lease cheetah.Lease }
	resp = b.do("POST", "/api/v1/lease/renew", b.appKey, map[string]any{"ttl_s": 120}, &renewed, "X-Lease", l.LeaseToken)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, 120, renewed.Lease.TTLSeconds)
	var avail struct{ Contexts []cheetah.ContextSnapshot }
	b.do("GET", "/api/v1/users/"+user+"/contexts/available?client_type=console", b.appKey, nil, &avail)
	require.Len(t, avail.Contexts, 1)
	require.Equal(t, "flow-2", avail.Contexts[0].ContextID)
	require.Equal(t, "idle", avail.Contexts[0].State)
	var tl struct{ Leases []cheetah.Lease }
	b.do("GET", "/api/v1/users/"+user+"/tasks/job-1/leases", b.appKey, nil, &tl)
	require.Len(t, tl.Leases, 1)
	require.Empty(t, tl.Leases[0].LeaseToken)

	// list with a cursor, newest first.
	var page cheetah.CommandPage
	b.do("GET", "/api/v1/users/"+user+"/commands?limit=1&task_id=job-1", b.appKey, nil, &page)
	require.Len(t, page.Commands, 1)
	require.Equal(t, sent.CommandID, page.Commands[0].CommandID)
	require.NotEmpty(t, page.NextCursor)
	b.do("GET", "/api/v1/users/"+user+"/commands?limit=1&task_id=job-1&cursor="+page.NextCursor, b.appKey, nil, &page)
	require.Len(t, page.Commands, 1)
	require.Equal(t, waited.Resolution.CommandID, page.Commands[0].CommandID)

	// release, twice; then the handle is lost with its reason.
	var rel struct{ Released bool }
	b.do("POST", "/api/v1/lease/release", b.appKey, nil, &rel, "X-Lease", l.LeaseToken)
	require.True(t, rel.Released)
	b.do("POST", "/api/v1/lease/release", b.appKey, nil, &rel, "X-Lease", l.LeaseToken)
	require.False(t, rel.Released)
	b.expectError(423, "lease_lost", "released", "POST", "/api/v1/commands", b.appKey, map[string]any{"name": "x"}, "X-Lease", l.LeaseToken)

	// release-all counts.
	var a1, a2 struct{ Lease cheetah.Lease }
	b.do("POST", "/api/v1/acquire", b.appKey, map[string]any{"user_id": user, "task_id": "j", "client_type": "console"}, &a1)
	b.do("POST", "/api/v1/acquire", b.appKey, map[string]any{"user_id": user, "task_id": "j", "client_type": "console"}, &a2)
	var all struct{ Released int }
	b.do("POST", "/api/v1/lease/release-all", b.appKey, map[string]any{"lease_tokens": []string{a1.Lease.LeaseToken, a2.Lease.LeaseToken, "bogus"}}, &all)
	require.Equal(t, 2, all.Released)
}

func TestAPIErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *server.Config) { c.MaxBodyBytes = 1024 })
	b.connectAgent("agent-1", "flow-1")
	acq := map[string]any{"user_id": user, "task_id": "t", "client_type": "console"}

	b.expectError(401, "unauthorized", "", "POST", "/api/v1/acquire", "", acq)
	b.expectError(401, "unauthorized", "", "POST", "/api/v1/acquire", "chk_bad_bad", acq)
	b.expectError(403, "forbidden", "", "POST", "/api/v1/acquire", b.client, acq)
	b.expectError(403, "forbidden", "", "GET", "/api/v1/admin/keys", b.appKey, nil)
	b.expectError(400, "invalid_request", "", "POST", "/api/v1/acquire", b.appKey, `{"user_id":`)
	b.expectError(400, "invalid_request", "", "POST", "/api/v1/acquire", b.appKey, map[string]any{"user_id": user, "task_id": "t", "ttl": 5})
	b.expectError(400, "invalid_request", "", "POST", "/api/v1/acquire", b.appKey, map[string]any{"user_id": user, "task_id": "t", "ttl_s": 0})
	b.expectError(400, "invalid_request", "", "POST", "/api/v1/acquire", b.appKey, map[string]any{"user_id": user, "task_id": "t", "ttl_s": 3601})
	b.expectError(400, "invalid_request", "", "POST", "/api/v1/acquire", b.appKey, map[string]any{"user_id": user, "task_id": "t", "wait_ms": 60001})
	b.expectError(400, "invalid_request", "", "POST", "/api/v1/acquire", b.appKey, map[string]any{"user_id": "no spaces", "task_id": "t"})
	b.expectError(413, "payload_too_large", "", "POST", "/api/v1/acquire", b.appKey, map[string]any{"user_id": user, "task_id": strings.Repeat("x", 2000)})
	b.expectError(409, "no_context_available", "no_eligible_client", "POST", "/api/v1/acquire", b.appKey, map[string]any{"user_id": user, "task_id": "t"})
	b.expectError(409, "no_context_available", "placement_miss", "POST", "/api/v1/acquire", b.appKey, map[string]any{"user_id": user, "task_id": "t", "client_type": "console", "client_id": "agent-9"})
	b.expectError(400, "invalid_request", "", "POST", "/api/v1/commands", b.appKey, map[string]any{"name": "x"})
	b.expectError(423, "lease_lost", "unknown_lease", "POST", "/api/v1/commands", b.appKey, map[string]any{"name": "x"}, "X-Lease", "0123")
	b.expectError(404, "not_found", "", "GET", "/api/v1/users/"+user+"/commands/0193aaaa-0000-7000-8000-000000000000", b.appKey, nil)
	b.expectError(404, "not_found", "", "GET", "/api/v1/nowhere", b.appKey, nil)
	// A trailing slash is an unknown path too, answered with the envelope,
	// never a redirect.
	b.expectError(404, "not_found", "", "GET", "/api/v1/users/"+user+"/commands/", b.appKey, nil)
	b.expectError(404, "not_found", "", "POST", "/api/v1/acquire/", b.appKey, map[string]any{})
	b.expectError(400, "invalid_request", "", "GET", "/api/v1/users/"+user+"/commands?limit=0", b.appKey, nil)
	b.expectError(400, "invalid_request", "", "GET", "/api/v1/users/"+user+"/commands?cursor=@@@", b.appKey, nil)

	var l struct{ Lease cheetah.Lease }
	require.Equal(t, 201, b.do("POST", "/api/v1/acquire", b.appKey, acq, &l).StatusCode)
	b.expectError(409, "no_context_available", "no_idle_worker", "POST", "/api/v1/acquire", b.appKey, acq)
	lease := []string{"X-Lease", l.Lease.LeaseToken}
	b.expectError(400, "invalid_request", "", "POST", "/api/v1/commands", b.appKey, map[string]any{"name": ""}, lease...)
	b.expectError(400, "invalid_request", "", "POST", "/api/v1/commands", b.appKey, map[string]any{"name": "x", "target": []int{1}}, lease...)
	b.expectError(400, "invalid_request", "", "POST", "/api/v1/commands", b.appKey, map[string]any{"name": "x", "response_mode": "sometimes"}, lease...)
	b.expectError(400, "invalid_request", "", "POST", "/api/v1/commands", b.appKey, map[string]any{"name": "x", "timeout_ms": 0}, lease...)
	b.expectError(400, "invalid_request", "", "POST", "/api/v1/lease/renew", b.appKey, map[string]any{"ttl_s": 0}, lease...)
	var page cheetah.CommandPage
	b.do("GET", "/api/v1/users/"+user+"/commands", b.appKey, nil, &page)
	require.Empty(t, page.Commands, "no rejected request left a record")
}

func TestWaitCallerGoesAway(t *testing.T) {
	t.Parallel()
	b := setup(t)
	agent := b.connectAgent("agent-1", "flow-1")
	var l struct{ Lease cheetah.Lease }
	b.do("POST", "/api/v1/acquire", b.appKey, map[string]any{"user_id": user, "task_id": "t", "client_type": "console"}, &l)

	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "POST", b.http.URL+"/api/v1/commands/wait", strings.NewReader(`{"name":"slow","timeout_ms":600000}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+b.appKey)
	req.Header.Set("X-Lease", l.Lease.LeaseToken)
	ids, errc := make(chan string, 1), make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			ids <- ""
			errc <- err
			return
		}
		defer resp.Body.Close()
		// The command is named as soon as it is admitted, before the wait.
		ids <- resp.Header.Get("X-Command-Id")
		_, err = io.ReadAll(resp.Body)
		errc <- err
	}()
	cmd := next[*protocol.Command](agent)
	require.Equal(t, cmd.CommandID, <-ids)
	cancel()
	require.Error(t, <-errc)
	cn := next[*protocol.Cancel](agent)
	require.Equal(t, cmd.CommandID, cn.CommandID)
	require.Eventually(t, func() bool {
		var read struct{ Command cheetah.CommandRecord }
		b.do("GET", "/api/v1/users/"+user+"/commands/"+cmd.CommandID, b.appKey, nil, &read)
		return read.Command.Status == cheetah.StatusCancelled
	}, 10*time.Second, 10*time.Millisecond)
}

func TestKeysEndpoints(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var created struct {
		ID, Key, Kind string
	}
	resp := b.do("POST", "/api/v1/admin/keys", b.adminKey, map[string]any{"kind": "app", "name": "backend"}, &created)
	require.Equal(t, 201, resp.StatusCode)
	require.True(t, strings.HasPrefix(created.Key, "chk_"))
	var full map[string]any
	b.do("POST", "/api/v1/admin/keys", b.adminKey, map[string]any{"kind": "app", "name": "b2"}, &full)
	require.True(t, strings.HasPrefix(full["webhook_secret"].(string), "whsec_"))
	b.expectError(400, "invalid_request", "", "POST", "/api/v1/admin/keys", b.adminKey, map[string]any{"kind": "client", "name": "no user"})
	b.expectError(400, "invalid_request", "", "POST", "/api/v1/admin/keys", b.adminKey, map[string]any{"kind": "root", "name": "x"})

	var list struct{ Keys []map[string]any }
	b.do("GET", "/api/v1/admin/keys", b.adminKey, nil, &list)
	require.GreaterOrEqual(t, len(list.Keys), 4)
	for _, k := range list.Keys {
		require.NotContains(t, k, "key", "a listing never shows a secret")
		require.NotContains(t, k, "hash")
	}
	require.Equal(t, 200, b.do("DELETE", "/api/v1/admin/keys/"+full["id"].(string), b.adminKey, nil, nil).StatusCode)
	b.expectError(404, "not_found", "", "DELETE", "/api/v1/admin/keys/"+full["id"].(string), b.adminKey, nil)
}
