package security

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/reliability/internal/rig"
)

// endpoint is one route of the API with a body that would do something.
type endpoint struct {
	method, path string
	body         any
	admin        bool
}

func endpoints(user, task, cmd, client, context string) []endpoint {
	return []endpoint{
		{"POST", "/api/v1/acquire", map[string]any{"user_id": user, "task_id": task, "client_type": "console"}, false},
		{"POST", "/api/v1/commands", map[string]any{"name": "work"}, false},
		{"POST", "/api/v1/commands/wait", map[string]any{"name": "work"}, false},
		{"POST", "/api/v1/lease/renew", nil, false},
		{"POST", "/api/v1/lease/release", nil, false},
		{"POST", "/api/v1/lease/release-all", map[string]any{"lease_tokens": []string{}}, false},
		{"GET", "/api/v1/users/" + user + "/contexts/available", nil, false},
		{"GET", "/api/v1/users/" + user + "/tasks/" + task + "/leases", nil, false},
		{"GET", "/api/v1/users/" + user + "/commands/" + cmd, nil, false},
		{"GET", "/api/v1/users/" + user + "/commands", nil, false},
		{"GET", "/api/v1/admin/pools", nil, true},
		{"GET", "/api/v1/admin/clients", nil, true},
		{"GET", "/api/v1/admin/leases", nil, true},
		{"POST", "/api/v1/admin/users/" + user + "/clients/" + client + "/contexts/" + context + "/revoke", nil, true},
		{"DELETE", "/api/v1/admin/users/" + user + "/clients/" + client, nil, true},
		{"POST", "/api/v1/admin/keys", map[string]any{"kind": "admin", "name": "escalate"}, true},
		{"GET", "/api/v1/admin/keys", nil, true},
		{"DELETE", "/api/v1/admin/keys/bootstrap", nil, true},
	}
}

// TestCrossUserHTTP probes every endpoint across the user boundary. A
// client key (bound to one user) opens nothing over HTTP; no key or a bad
// one is 401; an app key opens no admin route; and with an app key, user
// B's paths never show or touch user A's contexts, leases or commands,
// even when both users' clients and contexts have the same ids.
func TestCrossUserHTTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// Same client id and context ids under both users.
	a := e.client(userA, "laptop", "tab-1", "tab-2")
	b := e.client(userB, "laptop", "tab-1")
	la := e.acquire(userA, "", "secret-task")
	res := e.waitCommand(la, map[string]any{"act": "ok"})
	require.Equal(t, cheetah.StatusCompleted, res.Status)
	cmdA := res.CommandID

	// Client keys, no key, bad keys: nothing opens.
	probes := 0
	for _, ep := range endpoints(userA, "secret-task", cmdA, "laptop", "tab-1") {
		for _, k := range []struct {
			key  string
			want int
		}{
			{e.keys[userA], 403}, {e.keys[userB], 403}, {"", 401},
			{"chk_000000000000_" + strings.Repeat("A", 43), 401}, {"Bearer", 401}, {adminKey + "x", 401},
		} {
			ans := e.do(ep.method, ep.path, k.key, ep.body, "X-Lease", la.LeaseToken)
			require.Equal(t, k.want, ans.Status, "%s %s with key %.12q: %s", ep.method, ep.path, k.key, ans)
			probes++
		}
		if ep.admin {
			ans := e.do(ep.method, ep.path, e.app, ep.body)
			require.Equal(t, 403, ans.Status, "%s %s with an app key: %s", ep.method, ep.path, ans)
			probes++
		}
	}

	// With an app key, user B's views hold nothing of user A's.
	_, ans := e.read(userB, cmdA)
	require.Equal(t, 404, ans.Status, "A's command read as B's")
	require.Equal(t, cheetah.CodeNotFound, ans.Code())
	list := e.do("GET", "/api/v1/users/"+userB+"/commands", e.app, nil)
	require.Equal(t, 200, list.Status)
	require.NotContains(t, string(list.Body), cmdA)
	leases := e.do("GET", "/api/v1/users/"+userB+"/tasks/secret-task/leases", e.app, nil)
	require.JSONEq(t, `{"leases":[]}`, string(leases.Body))
	avail := e.do("GET", "/api/v1/users/"+userB+"/contexts/available", e.app, nil)
	var av struct{ Contexts []cheetah.ContextSnapshot }
	require.NoError(t, avail.Decode(&av))
	for _, c := range av.Contexts {
		require.Equal(t, userB, c.UserID)
	}
	// B's acquires land on B's own contexts only, whatever they name.
	lb := e.acquire(userB, "laptop", "b-task")
	require.Equal(t, userB, lb.UserID)
	none := e.do("POST", "/api/v1/acquire", e.app, map[string]any{"user_id": userB, "task_id": "more", "client_type": "console", "client_id": "laptop"})
	require.Equal(t, 409, none.Status, "B has one context, and it is taken; A's are not B's: %s", none)
	// Admin actions on B's ids leave A alone.
	rv := e.do("POST", "/api/v1/admin/users/"+userB+"/clients/laptop/contexts/tab-1/revoke", adminKey, nil)
	require.JSONEq(t, `{"revoked":true}`, string(rv.Body))
	renew := e.do("POST", "/api/v1/lease/renew", e.app, nil, "X-Lease", la.LeaseToken)
	require.Equal(t, 200, renew.Status, "A's lease survives a revoke of B's context with the same ids")
	dc := e.do("DELETE", "/api/v1/admin/users/"+userB+"/clients/laptop", adminKey, nil)
	require.JSONEq(t, `{"disconnected":true}`, string(dc.Body))
	<-b.Done()
	res = e.waitCommand(la, map[string]any{"act": "ok"})
	require.Equal(t, cheetah.StatusCompleted, res.Status, "A's client is untouched by B's disconnect")
	require.Empty(t, a.Check.Errors())
	t.Logf("%d cross-user and bad-key HTTP probes refused", probes)
}

// TestCrossClientFrames has other clients, of another user and of the same
// user, send every client frame about a command dispatched to someone
// else, while it runs and after it ended. Each is answered unknown_command
// and nothing reaches the command's history.
func TestCrossClientFrames(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	owner := e.client(userA, "owner", "tab-1")
	sibling := e.client(userA, "sibling", "tab-1")
	stranger := e.client(userB, "owner", "tab-1") // the same client id, another user
	l := e.acquire(userA, "owner", "t")

	attack := func(c interface{ Send(protocol.Frame) error }, id string) {
		t.Helper()
		for _, f := range []protocol.Frame{
			&protocol.Ack{CommandID: id},
			&protocol.Progress{CommandID: id, Data: []byte(`{"forged":1}`)},
			&protocol.Event{CommandID: id, Name: "forged", Data: []byte(`{}`)},
			&protocol.Capture{CommandID: id, MIME: "image/png", Data: base64.StdEncoding.EncodeToString([]byte("forged"))},
			&protocol.Result{CommandID: id, Data: []byte(`{"forged":true}`)},
			&protocol.Error{CommandID: id, Code: "forged", Message: "forged"},
		} {
			require.NoError(t, c.Send(f))
		}
	}
	frames := 0
	check := func(id string, wantMessages int, wantStatus cheetah.Status) {
		t.Helper()
		for _, c := range []*rig.FakeClient{sibling, stranger} {
			require.NoError(t, c.Sync())
			n := 0
			for _, f := range c.Errors() {
				if f.CommandID == id {
					require.Equal(t, protocol.CodeUnknownCommand, f.Code)
					n++
				}
			}
			require.GreaterOrEqual(t, n, 6, "every forged frame is answered unknown_command")
		}
		e.flush()
		rec, ans := e.read(userA, id)
		require.Equal(t, 200, ans.Status)
		require.Equal(t, wantStatus, rec.Status)
		require.Len(t, rec.Messages, wantMessages, "a forged frame reached history: %+v", rec.Messages)
		for _, m := range rec.Messages {
			require.NotContains(t, string(m.Data), "forged")
		}
	}

	// While the command runs ("drop": the owner does not answer yet).
	a := e.do("POST", "/api/v1/commands", e.app, map[string]any{"name": "work", "params": map[string]any{"act": "drop"}, "timeout_ms": 600000}, "X-Lease", l.LeaseToken)
	require.Equal(t, 202, a.Status)
	var sent cheetah.Sent
	require.NoError(t, a.Decode(&sent))
	require.NoError(t, owner.Sync())
	attack(sibling, sent.CommandID)
	attack(stranger, sent.CommandID)
	frames += 12
	check(sent.CommandID, 0, cheetah.StatusDispatched)
	// The owner's own answer still wins.
	require.NoError(t, owner.Send(&protocol.Result{CommandID: sent.CommandID, Data: []byte(`{"real":true}`)}))
	require.NoError(t, owner.Sync())
	// After it ended: the finished-command memory must not let others in.
	attack(sibling, sent.CommandID)
	attack(stranger, sent.CommandID)
	frames += 12
	e.flush()
	rec, _ := e.read(userA, sent.CommandID)
	require.Equal(t, cheetah.StatusCompleted, rec.Status)
	// A command id nobody knows, and one of another user's that completed.
	attack(stranger, "01234567-89ab-7def-8123-456789abcdef")
	frames += 6
	res := e.waitCommand(l, map[string]any{"act": "ok"})
	attack(sibling, res.CommandID)
	attack(stranger, res.CommandID)
	frames += 12
	check(res.CommandID, 2, cheetah.StatusCompleted) // the owner's ack and result only
	check(sent.CommandID, 1, cheetah.StatusCompleted)
	require.Empty(t, owner.Check.Errors())
	t.Logf("%d forged frames from other clients refused", frames)
}
