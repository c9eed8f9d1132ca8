package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/internal/syncbuf"
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
	out *syncbuf.Buffer
}

func start(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	return startIn(t, "", env, args...)
}

// startIn is start with dir as the process's working directory.
func startIn(t *testing.T, dir string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var buf syncbuf.Buffer
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

	start(t, []string{"CHEETAH_CLIENT_KEY=" + client.Key, "CHEETAH_URL=" + a.base}, "agent", "--client-id", "e2e-agent", "--flows", "2", "--allow", "sh")
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
		// /healthz answers while the store is still opening; /readyz once
		// it is open (and the key printed).
		require.Eventually(t, func() bool { return a.call("GET", "/readyz", "", nil, nil) == 200 }, 30*time.Second, 50*time.Millisecond)
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

// cliAll runs the cheetah binary with env and returns its stdout, stderr and
// exit code.
func cliAll(t *testing.T, env []string, args ...string) (string, string, int) {
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
	return out.String(), errb.String(), code
}

// jsonErr is what the CLI prints on stderr for an error with --json.
type jsonErr struct {
	Error struct{ Code, Message, Reason string }
}

// requireJSONError checks that stderr is one JSON error object with code
// and that nothing went to stdout.
func requireJSONError(t *testing.T, stdout, stderr, code string) jsonErr {
	t.Helper()
	require.Empty(t, stdout, "an error prints nothing on stdout")
	dec := json.NewDecoder(strings.NewReader(stderr))
	var e jsonErr
	require.NoError(t, dec.Decode(&e), "stderr: %s", stderr)
	require.False(t, dec.More(), "one object: %s", stderr)
	require.Equal(t, code, e.Error.Code, stderr)
	require.NotEmpty(t, e.Error.Message)
	return e
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
	env := []string{"CHEETAH_URL=" + a.base, "CHEETAH_ADMIN_KEY=" + admin}

	out, code := cli(t, env, "keys", "create", "--kind", "client", "--user", "usr_cli", "--name", "agent", "--json")
	require.Zero(t, code)
	var created struct{ ID, Key string }
	require.NoError(t, json.Unmarshal([]byte(out), &created))
	require.True(t, strings.HasPrefix(created.Key, "chk_"))
	out, code = cli(t, env, "keys", "create", "--kind", "app", "--name", "app")
	require.Zero(t, code)
	require.Contains(t, out, "webhook_secret")
	require.Contains(t, out, "shown only this once")

	start(t, []string{"CHEETAH_CLIENT_KEY=" + created.Key, "CHEETAH_URL=" + a.base}, "agent", "--client-id", "cli-agent", "--flows", "2")
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

	_, code = cli(t, []string{"CHEETAH_URL=" + a.base, "CHEETAH_ADMIN_KEY=chk_bad_bad"}, "pools")
	require.Equal(t, 4, code)
	_, code = cli(t, env, "pools", "--no-such-flag")
	require.Equal(t, 2, code)
	_, code = cli(t, []string{"CHEETAH_URL=http://127.0.0.1:1", "CHEETAH_ADMIN_KEY=" + admin}, "pools")
	require.Equal(t, 5, code, "no broker there")

	// With --json, an error is one JSON object on stderr.
	stdout, stderr, code := cliAll(t, env, "history", waited.Resolution.CommandID, "--user", "usr_other", "--json")
	require.Equal(t, 3, code)
	requireJSONError(t, stdout, stderr, "not_found")
	stdout, stderr, code = cliAll(t, []string{"CHEETAH_URL=" + a.base, "CHEETAH_ADMIN_KEY=chk_bad_bad"}, "pools", "--json")
	require.Equal(t, 4, code)
	requireJSONError(t, stdout, stderr, "unauthorized")
	stdout, stderr, code = cliAll(t, []string{"CHEETAH_URL=http://127.0.0.1:1", "CHEETAH_ADMIN_KEY=" + admin}, "pools", "--json")
	require.Equal(t, 5, code)
	requireJSONError(t, stdout, stderr, "unavailable")

	// An app key is no admin key, and the answer says so in English.
	out, code = cli(t, env, "keys", "create", "--kind", "app", "--name", "not-admin", "--json")
	require.Zero(t, code)
	var appKey struct{ Key string }
	require.NoError(t, json.Unmarshal([]byte(out), &appKey))
	_, stderr, code = cliAll(t, []string{"CHEETAH_URL=" + a.base, "CHEETAH_ADMIN_KEY=" + appKey.Key}, "pools")
	require.Equal(t, 4, code)
	require.Contains(t, stderr, "an app key may not do this")
	require.NotContains(t, stderr, appKey.Key)

	_, code = cli(t, env, "keys", "revoke", created.ID)
	require.Zero(t, code)
	out, code = cli(t, env, "keys", "list")
	require.Zero(t, code)
	require.Regexp(t, created.ID+`\s+client\s+usr_cli`, out)
	require.NotContains(t, out, created.Key)
}

// TestCLIKeysHaveTheirOwnVariables: the agent reads its client key from
// CHEETAH_CLIENT_KEY and the admin commands theirs from CHEETAH_ADMIN_KEY,
// so one shell may export both; the programs the agent runs see neither.
func TestCLIKeysHaveTheirOwnVariables(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	t.Parallel()
	addr := freePort(t)
	admin := "vars-admin-key-0123456789"
	start(t, []string{"CHEETAH_ADMIN_KEY=" + admin, "CHEETAH_DATA_DIR=" + t.TempDir(), "CHEETAH_LISTEN=" + addr}, "serve")
	a := api{t: t, base: "http://" + addr}
	require.Eventually(t, func() bool { return a.call("GET", "/readyz", "", nil, nil) == 200 }, 30*time.Second, 50*time.Millisecond)
	var client struct{ Key string }
	require.Equal(t, 201, a.call("POST", "/api/v1/admin/keys", admin, map[string]any{"kind": "client", "user_id": "usr_vars", "name": "agent"}, &client))

	// One environment for everything, as a shell that exported both.
	env := []string{"CHEETAH_URL=" + a.base, "CHEETAH_ADMIN_KEY=" + admin, "CHEETAH_CLIENT_KEY=" + client.Key}
	agentProc := start(t, env, "agent", "--client-id", "vars-agent", "--allow", "env")
	require.Eventually(t, func() bool {
		out, _ := cli(t, env, "pools", "--json")
		return strings.Contains(out, `"idle": 1`)
	}, 30*time.Second, 100*time.Millisecond, "the agent connected with its client key, and pools ran with the admin key")

	var acq struct{ Lease cheetah.Lease }
	require.Equal(t, 201, a.call("POST", "/api/v1/acquire", admin, map[string]any{"user_id": "usr_vars", "task_id": "env", "client_type": "console"}, &acq))
	var waited struct{ Resolution cheetah.Resolution }
	require.Equal(t, 200, a.call("POST", "/api/v1/commands/wait", admin,
		map[string]any{"name": "exec", "params": map[string]any{"argv": []string{"env"}}, "timeout_ms": 20000}, &waited, "X-Lease", acq.Lease.LeaseToken))
	require.Equal(t, cheetah.StatusCompleted, waited.Resolution.Status)
	var read struct{ Command cheetah.CommandRecord }
	require.Equal(t, 200, a.call("GET", "/api/v1/users/usr_vars/commands/"+waited.Resolution.CommandID, admin, nil, &read))
	var progress strings.Builder
	for _, m := range read.Command.Messages {
		progress.Write(m.Data)
	}
	require.Contains(t, progress.String(), "CHEETAH_URL", "the program's environment came back")
	require.NotContains(t, progress.String(), client.Key, "the client key is not passed on")
	require.NotContains(t, progress.String(), admin, "nor the admin key")
	require.NoError(t, agentProc.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, agentProc.cmd.Wait(), "the agent was never refused")
	// Its own words for a refusal (4401, 4403, 4409); the bare code could
	// appear in a random session id.
	require.NotContains(t, agentProc.out.String(), "refused the agent")
}

// TestCLIOldKeyVariableIsNotRead: CHEETAH_KEY is no key of any command; a
// command without its key says which variable it reads, and repeats no key.
func TestCLIOldKeyVariableIsNotRead(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	t.Parallel()
	const secret = "old-variable-secret-0123456789"
	env := []string{"CHEETAH_URL=http://127.0.0.1:1", "CHEETAH_KEY=" + secret, "CHEETAH_ADMIN_KEY=", "CHEETAH_CLIENT_KEY="}
	for _, c := range []struct {
		args []string
		want string
	}{{[]string{"agent"}, "CHEETAH_CLIENT_KEY"}, {[]string{"pools"}, "CHEETAH_ADMIN_KEY"}} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cmd := exec.CommandContext(ctx, binary, c.args...)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		cancel()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "%v: %s", c.args, out)
		require.Equal(t, 4, ee.ExitCode(), "%v: no key: %s", c.args, out)
		require.Contains(t, string(out), c.want)
		require.NotContains(t, string(out), secret)
	}
}

// TestCLIHelpNamesEachVariableOnce: a flag's help names its variable once.
func TestCLIHelpNamesEachVariableOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	t.Parallel()
	for _, args := range [][]string{{"pools"}, {"keys", "create"}, {"revoke"}, {"agent"}, {"serve"}, {"migrate"}} {
		out, _, code := cliAll(t, nil, append(args, "--help")...)
		require.Zero(t, code, args)
		vars := regexp.MustCompile(`CHEETAH_[A-Z_]+`).FindAllString(out, -1)
		require.NotEmpty(t, vars, args)
		seen := map[string]int{}
		for _, v := range vars {
			seen[v]++
		}
		for v, n := range seen {
			require.Equal(t, 1, n, "%v --help names %s %d times:\n%s", args, v, n, out)
		}
		require.NotContains(t, out, "CHEETAH_KEY ", args)
		require.NotContains(t, out, "CHEETAH_KEY)", args)
		require.NotRegexp(t, `\ba app\b`, out, args)
	}
	out, _, _ := cliAll(t, nil, "agent", "--help")
	require.Contains(t, out, "$CHEETAH_CLIENT_KEY")
	require.NotContains(t, out, "CHEETAH_ADMIN_KEY")
	out, _, _ = cliAll(t, nil, "pools", "--help")
	require.Contains(t, out, "$CHEETAH_ADMIN_KEY")
	require.NotContains(t, out, "CHEETAH_CLIENT_KEY")
}

// TestCLIUsageErrors: bad ids and addresses are usage errors (exit 2),
// found before anything is sent; with --json they are JSON too.
func TestCLIUsageErrors(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	t.Parallel()
	var mu sync.Mutex
	var asked []string
	broker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked = append(asked, r.Method+" "+r.URL.String())
		mu.Unlock()
		http.Error(w, `{"error":{"code":"not_found","message":"no"}}`, 404)
	}))
	t.Cleanup(broker.Close)
	env := []string{"CHEETAH_URL=" + broker.URL, "CHEETAH_ADMIN_KEY=usage-admin-key", "CHEETAH_CLIENT_KEY=usage-client-key"}
	for _, args := range [][]string{
		{"revoke", "bad user!", "agent", "flow-1"},
		{"revoke", "usr_1", "a/b", "flow-1"},
		{"revoke", "usr_1", "agent", ".."},
		{"disconnect", "usr_1", "bad client"},
		{"history", "not an id", "--user", "usr_1"},
		{"history", "0191", "--user", "usr/1"},
		{"keys", "revoke", "../admin/keys"},
		{"keys", "create", "--kind", "client", "--user", "bad user"},
		{"clients", "--user", "bad user"},
		{"leases", "--user", "usr 1"},
		{"pools", "--url", "not-a-url"},
		{"pools", "--url", "ftp://127.0.0.1:8420"},
		{"pools", "--url", "http://"},
		{"agent", "--url", "not-a-url"},
		{"agent", "--flows", "0"},
		{"pools", "--no-such-flag"},
	} {
		stdout, stderr, code := cliAll(t, env, args...)
		require.Equal(t, 2, code, "%v: %s", args, stderr)
		require.NotEmpty(t, stderr, args)
		require.Empty(t, stdout, args)
		if args[0] != "agent" {
			stdout, stderr, code = cliAll(t, env, append(args, "--json")...)
			require.Equal(t, 2, code, "%v --json: %s", args, stderr)
			requireJSONError(t, stdout, stderr, "invalid_request")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, asked, "nothing reaches the broker")
}

// TestMigrateStatusCreatesNothing: migrate --status on a data dir that does
// not exist says so and leaves it absent; migrate then creates it.
func TestMigrateStatusCreatesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "absent")
	_, stderr, code := cliAll(t, nil, "migrate", "--status", "--data-dir", dir)
	require.Equal(t, 3, code, stderr)
	require.Contains(t, stderr, "no store")
	require.NoDirExists(t, dir)
	_, stderr, code = cliAll(t, nil, "migrate", "--status", "--database-url", "sqlite://"+filepath.Join(dir, "x.db"))
	require.Equal(t, 3, code, stderr)
	require.NoDirExists(t, dir)

	out, _, code := cliAll(t, nil, "migrate", "--data-dir", dir)
	require.Zero(t, code)
	require.Regexp(t, `1\s+00001_init.sql\s+true`, out)
	out, _, code = cliAll(t, nil, "migrate", "--status", "--data-dir", dir)
	require.Zero(t, code)
	require.Regexp(t, `1\s+00001_init.sql\s+true`, out)
}

// post sends one request off the test's goroutine and reports what came
// back; it asserts nothing.
func post(base, path, key string, body any, headers ...string) (int, []byte, error) {
	return postSeen(base, path, key, body, nil, headers...)
}

// postSeen is post that hands the answer's headers to seen (when set) as
// soon as they come, before the body.
func postSeen(base, path, key string, body any, seen func(http.Header), headers ...string) (int, []byte, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequest("POST", base+path, bytes.NewReader(b))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	if seen != nil {
		seen(resp.Header)
	}
	raw, err := io.ReadAll(resp.Body)
	return resp.StatusCode, raw, err
}

type waitAnswer struct {
	status int
	res    cheetah.Resolution
	err    error
}

// shutdownRig is a broker and an agent offering flows that may run sleep.
type shutdownRig struct {
	a          api
	serve      *proc
	agent      *proc
	dataDir    string
	app, admin string
}

func newShutdownRig(t *testing.T, flows int, serveArgs ...string) *shutdownRig {
	t.Helper()
	addr := freePort(t)
	r := &shutdownRig{admin: "shutdown-admin-key-0123456789", dataDir: t.TempDir()}
	r.serve = start(t, []string{"CHEETAH_ADMIN_KEY=" + r.admin, "CHEETAH_DATA_DIR=" + r.dataDir, "CHEETAH_LISTEN=" + addr},
		append([]string{"serve"}, serveArgs...)...)
	r.a = api{t: t, base: "http://" + addr}
	require.Eventually(t, func() bool { return r.a.call("GET", "/readyz", "", nil, nil) == 200 }, 30*time.Second, 50*time.Millisecond)
	var client, app struct{ Key string }
	require.Equal(t, 201, r.a.call("POST", "/api/v1/admin/keys", r.admin, map[string]any{"kind": "client", "user_id": "usr_stop", "name": "agent"}, &client))
	require.Equal(t, 201, r.a.call("POST", "/api/v1/admin/keys", r.admin, map[string]any{"kind": "app", "name": "app"}, &app))
	r.app = app.Key
	r.agent = start(t, []string{"CHEETAH_CLIENT_KEY=" + client.Key, "CHEETAH_URL=" + r.a.base},
		"agent", "--client-id", "stop-agent", "--flows", fmt.Sprint(flows), "--allow", "sleep")
	var avail struct{ Contexts []cheetah.ContextSnapshot }
	require.Eventually(t, func() bool {
		r.a.call("GET", "/api/v1/users/usr_stop/contexts/available?client_type=console", r.app, nil, &avail)
		return len(avail.Contexts) == flows
	}, 30*time.Second, 50*time.Millisecond)
	return r
}

func (r *shutdownRig) lease(task string) string {
	r.a.t.Helper()
	var acq struct{ Lease cheetah.Lease }
	require.Equal(r.a.t, 201, r.a.call("POST", "/api/v1/acquire", r.app, map[string]any{"user_id": "usr_stop", "task_id": task, "client_type": "console"}, &acq))
	return acq.Lease.LeaseToken
}

// sleepWait starts a commands/wait of `sleep secs` and answers on the
// returned channel.
func (r *shutdownRig) sleepWait(token string, secs int) chan waitAnswer {
	ch := make(chan waitAnswer, 1)
	go func() {
		st, raw, err := post(r.a.base, "/api/v1/commands/wait", r.app,
			map[string]any{"name": "exec", "params": map[string]any{"argv": []string{"sleep", fmt.Sprint(secs)}}, "timeout_ms": 120000},
			"X-Lease", token)
		var out struct{ Resolution cheetah.Resolution }
		if err == nil && st == 200 {
			err = json.Unmarshal(raw, &out)
		}
		ch <- waitAnswer{status: st, res: out.Resolution, err: err}
	}()
	return ch
}

// running waits until the task's newest command has reached the agent.
func (r *shutdownRig) running(task string) string {
	r.a.t.Helper()
	var id string
	require.Eventually(r.a.t, func() bool {
		var page cheetah.CommandPage
		r.a.call("GET", "/api/v1/users/usr_stop/commands?task_id="+task, r.app, nil, &page)
		if len(page.Commands) == 0 || page.Commands[0].Status != cheetah.StatusAcknowledged {
			return false
		}
		id = page.Commands[0].CommandID
		return true
	}, 30*time.Second, 20*time.Millisecond)
	return id
}

func (r *shutdownRig) exited(t *testing.T, within time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- r.serve.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(within):
		t.Fatalf("serve did not exit within %s", within)
		return nil
	}
}

func readAnswer(t *testing.T, ch chan waitAnswer) waitAnswer {
	t.Helper()
	select {
	case w := <-ch:
		require.NoError(t, w.err)
		return w
	case <-time.After(60 * time.Second):
		t.Fatal("no answer")
		return waitAnswer{}
	}
}

// SIGTERM with commands in flight: /readyz turns 503 and new work is
// refused while they run on; the one that ends within --shutdown-timeout
// completes, the rest are marked interrupted (by this stop, not by the next
// start), their waiting callers are told, history is flushed, and serve
// exits 0. Nothing admitted is missing.
func TestServeShutdownWithCommandsInFlight(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	t.Parallel()
	r := newShutdownRig(t, 3, "--shutdown-timeout", "5s", "--log-format", "json")
	quick, slow, async := r.lease("quick"), r.lease("slow"), r.lease("async")
	quickDone := r.sleepWait(quick, 2)
	slowDone := r.sleepWait(slow, 60)
	var sent cheetah.Sent
	require.Equal(t, 202, r.a.call("POST", "/api/v1/commands", r.app,
		map[string]any{"name": "exec", "params": map[string]any{"argv": []string{"sleep", "60"}}}, &sent, "X-Lease", async))
	ids := map[string]string{"quick": r.running("quick"), "slow": r.running("slow"), "async": r.running("async")}
	require.Equal(t, sent.CommandID, ids["async"])

	require.NoError(t, r.serve.cmd.Process.Signal(syscall.SIGTERM))
	require.Eventually(t, func() bool { return r.a.call("GET", "/readyz", "", nil, nil) == 503 }, 5*time.Second, 10*time.Millisecond,
		"a draining broker is not ready")
	require.Equal(t, 200, r.a.call("GET", "/healthz", "", nil, nil), "but alive")
	require.Equal(t, 503, r.a.call("POST", "/api/v1/acquire", r.app, map[string]any{"user_id": "usr_stop", "task_id": "late", "client_type": "console"}, nil),
		"no new work while draining")

	w := readAnswer(t, quickDone)
	require.Equal(t, 200, w.status)
	require.Equal(t, cheetah.StatusCompleted, w.res.Status, "finished within the shutdown timeout")
	w = readAnswer(t, slowDone)
	require.Equal(t, 200, w.status)
	require.Equal(t, cheetah.StatusInterrupted, w.res.Status, "the caller that waited is told")
	require.Equal(t, ids["slow"], w.res.CommandID)

	require.NoError(t, r.exited(t, 30*time.Second), "serve exits 0")
	out := r.serve.out.String()
	require.Contains(t, out, `"msg":"commands still in flight were marked interrupted","count":2`)
	require.NotContains(t, out, r.admin)
	require.NotContains(t, out, r.app)
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		require.True(t, json.Valid([]byte(line)), "a JSON log line: %s", line)
	}
	// The agent hears the close on its own time: under load, after serve
	// has exited. It is stopped only once it has. (Its words, not the
	// code alone, which a random session id may hold.)
	require.Eventually(t, func() bool {
		return strings.Contains(r.agent.out.String(), "the broker is going away")
	}, 30*time.Second, 10*time.Millisecond, "the agent was closed with going-away (1001)")
	require.NoError(t, r.agent.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, r.agent.cmd.Wait())

	// History, read straight from the store: nothing is left in flight.
	store, err := history.Open(context.Background(), history.Config{DataDir: r.dataDir})
	require.NoError(t, err)
	defer store.Close()
	page, err := store.List(context.Background(), "usr_stop", cheetah.ListQuery{Limit: 100})
	require.NoError(t, err)
	require.Len(t, page.Commands, 3, "every admitted command is there")
	want := map[string]cheetah.Status{"quick": cheetah.StatusCompleted, "slow": cheetah.StatusInterrupted, "async": cheetah.StatusInterrupted}
	for task, id := range ids {
		rec, err := store.Get(context.Background(), "usr_stop", id)
		require.NoError(t, err)
		require.Equal(t, want[task], rec.Status, task)
		require.NotNil(t, rec.FinishedAt, task)
		if rec.Status == cheetah.StatusInterrupted {
			require.Equal(t, "the broker shut down before the command ended", rec.Error.Message, "marked by this stop")
		}
	}
}

// A second signal ends serve at once, without waiting out the shutdown
// timeout; what was in flight is marked interrupted at the next start.
func TestServeSecondSignalExitsAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	t.Parallel()
	r := newShutdownRig(t, 1, "--shutdown-timeout", "5m")
	r.sleepWait(r.lease("long"), 60)
	id := r.running("long")

	require.NoError(t, r.serve.cmd.Process.Signal(syscall.SIGTERM))
	require.Eventually(t, func() bool { return r.a.call("GET", "/readyz", "", nil, nil) == 503 }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, r.serve.cmd.Process.Signal(syscall.SIGTERM))
	err := r.exited(t, 10*time.Second)
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "a second signal is not a clean stop")
	require.Contains(t, r.serve.out.String(), "second signal")

	store, err := history.Open(context.Background(), history.Config{DataDir: r.dataDir})
	require.NoError(t, err)
	rec, err := store.Get(context.Background(), "usr_stop", id)
	require.NoError(t, err)
	require.False(t, rec.Status.Terminal(), "left in flight")
	require.NoError(t, store.Close())

	// The next start marks it.
	addr := freePort(t)
	start(t, []string{"CHEETAH_ADMIN_KEY=" + r.admin, "CHEETAH_DATA_DIR=" + r.dataDir, "CHEETAH_LISTEN=" + addr}, "serve")
	a := api{t: t, base: "http://" + addr}
	require.Eventually(t, func() bool { return a.call("GET", "/readyz", "", nil, nil) == 200 }, 30*time.Second, 50*time.Millisecond)
	var read struct{ Command cheetah.CommandRecord }
	require.Equal(t, 200, a.call("GET", "/api/v1/users/usr_stop/commands/"+id, r.app, nil, &read))
	require.Equal(t, cheetah.StatusInterrupted, read.Command.Status)
}

// collector is a fake OpenTelemetry collector: it takes OTLP over HTTP
// (protobuf) and keeps the spans and metric names it was sent, by service.
type collector struct {
	mu      sync.Mutex
	spans   map[string][]*tracepb.Span // by service.name
	metrics map[string]map[string]bool // service.name → metric names
}

func newCollector(t *testing.T) (*collector, string) {
	t.Helper()
	c := &collector{spans: map[string][]*tracepb.Span{}, metrics: map[string]map[string]bool{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		switch r.URL.Path {
		case "/v1/traces":
			var req coltracepb.ExportTraceServiceRequest
			if err := proto.Unmarshal(body, &req); err != nil {
				http.Error(w, err.Error(), 400)
				return
			}
			for _, rs := range req.ResourceSpans {
				svc := serviceName(rs.Resource)
				for _, ss := range rs.ScopeSpans {
					c.spans[svc] = append(c.spans[svc], ss.Spans...)
				}
			}
		case "/v1/metrics":
			var req colmetricpb.ExportMetricsServiceRequest
			if err := proto.Unmarshal(body, &req); err != nil {
				http.Error(w, err.Error(), 400)
				return
			}
			for _, rm := range req.ResourceMetrics {
				svc := serviceName(rm.Resource)
				if c.metrics[svc] == nil {
					c.metrics[svc] = map[string]bool{}
				}
				for _, sm := range rm.ScopeMetrics {
					for _, m := range sm.Metrics {
						c.metrics[svc][m.Name] = true
					}
				}
			}
		default:
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(srv.Close)
	return c, srv.URL
}

func serviceName(r *resourcepb.Resource) string {
	for _, kv := range r.GetAttributes() {
		if kv.Key == "service.name" {
			return kv.Value.GetStringValue()
		}
	}
	return ""
}

func (c *collector) span(service, name string) *tracepb.Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.spans[service] {
		if s.Name == name {
			return s
		}
	}
	return nil
}

func (c *collector) hasMetric(service, name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.metrics[service][name]
}

// With OTEL_EXPORTER_OTLP_ENDPOINT set, serve and agent send their traces
// and metrics to the collector over OTLP/HTTP: the broker's command span and
// the agent's span are one trace, joined by the command frame's traceparent.
func TestServeExportsOTLP(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	t.Parallel()
	col, endpoint := newCollector(t)
	otelEnv := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + endpoint, "OTEL_BSP_SCHEDULE_DELAY=50", "OTEL_METRIC_EXPORT_INTERVAL=100"}
	addr := freePort(t)
	admin := "otlp-admin-key-0123456789"
	serve := start(t, append([]string{"CHEETAH_ADMIN_KEY=" + admin, "CHEETAH_DATA_DIR=" + t.TempDir(), "CHEETAH_LISTEN=" + addr}, otelEnv...), "serve")
	a := api{t: t, base: "http://" + addr}
	require.Eventually(t, func() bool { return a.call("GET", "/readyz", "", nil, nil) == 200 }, 30*time.Second, 50*time.Millisecond)
	var client struct{ Key string }
	require.Equal(t, 201, a.call("POST", "/api/v1/admin/keys", admin, map[string]any{"kind": "client", "user_id": "usr_otlp", "name": "agent"}, &client))
	agentProc := start(t, append([]string{"CHEETAH_CLIENT_KEY=" + client.Key, "CHEETAH_URL=" + a.base}, otelEnv...), "agent", "--client-id", "otlp-agent")

	var acq struct{ Lease cheetah.Lease }
	require.Eventually(t, func() bool {
		return a.call("POST", "/api/v1/acquire", admin, map[string]any{"user_id": "usr_otlp", "task_id": "otlp", "client_type": "console"}, &acq) == 201
	}, 30*time.Second, 50*time.Millisecond)
	var waited struct{ Resolution cheetah.Resolution }
	require.Equal(t, 200, a.call("POST", "/api/v1/commands/wait", admin, map[string]any{"name": "echo"}, &waited, "X-Lease", acq.Lease.LeaseToken))
	require.Equal(t, cheetah.StatusCompleted, waited.Resolution.Status)

	var cmd, dispatch, side *tracepb.Span
	require.Eventually(t, func() bool {
		cmd, dispatch = col.span("cheetah", "cheetah.command"), col.span("cheetah", "cheetah.dispatch")
		side = col.span("cheetah-agent", "cheetah.agent.command")
		return cmd != nil && dispatch != nil && side != nil
	}, 30*time.Second, 50*time.Millisecond, "spans of both processes reach the collector")
	require.Equal(t, waited.Resolution.TraceID, fmt.Sprintf("%x", cmd.TraceId))
	require.Equal(t, cmd.TraceId, side.TraceId, "one trace")
	require.Equal(t, dispatch.SpanId, side.ParentSpanId, "the agent's span is the dispatch span's child")
	require.Eventually(t, func() bool {
		return col.hasMetric("cheetah", "cheetah.acquires") && col.hasMetric("cheetah", "cheetah.command.duration")
	}, 30*time.Second, 50*time.Millisecond, "metrics reach the collector")

	require.NoError(t, agentProc.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, serve.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, serve.cmd.Wait())
}
