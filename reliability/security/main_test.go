// Package security probes the broker as an attacker would: across the user
// boundary on every endpoint and frame, a client answering another
// client's command, secrets in logs, admin views and errors, oversized
// frames and bodies, a flood of connections that never say hello, and the
// timing of lease-token lookups.
package security

import (
	"bytes"
	"context"
	"flag"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/internal/syncbuf"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/reliability/internal/rig"
	"github.com/cheetahbroker/cheetah/server"
)

var (
	flood  = flag.Int("security.flood", 300, "connections that never say hello")
	timing = flag.Int("security.timing", 0, "lease-token lookups per kind to time (0 skips the timing test)")
)

func TestMain(m *testing.M) {
	flag.Parse()
	goleak.VerifyTestMain(m)
}

const (
	adminKey = "security-admin-key-0123456789abcdef0"
	userA    = "usr_sec_a"
	userB    = "usr_sec_b"
)

// env is an in-process broker on loopback, logging at debug into a buffer.
type env struct {
	t    *testing.T
	b    *server.Broker
	hs   *httptest.Server
	api  *rig.API
	logs *syncbuf.Buffer
	app  string
	keys map[string]string // user → client key
	// answers collects every answer body the tests saw, for the secrets check.
	answers bytes.Buffer
}

func newEnv(t *testing.T, tweak ...func(*server.Options)) *env {
	t.Helper()
	logs := &syncbuf.Buffer{}
	opts := server.Options{DataDir: t.TempDir(), AdminKey: adminKey, MaxMessageBytes: 64 << 10, MaxBodyBytes: 256 << 10,
		ReconnectGrace: time.Hour,
		Log:            slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	for _, f := range tweak {
		f(&opts)
	}
	b, hs := rig.OpenBroker(t, opts)
	e := &env{t: t, b: b, hs: hs, api: rig.NewAPI(hs.URL), logs: logs, keys: map[string]string{}}
	t.Cleanup(e.api.HC.CloseIdleConnections)
	e.app = e.api.MakeKey(t, adminKey, "app", "")
	for _, u := range []string{userA, userB} {
		e.keys[u] = e.api.MakeKey(t, adminKey, "client", u)
	}
	return e
}

// do calls the API and keeps the answer for the secrets check.
func (e *env) do(method, path, key string, body any, headers ...string) rig.Answer {
	e.t.Helper()
	a := e.api.Do(context.Background(), method, path, key, body, headers...)
	require.NoError(e.t, a.Err)
	e.answers.Write(a.Body)
	e.answers.WriteByte('\n')
	return a
}

// client connects a fake client of user with worker contexts.
func (e *env) client(user, clientID string, contexts ...string) *rig.FakeClient {
	e.t.Helper()
	fc := &rig.FakeClient{URL: e.hs.URL, Key: e.keys[user], UserID: user, ClientID: clientID, Check: rig.NewChecker()}
	require.NoError(e.t, fc.Connect(context.Background()))
	e.t.Cleanup(fc.Close)
	var reps []protocol.ContextReport
	for _, id := range contexts {
		reps = append(reps, rig.Worker(id))
	}
	require.NoError(e.t, fc.Report(reps...))
	return fc
}

// acquire takes a context of user (of clientID when not empty).
func (e *env) acquire(user, clientID, task string) cheetah.Lease {
	e.t.Helper()
	body := map[string]any{"user_id": user, "task_id": task, "client_type": "console", "ttl_s": 600}
	if clientID != "" {
		body["client_id"] = clientID
	}
	a := e.do("POST", "/api/v1/acquire", e.app, body)
	require.Equal(e.t, 201, a.Status, a.String())
	var out struct{ Lease cheetah.Lease }
	require.NoError(e.t, a.Decode(&out))
	return out.Lease
}

func (e *env) waitCommand(l cheetah.Lease, params map[string]any) cheetah.Resolution {
	e.t.Helper()
	a := e.do("POST", "/api/v1/commands/wait", e.app, map[string]any{"name": "work", "params": params}, "X-Lease", l.LeaseToken)
	require.Equal(e.t, 200, a.Status, a.String())
	var out struct{ Resolution cheetah.Resolution }
	require.NoError(e.t, a.Decode(&out))
	return out.Resolution
}

func (e *env) read(user, id string) (cheetah.CommandRecord, rig.Answer) {
	e.t.Helper()
	a := e.do("GET", "/api/v1/users/"+user+"/commands/"+id, e.app, nil)
	var out struct{ Command cheetah.CommandRecord }
	if a.Status == 200 {
		require.NoError(e.t, a.Decode(&out))
	}
	return out.Command, a
}

// flush waits until every write the broker queued so far is durable: the
// writer commits in order, so an empty write is a barrier.
func (e *env) flush() {
	e.t.Helper()
	require.NoError(e.t, e.b.Store.Write(context.Background()))
}

func contains(haystack, needle string) bool {
	return needle != "" && strings.Contains(haystack, needle)
}
