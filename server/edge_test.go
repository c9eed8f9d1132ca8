package server_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/server"
)

func deep(n int) string { return strings.Repeat(`{"a":`, n) + "1" + strings.Repeat("}", n) }

// edgeCase is one request that must be refused at the edge with a 4xx.
type edgeCase struct {
	name         string
	method, path string
	body         string
	lease        bool // sends X-Lease with the test's lease
	admin        bool
	status       int    // 400 unless set
	code         string // invalid_request unless set
	msg          string // part of the message, when set
}

// TestBadInputIsRefusedAtTheEdge sends, to every route that takes it, a
// NUL, invalid UTF-8, a value nested too deep, a member named twice, a
// malformed id or a member of the wrong kind. Each one is a clear 400 (never
// a 5xx, never an empty 200), on both stores; the broker then still works,
// and nothing refused was recorded.
func TestBadInputIsRefusedAtTheEdge(t *testing.T) {
	t.Parallel()
	onBothStores(t, func(t *testing.T, b *broker) {
		agent := b.connectAgent("edge-agent", "edge-1")
		var l struct{ Lease cheetah.Lease }
		acq := `{"user_id":"` + user + `","task_id":"edge","client_type":"console"}`
		require.Equal(t, 201, b.do("POST", "/api/v1/acquire", b.appKey, acq, &l).StatusCode)
		u := "/api/v1/users/" + user
		a := "/api/v1/admin"
		cases := []edgeCase{
			// NUL in every string that reaches the store.
			{name: "nul task_id", method: "POST", path: "/api/v1/acquire", body: `{"user_id":"` + user + `","task_id":"t\u0000"}`, msg: "task_id"},
			{name: "nul user_id", method: "POST", path: "/api/v1/acquire", body: `{"user_id":"u\u0000","task_id":"t"}`, msg: "user_id"},
			{name: "nul client_id", method: "POST", path: "/api/v1/acquire", body: `{"user_id":"` + user + `","task_id":"t","client_id":"c\u0000"}`, msg: "client_id"},
			{name: "nul label key", method: "POST", path: "/api/v1/acquire", body: `{"user_id":"` + user + `","task_id":"t","labels":{"a\u0000":"b"}}`, msg: "labels"},
			{name: "nul label value", method: "POST", path: "/api/v1/acquire", body: `{"user_id":"` + user + `","task_id":"t","labels":{"a":"\u0000"}}`, msg: "labels"},
			{name: "nul command name", method: "POST", path: "/api/v1/commands", lease: true, body: `{"name":"n\u0000"}`, msg: "name"},
			{name: "nul command name, wait", method: "POST", path: "/api/v1/commands/wait", lease: true, body: `{"name":"n\u0000"}`, msg: "name"},
			{name: "nul response_mode", method: "POST", path: "/api/v1/commands", lease: true, body: `{"name":"n","response_mode":"rpc\u0000"}`},
			{name: "nul lease token", method: "POST", path: "/api/v1/lease/release-all", body: `{"lease_tokens":["a\u0000"]}`, msg: "lease_tokens"},
			{name: "nul key name", method: "POST", path: a + "/keys", admin: true, body: `{"kind":"app","name":"k\u0000"}`, msg: "name"},
			{name: "nul key kind", method: "POST", path: a + "/keys", admin: true, body: `{"kind":"app\u0000","name":"k"}`},
			{name: "nul path user", method: "GET", path: "/api/v1/users/u%00/commands", msg: "user_id"},
			{name: "nul path command", method: "GET", path: u + "/commands/c%00", status: 404, code: cheetah.CodeNotFound},
			{name: "bad utf-8 path command", method: "GET", path: u + "/commands/c%ff", status: 404, code: cheetah.CodeNotFound},
			{name: "nul path task", method: "GET", path: u + "/tasks/t%00/leases", msg: "task_id"},
			{name: "nul query task", method: "GET", path: u + "/commands?task_id=t%00", msg: "task_id"},
			{name: "nul query cursor", method: "GET", path: u + "/commands?cursor=%00", msg: "cursor"},
			{name: "nul query client_type", method: "GET", path: u + "/contexts/available?client_type=%00", msg: "client_type"},
			{name: "nul admin clients", method: "GET", path: a + "/clients?user_id=%00", admin: true, msg: "user_id"},
			{name: "nul admin leases user", method: "GET", path: a + "/leases?user_id=%00", admin: true, msg: "user_id"},
			{name: "nul admin leases task", method: "GET", path: a + "/leases?task_id=%00", admin: true, msg: "task_id"},
			{name: "nul admin revoke", method: "POST", path: a + "/users/" + user + "/clients/edge-agent/contexts/x%00/revoke", admin: true, msg: "context_id"},
			{name: "nul admin disconnect", method: "DELETE", path: a + "/users/" + user + "/clients/c%00", admin: true, msg: "client_id"},
			{name: "nul admin key id", method: "DELETE", path: a + "/keys/k%00", admin: true, msg: "id"},
			{name: "empty label key", method: "POST", path: "/api/v1/acquire", body: `{"user_id":"` + user + `","task_id":"t","labels":{"":"b"}}`, msg: "labels"},
			{name: "long label key", method: "POST", path: "/api/v1/acquire", body: `{"user_id":"` + user + `","task_id":"t","labels":{"` + strings.Repeat("k", cheetah.MaxLabelKeyLen+1) + `":"b"}}`, msg: "labels"},
			{name: "long label value", method: "POST", path: "/api/v1/acquire", body: `{"user_id":"` + user + `","task_id":"t","labels":{"k":"` + strings.Repeat("v", cheetah.MaxLabelValueLen+1) + `"}}`, msg: "labels"},
			// Invalid UTF-8, raw or as an escape that names no character.
			{name: "bad utf-8 task_id", method: "POST", path: "/api/v1/acquire", body: "{\"user_id\":\"" + user + "\",\"task_id\":\"t\xff\"}", msg: "UTF-8"},
			{name: "bad utf-8 in params", method: "POST", path: "/api/v1/commands", lease: true, body: "{\"name\":\"n\",\"params\":{\"s\":\"\xc3\x28\"}}", msg: "UTF-8"},
			{name: "lone surrogate in params", method: "POST", path: "/api/v1/commands", lease: true, body: `{"name":"n","params":{"s":"\ud800"}}`, msg: "params"},
			{name: "lone surrogate in name", method: "POST", path: "/api/v1/commands", lease: true, body: `{"name":"\udc00"}`, msg: "name"},
			{name: "bad utf-8 path task", method: "GET", path: u + "/tasks/t%ff/leases", msg: "task_id"},
			{name: "bad utf-8 query", method: "GET", path: u + "/commands?cursor=%ff", msg: "cursor"},
			// Depth.
			{name: "params too deep", method: "POST", path: "/api/v1/commands", lease: true, body: `{"name":"n","params":` + deep(protocol.MaxJSONDepth+1) + `}`, msg: "params nests deeper than 64"},
			{name: "params 5000 deep", method: "POST", path: "/api/v1/commands", lease: true, body: `{"name":"n","params":` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `}`, msg: "params"},
			{name: "target too deep", method: "POST", path: "/api/v1/commands/wait", lease: true, body: `{"name":"n","target":` + deep(protocol.MaxJSONDepth+1) + `}`, msg: "target"},
			{name: "options too deep", method: "POST", path: "/api/v1/commands", lease: true, body: `{"name":"n","options":` + deep(protocol.MaxJSONDepth+1) + `}`, msg: "options"},
			// Members named twice.
			{name: "duplicate user_id", method: "POST", path: "/api/v1/acquire", body: `{"user_id":"a","user_id":"` + user + `","task_id":"t"}`, msg: `"user_id" twice`},
			{name: "duplicate label", method: "POST", path: "/api/v1/acquire", body: `{"user_id":"` + user + `","task_id":"t","labels":{"a":"1","a":"2"}}`, msg: "labels"},
			{name: "duplicate in params", method: "POST", path: "/api/v1/commands", lease: true, body: `{"name":"n","params":{"x":1,"x":2}}`, msg: "params"},
			{name: "duplicate name", method: "POST", path: "/api/v1/commands/wait", lease: true, body: `{"name":"a","name":"b"}`, msg: `"name" twice`},
			{name: "duplicate ttl_s", method: "POST", path: "/api/v1/lease/renew", lease: true, body: `{"ttl_s":10,"ttl_s":20}`},
			{name: "duplicate lease_tokens", method: "POST", path: "/api/v1/lease/release-all", body: `{"lease_tokens":[],"lease_tokens":["x"]}`},
			{name: "duplicate kind", method: "POST", path: a + "/keys", admin: true, body: `{"kind":"admin","kind":"app","name":"k"}`},
			// Malformed ids: the same 400 on every route.
			{name: "bad user id, available", method: "GET", path: "/api/v1/users/no!/contexts/available", msg: "user_id"},
			{name: "bad user id, task leases", method: "GET", path: "/api/v1/users/no!/tasks/t/leases", msg: "user_id"},
			{name: "long task id, task leases", method: "GET", path: u + "/tasks/" + strings.Repeat("t", cheetah.MaxTaskIDLen+1) + "/leases", msg: "task_id"},
			{name: "bad user id, commands", method: "GET", path: "/api/v1/users/no!/commands", msg: "user_id"},
			{name: "long task id, commands", method: "GET", path: u + "/commands?task_id=" + strings.Repeat("t", cheetah.MaxTaskIDLen+1), msg: "task_id"},
			{name: "bad command id", method: "GET", path: u + "/commands/no!", status: 404, code: cheetah.CodeNotFound},
			{name: "bad user id, admin clients", method: "GET", path: a + "/clients?user_id=no!", admin: true, msg: "user_id"},
			{name: "bad user id, admin leases", method: "GET", path: a + "/leases?user_id=no!", admin: true, msg: "user_id"},
			{name: "bad user id, admin revoke", method: "POST", path: a + "/users/no!/clients/edge-agent/contexts/edge-1/revoke", admin: true, msg: "user_id"},
			{name: "bad client id, admin revoke", method: "POST", path: a + "/users/" + user + "/clients/no!/contexts/edge-1/revoke", admin: true, msg: "client_id"},
			{name: "bad user id, admin disconnect", method: "DELETE", path: a + "/users/no!/clients/edge-agent", admin: true, msg: "user_id"},
			{name: "bad client id, admin disconnect", method: "DELETE", path: a + "/users/" + user + "/clients/no!", admin: true, msg: "client_id"},
			// Kinds: the member and what it must be, never a Go type.
			{name: "ttl_s a string", method: "POST", path: "/api/v1/acquire", body: `{"user_id":"` + user + `","task_id":"t","ttl_s":"5"}`, msg: "ttl_s must be an integer"},
			{name: "ttl_s a fraction", method: "POST", path: "/api/v1/lease/renew", lease: true, body: `{"ttl_s":1.5}`, msg: "ttl_s must be an integer"},
			{name: "labels an array", method: "POST", path: "/api/v1/acquire", body: `{"user_id":"` + user + `","task_id":"t","labels":[1]}`, msg: "labels must be an object of strings"},
			{name: "label value a number", method: "POST", path: "/api/v1/acquire", body: `{"user_id":"` + user + `","task_id":"t","labels":{"a":1}}`, msg: "labels must be an object of strings"},
			{name: "renew_on_use a string", method: "POST", path: "/api/v1/acquire", body: `{"user_id":"` + user + `","task_id":"t","renew_on_use":"yes"}`, msg: "renew_on_use must be true or false"},
			{name: "lease_tokens a string", method: "POST", path: "/api/v1/lease/release-all", body: `{"lease_tokens":"x"}`, msg: "lease_tokens must be an array of strings"},
			{name: "timeout_ms too large", method: "POST", path: "/api/v1/commands", lease: true, body: `{"name":"n","timeout_ms":3600001}`, msg: "timeout_ms must be a whole number from 1 to 3600000"},
			{name: "body an array", method: "POST", path: "/api/v1/acquire", body: `[]`, msg: "body must be a JSON object"},
			{name: "unknown member", method: "POST", path: "/api/v1/acquire", body: `{"user_id":"` + user + `","task_id":"t","ttl":5}`, msg: `unknown member "ttl"`},
		}
		for _, tc := range cases {
			key := b.appKey
			if tc.admin {
				key = b.adminKey
			}
			var headers []string
			if tc.lease {
				headers = []string{"X-Lease", l.Lease.LeaseToken}
			}
			var body any
			if tc.body != "" {
				body = tc.body
			}
			var env envelope
			resp := b.do(tc.method, tc.path, key, body, &env, headers...)
			status, code := tc.status, tc.code
			if status == 0 {
				status, code = 400, cheetah.CodeInvalidRequest
			}
			require.Equal(t, status, resp.StatusCode, "%s: %+v", tc.name, env)
			require.Equal(t, code, env.Error.Code, tc.name)
			require.Contains(t, env.Error.Message, tc.msg, tc.name)
			for _, internal := range []string{"Go ", "struct", "int64", "json:", "jsontext", "reflect", "\x00"} {
				require.NotContains(t, env.Error.Message, internal, tc.name)
			}
		}

		// Nothing refused was recorded, and the broker still works: a send
		// with params at the depth limit, holding a \u0000 escape (JSON is
		// stored as text), is admitted, dispatched and read back as sent.
		params := `{"s":"a\u0000b","d":` + deep(protocol.MaxJSONDepth-1) + `}`
		var sent cheetah.Sent
		resp := b.do("POST", "/api/v1/commands", b.appKey, `{"name":"echo","params":`+params+`}`, &sent, "X-Lease", l.Lease.LeaseToken)
		require.Equal(t, 202, resp.StatusCode)
		answer(agent, 1)
		var rec struct{ Command cheetah.CommandRecord }
		require.Eventually(t, func() bool {
			b.do("GET", "/api/v1/users/"+user+"/commands/"+sent.CommandID, b.appKey, nil, &rec)
			return rec.Command.Status == cheetah.StatusCompleted
		}, 10*time.Second, 20*time.Millisecond)
		require.JSONEq(t, params, string(rec.Command.Params))
		var page cheetah.CommandPage
		require.Equal(t, 200, b.do("GET", "/api/v1/users/"+user+"/commands", b.appKey, nil, &page).StatusCode)
		require.Len(t, page.Commands, 1, "no refused request left a record")
		var leases struct{ Leases []cheetah.Lease }
		b.do("GET", "/api/v1/admin/leases", b.adminKey, nil, &leases)
		require.Len(t, leases.Leases, 1, "no refused acquire left a lease")
	})
}

// TestWrongMethod: a known path asked with another method is 405 with an
// Allow header and the envelope, not 404.
func TestWrongMethod(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct{ method, path, allow string }{
		{"GET", "/api/v1/acquire", "POST"},
		{"PUT", "/api/v1/commands", "POST"},
		{"GET", "/api/v1/commands/wait", "POST"},
		{"DELETE", "/api/v1/lease/renew", "POST"},
		{"POST", "/api/v1/users/" + user + "/commands", "GET"},
		{"DELETE", "/api/v1/users/" + user + "/commands/x", "GET"},
		{"POST", "/api/v1/users/" + user + "/tasks/t/leases", "GET"},
		{"POST", "/api/v1/admin/pools", "GET"},
		{"GET", "/api/v1/admin/users/" + user + "/clients/c/contexts/x/revoke", "POST"},
		{"PUT", "/api/v1/admin/keys", "GET, POST"},
		{"GET", "/api/v1/admin/keys/k1", "DELETE"},
		{"POST", "/healthz", "GET"},
		{"POST", "/metrics", "GET"},
	} {
		var env envelope
		resp := b.do(tc.method, tc.path, b.adminKey, nil, &env)
		require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "%s %s", tc.method, tc.path)
		require.Equal(t, cheetah.CodeMethodNotAllowed, env.Error.Code)
		require.Contains(t, env.Error.Message, tc.method)
		require.ElementsMatch(t, strings.Split(tc.allow, ", "), strings.Split(resp.Header.Get("Allow"), ", "), "%s %s", tc.method, tc.path)
		require.Contains(t, resp.Header.Get("Content-Type"), "application/json")
	}
	b.expectError(404, "not_found", "", "GET", "/api/v1/nowhere", b.appKey, nil)
}

// TestBearerScheme: the scheme is case-insensitive, and every 401 says
// WWW-Authenticate: Bearer.
func TestBearerScheme(t *testing.T) {
	t.Parallel()
	b := setup(t)
	path := "/api/v1/users/" + user + "/commands"
	for _, scheme := range []string{"Bearer", "bearer", "BEARER", "bEaReR"} {
		resp := b.do("GET", path, "", nil, nil, "Authorization", scheme+" "+b.appKey)
		require.Equal(t, 200, resp.StatusCode, scheme)
		require.Empty(t, resp.Header.Get("WWW-Authenticate"))
	}
	for _, h := range []string{"", "Bearer", "Bearer ", "Basic " + b.appKey, "Bearer not-a-key", "Token " + b.appKey, b.appKey} {
		var env envelope
		headers := []string{}
		if h != "" {
			headers = []string{"Authorization", h}
		}
		resp := b.do("GET", path, "", nil, &env, headers...)
		require.Equal(t, 401, resp.StatusCode, h)
		require.Equal(t, cheetah.CodeUnauthorized, env.Error.Code)
		require.Equal(t, "Bearer", resp.Header.Get("WWW-Authenticate"), h)
	}
	resp := b.do("GET", "/api/v1/admin/keys", "", nil, nil)
	require.Equal(t, "Bearer", resp.Header.Get("WWW-Authenticate"))
}

// TestWaitContentType: the answer of commands/wait, whose headers go early,
// says it is JSON like every other answer.
func TestWaitContentType(t *testing.T) {
	t.Parallel()
	b := setup(t)
	agent := b.connectAgent("wait-agent", "wait-1")
	var l struct{ Lease cheetah.Lease }
	require.Equal(t, 201, b.do("POST", "/api/v1/acquire", b.appKey, map[string]any{"user_id": user, "task_id": "w", "client_type": "console"}, &l).StatusCode)
	go answer(agent, 1)
	var out struct{ Resolution cheetah.Resolution }
	resp := b.do("POST", "/api/v1/commands/wait", b.appKey, `{"name":"echo","params":{"a":1}}`, &out, "X-Lease", l.Lease.LeaseToken)
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "application/json; charset=utf-8", resp.Header.Get("Content-Type"))
	require.Equal(t, cheetah.StatusCompleted, out.Resolution.Status)
}

// TestClientFrameBadInput: a client frame with a NUL in a stored string, a
// member named twice, or data nested too deep is a malformed frame (4400),
// on both stores, even about a command really dispatched to it; nothing of
// it is recorded, and the command's record still reads.
func TestClientFrameBadInput(t *testing.T) {
	t.Parallel()
	onBothStores(t, func(t *testing.T, b *broker) {
		for i, frame := range []string{
			`{"type":"event","command_id":"%s","name":"a\u0000"}`,
			`{"type":"error","command_id":"%s","code":"x\u0000","message":"m"}`,
			`{"type":"error","command_id":"%s","code":"x","message":"m\u0000"}`,
			`{"type":"capture","command_id":"%s","mime":"image/png\u0000","data":""}`,
			`{"type":"result","command_id":"%s","command_id":"other","data":{}}`,
			`{"type":"result","command_id":"%s","data":{"a":1,"a":2}}`,
			`{"type":"progress","command_id":"%s","data":` + deep(protocol.MaxJSONDepth+1) + `}`,
			`{"type":"result","command_id":"%s","data":"\ud800"}`,
			`{"type":"state","contexts":[{"context_id":"x","owner":"worker","title":"t\u0000"}],"x":"%s"}`,
		} {
			ctxID := "ctx-" + string(rune('a'+i))
			c := b.connectAgent("bad-frame-"+string(rune('a'+i)), ctxID)
			var l struct{ Lease cheetah.Lease }
			require.Equal(t, 201, b.do("POST", "/api/v1/acquire", b.appKey,
				map[string]any{"user_id": user, "task_id": "frames", "client_type": "console", "client_id": "bad-frame-" + string(rune('a'+i))}, &l).StatusCode)
			var sent cheetah.Sent
			require.Equal(t, 202, b.do("POST", "/api/v1/commands", b.appKey, `{"name":"n"}`, &sent, "X-Lease", l.Lease.LeaseToken).StatusCode)
			cmd := next[*protocol.Command](c)
			require.Equal(t, sent.CommandID, cmd.CommandID)
			c.sendRaw([]byte(fmt.Sprintf(frame, cmd.CommandID)))
			c.expectClose(protocol.CloseMalformed)
			var rec struct{ Command cheetah.CommandRecord }
			require.Eventually(t, func() bool {
				resp := b.do("GET", "/api/v1/users/"+user+"/commands/"+sent.CommandID, b.appKey, nil, &rec)
				require.Equal(t, 200, resp.StatusCode)
				return rec.Command.Status == cheetah.StatusDisconnected
			}, 10*time.Second, 20*time.Millisecond, frame)
			require.Empty(t, rec.Command.Messages, "nothing of a malformed frame is recorded: %s", frame)
		}
		// A hello with a NUL in a label is refused the same way.
		c := b.dial().read()
		c.sendRaw([]byte(`{"type":"hello","protocol":1,"token":"` + b.client + `","client_id":"h1","client_type":"console","labels":{"a":"\u0000"}}`))
		c.expectClose(protocol.CloseMalformed)
		// A \u0000 escape inside data is JSON text like any other: recorded
		// and read back as sent.
		c = b.connectAgent("good-agent", "good-ctx")
		var l struct{ Lease cheetah.Lease }
		require.Equal(t, 201, b.do("POST", "/api/v1/acquire", b.appKey,
			map[string]any{"user_id": user, "task_id": "frames", "client_type": "console", "client_id": "good-agent"}, &l).StatusCode)
		var sent cheetah.Sent
		require.Equal(t, 202, b.do("POST", "/api/v1/commands", b.appKey, `{"name":"n"}`, &sent, "X-Lease", l.Lease.LeaseToken).StatusCode)
		cmd := next[*protocol.Command](c)
		c.sendRaw([]byte(`{"type":"event","command_id":"` + cmd.CommandID + `","name":"console","data":{"text":"a\u0000b"}}`))
		c.sendRaw([]byte(`{"type":"result","command_id":"` + cmd.CommandID + `","data":{"s":"\u0000"}}`))
		var rec struct{ Command cheetah.CommandRecord }
		require.Eventually(t, func() bool {
			b.do("GET", "/api/v1/users/"+user+"/commands/"+sent.CommandID, b.appKey, nil, &rec)
			return rec.Command.Status == cheetah.StatusCompleted && len(rec.Command.Messages) == 2
		}, 10*time.Second, 20*time.Millisecond)
		require.JSONEq(t, `{"s":"\u0000"}`, string(rec.Command.Messages[1].Data))
	})
}

// TestMetricsHoldNoCallerText: what a caller controls (a path with a NUL, a
// made-up method, a malformed frame) never becomes a label value of
// /metrics.
func TestMetricsHoldNoCallerText(t *testing.T) {
	t.Parallel()
	b := openBroker(t, server.Options{})
	for _, path := range []string{"/api/v1/users/u%00/commands", "/nowhere%00", "/api/v1/acquire"} {
		for _, m := range []string{"GET", "BREW", "PURGE"} {
			b.do(m, path, b.appSecret, nil, nil)
		}
	}
	// The broker closes a connection over a bad frame: each goes on its
	// own, and is counted once its connection has ended.
	for _, frame := range []string{`{"type":"x\u0000y"}`, `{"type":"hello","type":"ping"}`} {
		c := b.dial().read()
		c.sendRaw([]byte(frame))
		select {
		case <-c.closed:
		case <-time.After(10 * time.Second):
			t.Fatalf("the broker kept the connection open after %s", frame)
		}
	}
	s := b.scrape()
	for name, f := range s {
		for _, m := range f.Metric {
			for _, l := range m.Label {
				v := l.GetValue()
				require.NotContains(t, v, "\x00", "%s{%s}", name, l.GetName())
				require.NotContains(t, []string{"BREW", "PURGE"}, v, "%s{%s}", name, l.GetName())
			}
		}
	}
	require.Positive(t, s.value("cheetah_http_server_duration_seconds", "method", "other"))
}

// TestInProcessBadInput: the in-process SDK (Broker.Manager) refuses what
// the HTTP API refuses, before the store, on both stores.
func TestInProcessBadInput(t *testing.T) {
	t.Parallel()
	for _, db := range []string{"sqlite", "postgres"} {
		t.Run(db, func(t *testing.T) {
			t.Parallel()
			o := server.Options{}
			if db == "postgres" {
				o.DatabaseURL = historytest.EmptyPostgres(t)
			}
			b := openBroker(t, o)
			b.connectAgent("ip-agent", "ip-1")
			m := b.open.Manager()
			ctx := t.Context()
			_, err := m.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "t\x00", ClientType: cheetah.Console})
			require.ErrorIs(t, err, cheetah.ErrInvalidRequest)
			_, err = m.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "t", Labels: map[string]string{"a": "\x00"}})
			require.ErrorIs(t, err, cheetah.ErrInvalidRequest)
			h, err := m.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "t", ClientType: cheetah.Console})
			require.NoError(t, err)
			_, err = h.Send(ctx, cheetah.Command{Name: "n\x00"})
			require.ErrorIs(t, err, cheetah.ErrInvalidRequest)
			_, err = h.Send(ctx, cheetah.Command{Name: "n", Params: json.RawMessage(deep(protocol.MaxJSONDepth + 1))})
			require.ErrorIs(t, err, cheetah.ErrInvalidRequest)
			_, err = h.Send(ctx, cheetah.Command{Name: "n", Params: json.RawMessage(`{"a":1,"a":2}`)})
			require.ErrorIs(t, err, cheetah.ErrInvalidRequest)
			_, err = m.TaskContexts(ctx, "t\x00", user)
			require.ErrorIs(t, err, cheetah.ErrInvalidRequest)
			_, err = m.History().Read(ctx, user, "c\x00")
			require.ErrorIs(t, err, cheetah.ErrNotFound)
			_, err = m.History().List(ctx, user, cheetah.ListQuery{TaskID: "t\x00"})
			require.ErrorIs(t, err, cheetah.ErrInvalidRequest)
			_, err = m.History().List(ctx, user, cheetah.ListQuery{Cursor: "\x00"})
			require.ErrorIs(t, err, cheetah.ErrInvalidRequest)
			// And the broker still works.
			_, err = h.Send(ctx, cheetah.Command{Name: "n"})
			require.NoError(t, err)
		})
	}
}
