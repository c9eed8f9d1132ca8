package main_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
)

// TestServeQuotasAndCreation: serve with CHEETAH_QUOTA_FILE, an agent with
// room for more flows, an acquire that creates one and one the quota
// refuses; `cheetah quotas` shows the occupancy; a broken file on SIGHUP
// fails closed until `cheetah quotas --reload` reads a good one; a broken
// file at start refuses to serve.
func TestServeQuotasAndCreation(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	t.Parallel()
	path := filepath.Join(t.TempDir(), "quotas.yaml")
	write := func(s string) { require.NoError(t, os.WriteFile(path, []byte(s), 0o600)) }
	write("quotas: [{name: consoles, match: {client_type: console}, levels: {global: 10, user: 1}}]\n")
	addr := freePort(t)
	admin := "quota-admin-key-0123456789"
	srv := start(t, []string{"CHEETAH_ADMIN_KEY=" + admin, "CHEETAH_DATA_DIR=" + t.TempDir(), "CHEETAH_LISTEN=" + addr,
		"CHEETAH_QUOTA_FILE=" + path}, "serve")
	a := api{t: t, base: "http://" + addr}
	require.Eventually(t, func() bool { return a.call("GET", "/readyz", "", nil, nil) == 200 }, 30*time.Second, 50*time.Millisecond)
	env := []string{"CHEETAH_URL=" + a.base, "CHEETAH_ADMIN_KEY=" + admin}

	var key struct{ Key string }
	require.Equal(t, 201, a.call("POST", "/api/v1/admin/keys", admin, map[string]any{"kind": "client", "user_id": "usr_q", "name": "agent"}, &key))
	start(t, []string{"CHEETAH_CLIENT_KEY=" + key.Key, "CHEETAH_URL=" + a.base}, "agent", "--client-id", "q-agent", "--flows", "1", "--max-flows", "2")
	require.Eventually(t, func() bool {
		out, _ := cli(t, env, "pools", "--json")
		return strings.Contains(out, `"idle": 1`)
	}, 30*time.Second, 100*time.Millisecond)

	// The idle flow is taken; the next acquire asks the agent for a flow.
	var acq struct{ Lease cheetah.Lease }
	require.Equal(t, 201, a.call("POST", "/api/v1/acquire", admin, map[string]any{"user_id": "usr_q", "task_id": "t", "client_type": "console"}, &acq))
	require.Equal(t, 201, a.call("POST", "/api/v1/acquire", admin, map[string]any{"user_id": "usr_q", "task_id": "t", "client_type": "console",
		"tenant_id": "other", "create": map[string]any{"timeout_ms": 10000}}, &acq))
	require.True(t, acq.Lease.Created)
	require.Equal(t, "flow-2", acq.Lease.ContextID)
	require.Equal(t, 409, a.call("POST", "/api/v1/acquire", admin, map[string]any{"user_id": "usr_q", "task_id": "t", "client_type": "console"}, nil),
		"the user's one slot in tenant default is taken")

	out, code := cli(t, env, "quotas")
	require.Zero(t, code)
	require.Regexp(t, `consoles\s+global\s+2\s+10`, out)
	require.Regexp(t, `consoles\s+user\s+default/usr_q\s+1\s+1`, out)

	// Broken on SIGHUP: fail closed.
	write("quotas: [{name: consoles, levels: {user: 0}}]\n")
	require.NoError(t, srv.cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool {
		out, _ := cli(t, env, "quotas")
		return strings.Contains(out, "BROKEN")
	}, 30*time.Second, 100*time.Millisecond)
	require.Equal(t, 503, a.call("POST", "/api/v1/acquire", admin, map[string]any{"user_id": "usr_z", "task_id": "t", "client_type": "console"}, nil))
	_, code = cli(t, env, "quotas", "--reload")
	require.Equal(t, 5, code, "still broken: unavailable")
	write("quotas: [{name: consoles, match: {client_type: console}, levels: {user: 5}}]\n")
	out, code = cli(t, env, "quotas", "--reload")
	require.Zero(t, code)
	require.NotContains(t, out, "BROKEN")

	// A broken file at start refuses to serve.
	write("quotas: [{name: consoles, levels: {user: 1}, colour: red}]\n")
	_, code = cli(t, []string{"CHEETAH_DATA_DIR=" + t.TempDir(), "CHEETAH_LISTEN=" + freePort(t), "CHEETAH_QUOTA_FILE=" + path}, "serve")
	require.NotZero(t, code)
}
