package main_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "cheetah-e2e")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "cheetah")
	out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build cheetah: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a running cheetah process whose output is kept for failures.
type proc struct {
	cmd *exec.Cmd
	out *bytes.Buffer
}

func start(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	require.NoError(t, cmd.Start())
	p := &proc{cmd: cmd, out: &buf}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", args[0], buf.String())
		}
	})
	return p
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

type api struct {
	t    *testing.T
	base string
}

func (a api) call(method, path, key string, body any, out any, headers ...string) int {
	a.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(a.t, err)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, a.base+path, rd)
	require.NoError(a.t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode < 300 {
		require.NoError(a.t, json.Unmarshal(raw, out), string(raw))
	}
	return resp.StatusCode
}

// TestServeAgentExec runs `cheetah serve` and `cheetah agent` as real
// processes and drives them over the HTTP API: acquire → exec → wait →
// history with progress and result.
func TestServeAgentExec(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	addr := freePort(t)
	admin := "e2e-admin-key-0123456789"
	serve := start(t, []string{"CHEETAH_ADMIN_KEY=" + admin, "CHEETAH_DATA_DIR=" + t.TempDir(), "CHEETAH_LISTEN=" + addr}, "serve")
	a := api{t: t, base: "http://" + addr}
	require.Eventually(t, func() bool { return a.call("GET", "/readyz", "", nil, nil) == 200 }, 30*time.Second, 50*time.Millisecond)

	var client, app struct{ Key string }
	require.Equal(t, 201, a.call("POST", "/api/v1/admin/keys", admin, map[string]any{"kind": "client", "user_id": "usr_e2e", "name": "agent"}, &client))
	require.Equal(t, 201, a.call("POST", "/api/v1/admin/keys", admin, map[string]any{"kind": "app", "name": "app"}, &app))

	start(t, []string{"CHEETAH_KEY=" + client.Key, "CHEETAH_URL=" + a.base}, "agent", "--client-id", "e2e-agent", "--flows", "2", "--allow", "sh")
	var avail struct{ Contexts []cheetah.ContextSnapshot }
	require.Eventually(t, func() bool {
		a.call("GET", "/api/v1/users/usr_e2e/contexts/available?client_type=console", app.Key, nil, &avail)
		return len(avail.Contexts) == 2
	}, 30*time.Second, 50*time.Millisecond)

	var acq struct{ Lease cheetah.Lease }
	require.Equal(t, 201, a.call("POST", "/api/v1/acquire", app.Key, map[string]any{"user_id": "usr_e2e", "task_id": "e2e", "client_type": "console"}, &acq))
	var waited struct{ Resolution cheetah.Resolution }
	require.Equal(t, 200, a.call("POST", "/api/v1/commands/wait", app.Key,
		map[string]any{"name": "exec", "params": map[string]any{"argv": []string{"sh", "-c", "echo out-line; echo err-line >&2; exit 3"}}, "timeout_ms": 20000},
		&waited, "X-Lease", acq.Lease.LeaseToken))
	require.Equal(t, cheetah.StatusCompleted, waited.Resolution.Status)

	var read struct{ Command cheetah.CommandRecord }
	require.Equal(t, 200, a.call("GET", "/api/v1/users/usr_e2e/commands/"+waited.Resolution.CommandID, app.Key, nil, &read))
	var stdout, stderr strings.Builder
	var result map[string]any
	for _, m := range read.Command.Messages {
		switch m.Kind {
		case cheetah.KindProgress:
			var p struct{ Stream, Data string }
			require.NoError(t, json.Unmarshal(m.Data, &p))
			if p.Stream == "stdout" {
				stdout.WriteString(p.Data)
			} else {
				stderr.WriteString(p.Data)
			}
		case cheetah.KindResult:
			require.NoError(t, json.Unmarshal(m.Data, &result))
		}
	}
	require.Equal(t, "out-line\n", stdout.String())
	require.Equal(t, "err-line\n", stderr.String())
	require.EqualValues(t, 3, result["exit_code"])
	require.Equal(t, cheetah.KindAck, read.Command.Messages[0].Kind)

	// A program off the allowlist fails with the agent's code.
	require.Equal(t, 200, a.call("POST", "/api/v1/commands/wait", app.Key,
		map[string]any{"name": "exec", "params": map[string]any{"argv": []string{"rm", "-rf", "/"}}}, &waited, "X-Lease", acq.Lease.LeaseToken))
	require.Equal(t, cheetah.StatusFailed, waited.Resolution.Status)
	require.Equal(t, "not_allowed", waited.Resolution.Error.Code)

	var rel struct{ Released bool }
	require.Equal(t, 200, a.call("POST", "/api/v1/lease/release", app.Key, nil, &rel, "X-Lease", acq.Lease.LeaseToken))
	require.True(t, rel.Released)

	// SIGTERM stops the broker cleanly.
	require.NoError(t, serve.cmd.Process.Signal(syscall.SIGTERM))
	done := make(chan error, 1)
	go func() { done <- serve.cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, serve.out.String())
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop on SIGTERM")
	}
	require.NotContains(t, serve.out.String(), admin, "the admin key never reaches the log")
	require.NotContains(t, serve.out.String(), acq.Lease.LeaseToken, "lease tokens never reach the log")
}

// TestFirstStartPrintsAdminKeyOnce starts serve twice on one data dir: the
// first prints a new admin key, the second does not.
func TestFirstStartPrintsAdminKeyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	dir := t.TempDir()
	run := func() string {
		addr := freePort(t)
		p := start(t, []string{"CHEETAH_ADMIN_KEY=", "CHEETAH_DATA_DIR=" + dir, "CHEETAH_LISTEN=" + addr}, "serve")
		a := api{t: t, base: "http://" + addr}
		require.Eventually(t, func() bool { return a.call("GET", "/healthz", "", nil, nil) == 200 }, 30*time.Second, 50*time.Millisecond)
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
		require.NoError(t, p.cmd.Wait())
		return p.out.String()
	}
	first := run()
	require.Contains(t, first, "shown only this once")
	var key string
	for _, f := range strings.Fields(first) {
		if strings.HasPrefix(f, "chk_") {
			key = f
		}
	}
	require.NotEmpty(t, key)
	second := run()
	require.NotContains(t, second, "shown only this once")
	require.NotContains(t, second, key)
}

// cli runs the cheetah binary with env and returns its stdout and exit code.
func cli(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	if code != 0 {
		t.Logf("%v: exit %d, stderr: %s", args, code, errb.String())
	}
	return out.String(), code
}

// TestAdminCLI drives the admin commands against a real broker and checks
// their output and exit codes.
func TestAdminCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	addr := freePort(t)
	admin := "cli-admin-key-0123456789"
	start(t, []string{"CHEETAH_ADMIN_KEY=" + admin, "CHEETAH_DATA_DIR=" + t.TempDir(), "CHEETAH_LISTEN=" + addr}, "serve")
	a := api{t: t, base: "http://" + addr}
	require.Eventually(t, func() bool { return a.call("GET", "/readyz", "", nil, nil) == 200 }, 30*time.Second, 50*time.Millisecond)
	env := []string{"CHEETAH_URL=" + a.base, "CHEETAH_KEY=" + admin}

	out, code := cli(t, env, "keys", "create", "--kind", "client", "--user", "usr_cli", "--name", "agent", "--json")
	require.Zero(t, code)
	var created struct{ ID, Key string }
	require.NoError(t, json.Unmarshal([]byte(out), &created))
	require.True(t, strings.HasPrefix(created.Key, "chk_"))
	out, code = cli(t, env, "keys", "create", "--kind", "app", "--name", "app")
	require.Zero(t, code)
	require.Contains(t, out, "webhook_secret")
	require.Contains(t, out, "shown only this once")

	start(t, []string{"CHEETAH_KEY=" + created.Key, "CHEETAH_URL=" + a.base}, "agent", "--client-id", "cli-agent", "--flows", "2")
	require.Eventually(t, func() bool {
		out, _ := cli(t, env, "pools", "--json")
		return strings.Contains(out, `"idle": 2`)
	}, 30*time.Second, 100*time.Millisecond)

	out, code = cli(t, env, "pools")
	require.Zero(t, code)
	require.Regexp(t, `USER\s+CLIENTS\s+IDLE\s+LEASED`, out)
	require.Regexp(t, `usr_cli\s+1\s+2\s+0`, out)
	out, code = cli(t, env, "clients", "--user", "usr_cli")
	require.Zero(t, code)
	require.Contains(t, out, "cli-agent")

	var acq struct{ Lease cheetah.Lease }
	require.Equal(t, 201, a.call("POST", "/api/v1/acquire", admin, map[string]any{"user_id": "usr_cli", "task_id": "cli-task", "client_type": "console"}, &acq))
	var waited struct{ Resolution cheetah.Resolution }
	require.Equal(t, 200, a.call("POST", "/api/v1/commands/wait", admin, map[string]any{"name": "echo", "params": map[string]any{"v": 1}}, &waited, "X-Lease", acq.Lease.LeaseToken))

	out, code = cli(t, env, "leases", "--task", "cli-task")
	require.Zero(t, code)
	require.Contains(t, out, acq.Lease.ContextID)
	require.NotContains(t, out, acq.Lease.LeaseToken)
	out, code = cli(t, env, "history", waited.Resolution.CommandID, "--user", "usr_cli")
	require.Zero(t, code)
	require.Regexp(t, `status\s+completed`, out)
	require.Regexp(t, `\d+\s+result`, out)
	_, code = cli(t, env, "history", waited.Resolution.CommandID, "--user", "usr_other")
	require.Equal(t, 3, code, "another user's command is not found")

	_, code = cli(t, env, "revoke", "usr_cli", "cli-agent", acq.Lease.ContextID)
	require.Zero(t, code)
	_, code = cli(t, env, "revoke", "usr_cli", "cli-agent", acq.Lease.ContextID)
	require.Equal(t, 3, code, "nothing left to revoke")

	_, code = cli(t, []string{"CHEETAH_URL=" + a.base, "CHEETAH_KEY=chk_bad_bad"}, "pools")
	require.Equal(t, 4, code)
	_, code = cli(t, env, "pools", "--no-such-flag")
	require.Equal(t, 2, code)
	_, code = cli(t, []string{"CHEETAH_URL=http://127.0.0.1:1", "CHEETAH_KEY=" + admin}, "pools")
	require.Equal(t, 5, code, "no broker there")

	_, code = cli(t, env, "keys", "revoke", created.ID)
	require.Zero(t, code)
	out, code = cli(t, env, "keys", "list")
	require.Zero(t, code)
	require.Regexp(t, created.ID+`\s+client\s+usr_cli`, out)
	require.NotContains(t, out, created.Key)
}
