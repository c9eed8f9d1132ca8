//go:build unix

package agent_test

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cheetahbroker/cheetah/agent"
	"github.com/cheetahbroker/cheetah/protocol"
)

type chunk struct {
	Stream string `json:"stream"`
	Data   string `json:"data"`
}

// execOutput runs an exec command to its end and returns what it printed on
// each stream and its terminal frame.
func execOutput(t *testing.T, bc *brokerConn, cmd *protocol.Command) (stdout, stderr string, end protocol.Frame) {
	t.Helper()
	bc.send(t, cmd)
	var out, errOut strings.Builder
	for _, f := range bc.untilTerminal(t, cmd.CommandID) {
		switch f := f.(type) {
		case *protocol.Progress:
			var c chunk
			require.NoError(t, json.Unmarshal(f.Data, &c))
			switch c.Stream {
			case "stdout":
				out.WriteString(c.Data)
			case "stderr":
				errOut.WriteString(c.Data)
			default:
				t.Fatalf("progress of unknown stream %q", c.Stream)
			}
		case *protocol.Result, *protocol.Error:
			end = f
		}
	}
	return out.String(), errOut.String(), end
}

func execCommand(id string, argv ...string) *protocol.Command {
	params, _ := json.Marshal(map[string]any{"argv": argv})
	return command(id, "flow-1", "exec", string(params))
}

func TestExecStreamsOutputAndExitCode(t *testing.T) {
	t.Parallel()
	b := newFakeBroker(t, 1<<20)
	_, bc := startConnected(t, b, testConfig(b), map[string]agent.Handler{"exec": agent.Exec([]string{"sh"})})

	stdout, stderr, end := execOutput(t, bc, execCommand("c1", "sh", "-c", "echo out; echo err >&2; exit 3"))
	require.Equal(t, "out\n", stdout)
	require.Equal(t, "err\n", stderr)
	require.Equal(t, &protocol.Result{CommandID: "c1", Data: json.RawMessage(`{"exit_code":3}`)}, end)
}

func TestExecStdinDirAndEnv(t *testing.T) {
	t.Parallel()
	b := newFakeBroker(t, 1<<20)
	_, bc := startConnected(t, b, testConfig(b), map[string]agent.Handler{"exec": agent.Exec([]string{"sh"})})
	dir, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)

	params, err := json.Marshal(agent.ExecParams{
		Argv:  []string{"sh", "-c", `printf '%s|%s|' "$GREETING" "$(pwd)"; cat`},
		Stdin: new("from stdin"),
		Dir:   dir,
		Env:   map[string]string{"GREETING": "hi"},
	})
	require.NoError(t, err)
	stdout, _, end := execOutput(t, bc, command("c1", "flow-1", "exec", string(params)))
	require.Equal(t, "hi|"+dir+"|from stdin", stdout)
	require.IsType(t, &protocol.Result{}, end)
}

func TestExecAllowlist(t *testing.T) {
	t.Parallel()
	shPath, err := exec.LookPath("sh")
	require.NoError(t, err)
	b := newFakeBroker(t, 1<<20)
	_, bc := startConnected(t, b, testConfig(b), map[string]agent.Handler{
		"by-name": agent.Exec([]string{"sh", "cheetah-no-such-program"}),
		"by-path": agent.Exec([]string{shPath}),
	})
	run := func(id, handler string, argv ...string) protocol.Frame {
		cmd := execCommand(id, argv...)
		cmd.Name = handler
		_, _, end := execOutput(t, bc, cmd)
		return end
	}
	code := func(f protocol.Frame) string {
		e, ok := f.(*protocol.Error)
		require.Truef(t, ok, "want an error, got %+v", f)
		return string(e.Code)
	}

	require.Equal(t, agent.CodeNotAllowed, code(run("c1", "by-name", "ls")))
	require.Equal(t, agent.CodeNotAllowed, code(run("c2", "by-name", shPath)),
		"a name on the list does not allow other paths")
	require.Equal(t, agent.CodeExecFailed, code(run("c3", "by-name", "cheetah-no-such-program")))
	require.IsType(t, &protocol.Result{}, run("c4", "by-path", "sh", "-c", "exit 0"),
		"an absolute path on the list allows the name that resolves to it")
	require.IsType(t, &protocol.Result{}, run("c5", "by-path", shPath, "-c", "exit 0"))
}

func TestExecCancelKillsProcessGroup(t *testing.T) {
	t.Parallel()
	b := newFakeBroker(t, 1<<20)
	_, bc := startConnected(t, b, testConfig(b), map[string]agent.Handler{"exec": agent.Exec([]string{"sh"})})

	// The shell prints its own pid and the pid of a child, then waits.
	bc.send(t, execCommand("c1", "sh", "-c", `sleep 30 & echo $$ $!; wait`))
	require.IsType(t, &protocol.Ack{}, bc.nextFrame(t))
	var c chunk
	require.NoError(t, json.Unmarshal(next[*protocol.Progress](t, bc).Data, &c))
	pids := strings.Fields(c.Data)
	require.Len(t, pids, 2)

	began := time.Now()
	bc.send(t, &protocol.Cancel{CommandID: "c1"})
	e := next[*protocol.Error](t, bc)
	require.Equal(t, agent.CodeCancelled, string(e.Code))
	require.Less(t, time.Since(began), 5*time.Second, "cancel must not wait for the program")

	for _, p := range pids {
		pid, err := strconv.Atoi(p)
		require.NoError(t, err)
		// The child is killed too, but reaped by whoever inherits it, so
		// its end is observed rather than waited for.
		require.Eventually(t, func() bool { return processGone(pid) }, guard, 10*time.Millisecond,
			"process %d survived the cancel", pid)
	}
}

func TestExecTimeout(t *testing.T) {
	t.Parallel()
	b := newFakeBroker(t, 1<<20)
	_, bc := startConnected(t, b, testConfig(b), map[string]agent.Handler{"exec": agent.Exec([]string{"sleep"})})

	cmd := execCommand("c1", "sleep", "30")
	cmd.TimeoutMS = 100
	_, _, end := execOutput(t, bc, cmd)
	e, ok := end.(*protocol.Error)
	require.True(t, ok)
	require.Equal(t, agent.CodeTimeout, string(e.Code))
}

func TestExecSplitsOutputToFitFrames(t *testing.T) {
	t.Parallel()
	const limit = 300
	b := newFakeBroker(t, limit) // the broker closes the connection on a larger frame
	_, bc := startConnected(t, b, testConfig(b), map[string]agent.Handler{"exec": agent.Exec([]string{"cat"})})

	// Multi-byte characters and characters JSON escapes, so that neither a
	// byte count nor a character count alone predicts the frame size.
	input := strings.Repeat("héllo wörld ✓ \"quoted\"\t<tag>\n", 200)
	params, err := json.Marshal(agent.ExecParams{Argv: []string{"cat"}, Stdin: &input})
	require.NoError(t, err)
	// The limit binds the agent's frames only; the broker's own command
	// frame may be larger.
	stdout, _, end := execOutput(t, bc, command("c1", "flow-1", "exec", string(params)))
	require.Equal(t, input, stdout)
	require.IsType(t, &protocol.Result{}, end)
}

// processGone reports whether pid no longer runs: it does not exist, or it is
// a zombie waiting for a parent to reap it.
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] == 'Z'
}
