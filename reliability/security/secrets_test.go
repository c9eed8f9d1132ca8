package security

import (
	"context"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/reliability/internal/rig"
)

// TestSecretsNeverLeak runs a broker logging at debug through a day's
// worth of traffic, failures included, and then looks for every key, every
// webhook secret and every lease token (real ones and ones an attacker
// tried) in the log, in every admin view and history read, and in every
// error answer and error frame.
func TestSecretsNeverLeak(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	secrets := []string{adminKey, e.app, e.keys[userA], e.keys[userB]}
	// A key made and revoked, with its webhook secret.
	made := e.api.Do(ctx, "POST", "/api/v1/admin/keys", adminKey, map[string]any{"kind": "app", "name": "short-lived"})
	require.Equal(t, 201, made.Status)
	var created struct {
		ID, Key       string
		WebhookSecret string `json:"webhook_secret"`
	}
	require.NoError(t, made.Decode(&created))
	secrets = append(secrets, created.Key, created.WebhookSecret)

	c := e.client(userA, "laptop", "tab-1", "tab-2")
	l := e.acquire(userA, "", "task")
	secrets = append(secrets, l.LeaseToken)
	e.waitCommand(l, map[string]any{"act": "chatty"})
	e.waitCommand(l, map[string]any{"act": "fail"})
	e.do("POST", "/api/v1/commands/wait", e.app, map[string]any{"name": "work", "params": map[string]any{"act": "drop"}, "timeout_ms": 50}, "X-Lease", l.LeaseToken)
	renewed := e.api.Do(ctx, "POST", "/api/v1/lease/renew", e.app, map[string]any{"ttl_s": 30}, "X-Lease", l.LeaseToken)
	require.Equal(t, 200, renewed.Status)
	l2 := e.acquire(userA, "", "task")
	secrets = append(secrets, l2.LeaseToken)

	// An attacker's guesses: tokens that look real, keys of the right shape.
	guess := hex.EncodeToString([]byte("attacker-guess-1"))
	near := l.LeaseToken[:31] + string("0123456789abcdef"[(strings.IndexByte("0123456789abcdef", l.LeaseToken[31])+1)%16])
	fakeKey := "chk_" + created.ID + "_" + strings.Repeat("Z", 43)
	secrets = append(secrets, guess, near, fakeKey)
	for _, tok := range []string{guess, near, "x", strings.Repeat("f", 4096)} {
		for _, p := range []string{"/api/v1/commands", "/api/v1/commands/wait", "/api/v1/lease/renew", "/api/v1/lease/release"} {
			a := e.do("POST", p, e.app, map[string]any{"name": "work"}, "X-Lease", tok)
			require.GreaterOrEqual(t, a.Status, 200)
		}
	}
	e.do("POST", "/api/v1/lease/release-all", e.app, map[string]any{"lease_tokens": []string{guess, near, l2.LeaseToken}})
	e.do("GET", "/api/v1/admin/pools", fakeKey, nil)
	e.do("GET", "/api/v1/admin/pools", e.keys[userA], nil)
	e.do("GET", "/api/v1/admin/pools", created.Key, nil)
	e.do("DELETE", "/api/v1/admin/keys/"+created.ID, adminKey, nil)
	e.do("GET", "/api/v1/admin/pools", created.Key, nil) // revoked now
	// Hellos with keys that are not client keys, or not keys.
	var frames []string
	for _, key := range []string{e.app, fakeKey, created.Key, adminKey, guess} {
		fc := &rig.FakeClient{URL: e.hs.URL, Key: key, UserID: userA, ClientID: "intruder"}
		err := fc.Connect(ctx)
		require.Error(t, err, "hello with a key that is not a client key")
		frames = append(frames, err.Error())
		for _, f := range fc.Errors() {
			frames = append(frames, f.Message)
		}
		fc.Close()
	}
	// Client frames that fail: they must not echo anything either.
	require.NoError(t, c.SendRaw([]byte(`{"type":"result","command_id":"`+guess+`","data":{}}`)))
	require.NoError(t, c.Sync())
	for _, f := range c.Errors() {
		frames = append(frames, f.Message+" "+string(f.Code))
	}
	// Views an operator or application reads.
	for _, p := range []string{"/api/v1/admin/pools", "/api/v1/admin/clients", "/api/v1/admin/leases", "/api/v1/admin/keys"} {
		a := e.do("GET", p, adminKey, nil)
		require.Equal(t, 200, a.Status)
	}
	for _, p := range []string{"/api/v1/users/" + userA + "/commands", "/api/v1/users/" + userA + "/tasks/task/leases", "/api/v1/users/" + userA + "/contexts/available"} {
		require.Equal(t, 200, e.do("GET", p, e.app, nil).Status)
	}
	page := e.do("GET", "/api/v1/users/"+userA+"/commands?limit=500", e.app, nil)
	var list cheetah.CommandPage
	require.NoError(t, page.Decode(&list))
	for _, cmd := range list.Commands {
		e.read(userA, cmd.CommandID)
	}
	// Admin views through the registry too (what the CLI prints).
	for _, v := range e.b.Registry.Leases("", "") {
		require.Empty(t, v.LeaseToken)
	}

	// The answers the tests kept hold the acquire and renew answers, which
	// rightly carry their own tokens: take those out, nothing else.
	answers := e.answers.String()
	for _, own := range []string{l.LeaseToken, l2.LeaseToken} {
		answers = strings.ReplaceAll(answers, `"lease_token":"`+own+`"`, `"lease_token":"<own>"`)
	}
	require.NoError(t, c.Sync())
	logs := e.logs.String()
	require.NotEmpty(t, logs)
	for _, s := range secrets {
		require.False(t, contains(logs, s), "a secret (%.10s…) is in the log", s)
		require.False(t, contains(answers, s), "a secret (%.10s…) is in an answer", s)
		for _, f := range frames {
			require.False(t, contains(f, s), "a secret (%.10s…) is in an error frame or close", s)
		}
	}
	t.Logf("%d secrets checked against %d KiB of debug log, %d KiB of answers, %d error frames", len(secrets), len(logs)>>10, len(answers)>>10, len(frames))
	_ = protocol.CodeUnknownCommand
}
