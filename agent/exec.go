package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/cheetahbroker/cheetah/protocol"
)

// chunkSize caps the text of one progress frame of Exec. Output is sent as it
// arrives, so most chunks are much smaller; the cap keeps a fast writer from
// producing frames the broker has to buffer whole.
const chunkSize = 32 << 10

// waitDelay bounds how long Exec waits for a program's output pipes to close
// after the program itself has exited or been killed. A background process
// that inherited the pipes would otherwise hold the command open.
const waitDelay = 2 * time.Second

// The effects of the built-in handlers, for Config.Effects: echo reads
// nothing and changes nothing; exec runs a program, which may change
// anything.
const (
	EchoEffect = protocol.EffectObserve
	ExecEffect = protocol.EffectMutate
)

// Echo returns a handler whose result is the command's params, byte for
// byte. It is handy for checking that a client is reachable.
func Echo() Handler {
	return func(_ context.Context, cmd *protocol.Command, _ Output) (any, error) {
		return cmd.Params, nil
	}
}

// ExecParams are the params of an Exec command.
type ExecParams struct {
	// Argv is the program and its arguments. No shell is involved.
	Argv []string `json:"argv"`
	// Stdin, when set, is the program's standard input; otherwise the
	// program reads from the null device.
	Stdin *string `json:"stdin,omitempty"`
	// Dir is the working directory; empty means the agent's.
	Dir string `json:"dir,omitempty"`
	// Env adds to (or overrides in) the agent's environment.
	Env map[string]string `json:"env,omitempty"`
}

// ExecResult is the result of an Exec command. A program that exits with a
// non-zero status has still run: the exit code is a result, not an error.
type ExecResult struct {
	// ExitCode is the program's exit status, or -1 when a signal ended it.
	ExitCode int `json:"exit_code"`
	// Signal names the signal that ended the program, if one did.
	Signal string `json:"signal,omitempty"`
}

// execChunk is the data of one progress frame of Exec.
type execChunk struct {
	Stream string `json:"stream"` // "stdout" or "stderr"
	Data   string `json:"data"`
}

// Exec returns a handler that runs a program, given as ExecParams, and
// streams its stdout and stderr as progress frames
// {"stream":"stdout"|"stderr","data":"…"} while it runs. Its result is an
// ExecResult.
//
// Only programs on allow may run: argv[0] must equal an entry, or resolve
// (through PATH, as exec.LookPath does) to an absolute path that equals an
// entry. So "sh" on the list allows argv[0] "sh", and "/bin/sh" on the list
// allows both "/bin/sh" and "sh" where PATH finds sh in /bin. Anything else
// fails with code not_allowed; a program that cannot be started fails with
// exec_failed. Cancelling the command, or its timeout, kills the program
// and, on Unix, every process it started in its process group.
func Exec(allow []string) Handler {
	allowed := make(map[string]bool, len(allow))
	for _, p := range allow {
		allowed[p] = true
	}
	return func(ctx context.Context, cmd *protocol.Command, out Output) (any, error) {
		var p ExecParams
		if err := ParseParams(cmd, &p); err != nil {
			return nil, err
		}
		if len(p.Argv) == 0 || p.Argv[0] == "" {
			return nil, &CommandError{Code: CodeInvalidParams, Message: "argv must name a program"}
		}
		path, err := resolveProgram(p.Argv[0], allowed)
		if err != nil {
			return nil, err
		}
		return runProgram(ctx, path, p, out)
	}
}

// resolveProgram checks name against the allowlist and finds the file to
// run. The file found is the one that was checked, so that the check and the
// start cannot disagree.
func resolveProgram(name string, allowed map[string]bool) (string, error) {
	path, lookErr := exec.LookPath(name)
	if allowed[name] {
		if lookErr != nil {
			return "", &CommandError{Code: CodeExecFailed, Message: lookErr.Error()}
		}
		return path, nil
	}
	if lookErr == nil && filepath.IsAbs(path) && allowed[path] {
		return path, nil
	}
	return "", &CommandError{Code: CodeNotAllowed,
		Message: fmt.Sprintf("program %q is not on the agent's allowlist", name)}
}

func runProgram(ctx context.Context, path string, p ExecParams, out Output) (any, error) {
	c := exec.CommandContext(ctx, path, p.Argv[1:]...)
	c.Args[0] = p.Argv[0] // the program sees its name as the caller wrote it, as a shell would do
	c.Dir = p.Dir
	if len(p.Env) > 0 {
		c.Env = os.Environ()
		for _, k := range slices.Sorted(maps.Keys(p.Env)) {
			c.Env = append(c.Env, k+"="+p.Env[k]) // later entries win
		}
	}
	if p.Stdin != nil {
		c.Stdin = strings.NewReader(*p.Stdin)
	}
	stdout := &streamWriter{stream: "stdout", out: out}
	stderr := &streamWriter{stream: "stderr", out: out}
	c.Stdout, c.Stderr = stdout, stderr
	c.WaitDelay = waitDelay
	killProcessGroup(c)

	// The parent-death signal (Linux) follows the thread that forked, not
	// the process: this goroutine keeps that thread until the program has
	// been waited for, so that no other goroutine can end it meanwhile.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := c.Start(); err != nil {
		return nil, &CommandError{Code: CodeExecFailed, Message: fmt.Sprintf("start %s: %v", p.Argv[0], err)}
	}
	err := c.Wait()
	stdout.flush()
	stderr.flush()
	if ctx.Err() != nil {
		return nil, fmt.Errorf("exec %s: %w", p.Argv[0], context.Cause(ctx))
	}
	if _, exited := errors.AsType[*exec.ExitError](err); err != nil && !exited && !errors.Is(err, exec.ErrWaitDelay) {
		return nil, &CommandError{Code: CodeExecFailed, Message: fmt.Sprintf("wait for %s: %v", p.Argv[0], err)}
	}
	return ExecResult{ExitCode: c.ProcessState.ExitCode(), Signal: signalName(c.ProcessState)}, nil
}

// streamWriter turns one output stream of a program into progress frames.
// It sends text, so it never splits a UTF-8 character between two frames:
// an incomplete character at the end of a write waits for the next one.
type streamWriter struct {
	stream string
	out    Output

	// mu serializes Write and flush: after WaitDelay the copying goroutine
	// may still be inside Write when Exec flushes.
	mu      sync.Mutex
	pending []byte // the start of a character cut off by the last write
}

// Write never fails: a program must not block or die because the broker is
// unreachable for a while, so output that cannot be sent is dropped.
func (w *streamWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	b := append(w.pending, p...)
	n := completeText(b)
	w.pending = append([]byte(nil), b[n:]...)
	w.emit(b[:n])
	return len(p), nil
}

func (w *streamWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.emit(w.pending)
	w.pending = nil
}

func (w *streamWriter) emit(b []byte) {
	for len(b) > 0 {
		n := len(b)
		if n > chunkSize {
			n = charBoundary(b, chunkSize)
		}
		w.send(b[:n])
		b = b[n:]
	}
}

// send sends b in one frame, or in halves when the frame would exceed the
// broker's limit: the text escaped as JSON can be several times longer than
// the bytes, so only the encoded frame can say whether it fits.
func (w *streamWriter) send(b []byte) {
	err := w.out.Progress(execChunk{Stream: w.stream, Data: string(b)})
	if errors.Is(err, ErrTooLarge) && len(b) > 1 {
		half := charBoundary(b, len(b)/2)
		w.send(b[:half])
		w.send(b[half:])
	}
}

// completeText returns the length of the longest prefix of b that does not
// end inside a UTF-8 character. Bytes that are not UTF-8 at all count as
// complete: they will be sent as U+FFFD, not held back forever.
func completeText(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if utf8.FullRune(b[i:]) {
				return len(b)
			}
			return i
		}
	}
	return len(b)
}

// charBoundary returns the largest index at most n, and above 0, that starts
// a UTF-8 character in b, or n when there is none.
func charBoundary(b []byte, n int) int {
	for i := n; i > 0 && i > n-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			return i
		}
	}
	return max(n, 1)
}
