package main_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
)

// TestAgentHold runs `cheetah serve` and `cheetah agent` as real processes;
// `cheetah agent hold flow-1` takes control through the agent's control
// socket, and an application's exec (a mutation) is refused 423 held while
// echo (declared an observation) passes; `unhold` gives it back.
func TestAgentHold(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	addr := freePort(t)
	admin := "e2e-admin-key-0123456789"
	start(t, []string{"CHEETAH_ADMIN_KEY=" + admin, "CHEETAH_DATA_DIR=" + t.TempDir(), "CHEETAH_LISTEN=" + addr}, "serve")
	a := api{t: t, base: "http://" + addr}
	require.Eventually(t, func() bool { return a.call("GET", "/readyz", "", nil, nil) == 200 }, 30*time.Second, 50*time.Millisecond)
	var client, app struct{ Key string }
	require.Equal(t, 201, a.call("POST", "/api/v1/admin/keys", admin, map[string]any{"kind": "client", "user_id": "usr_e2e", "name": "agent"}, &client))
	require.Equal(t, 201, a.call("POST", "/api/v1/admin/keys", admin, map[string]any{"kind": "app", "name": "app"}, &app))

	dir, err := os.MkdirTemp("", "chold")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	env := []string{"XDG_RUNTIME_DIR=" + dir}
	start(t, append([]string{"CHEETAH_CLIENT_KEY=" + client.Key, "CHEETAH_URL=" + a.base}, env...),
		"agent", "--client-id", "hold-agent", "--allow", "true")
	var avail struct{ Contexts []cheetah.ContextSnapshot }
	require.Eventually(t, func() bool {
		a.call("GET", "/api/v1/users/usr_e2e/contexts/available?client_type=console", app.Key, nil, &avail)
		return len(avail.Contexts) == 1
	}, 30*time.Second, 50*time.Millisecond)
	sock := filepath.Join(dir, "cheetah", "agent-hold-agent.sock")
	fi, err := os.Stat(sock)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	var acq struct{ Lease cheetah.Lease }
	require.Equal(t, 201, a.call("POST", "/api/v1/acquire", app.Key, map[string]any{"user_id": "usr_e2e", "task_id": "held", "client_type": "console"}, &acq))
	lease := []string{"X-Lease", acq.Lease.LeaseToken}

	out, code := cli(t, env, "agent", "hold", "flow-1", "--client-id", "hold-agent")
	require.Zero(t, code)
	require.Equal(t, "flow-1 active\n", out)

	// 423: held (the body's code is checked by the server's tests).
	require.Equal(t, 423, a.call("POST", "/api/v1/commands", app.Key, map[string]any{"name": "exec", "params": map[string]any{"argv": []string{"true"}}}, nil, lease...))
	var waited struct{ Resolution cheetah.Resolution }
	require.Equal(t, 200, a.call("POST", "/api/v1/commands/wait", app.Key, map[string]any{"name": "echo"}, &waited, lease...))
	require.Equal(t, cheetah.StatusCompleted, waited.Resolution.Status)

	out, code = cli(t, env, "agent", "unhold", "flow-1", "--client-id", "hold-agent")
	require.Zero(t, code)
	require.Equal(t, "flow-1 ended\n", out)
	require.Equal(t, 200, a.call("POST", "/api/v1/commands/wait", app.Key, map[string]any{"name": "exec", "params": map[string]any{"argv": []string{"true"}}}, &waited, lease...))
	require.Equal(t, cheetah.StatusCompleted, waited.Resolution.Status)

	// Anything but hold or unhold and a context is a usage error.
	_, code = cli(t, env, "agent", "steal", "flow-1")
	require.Equal(t, 2, code)
	// No agent there: a clear error.
	_, code = cli(t, env, "agent", "hold", "flow-1", "--client-id", "nobody")
	require.NotZero(t, code)
}
