// Package rig is the reliability suite's test rig: the cheetah binary built
// once per test binary, processes that are always stopped, a PostgreSQL
// cluster of the test's own, a small HTTP client for the API, raw protocol
// clients and the independent epoch checker that fake clients feed.
package rig

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cheetahbroker/cheetah/internal/syncbuf"
)

// Build compiles the cheetah binary into dir and returns its path. Test
// binaries call it from TestMain.
func Build(dir string) (string, error) {
	bin := filepath.Join(dir, "cheetah")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/cheetahbroker/cheetah/cmd/cheetah")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build cheetah: %v\n%s", err, out)
	}
	return bin, nil
}

// Proc is a process started by a test, in a process group of its own so
// that whatever it starts (an agent's exec children) is stopped with it.
type Proc struct {
	Name string
	Cmd  *exec.Cmd
	Out  *syncbuf.Buffer
	done chan struct{}
	err  error
}

// Start runs bin with args and env (added to the test's environment). The
// process group is killed when the test ends, whatever happened.
func Start(t testing.TB, name string, env []string, bin string, args ...string) *Proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &Proc{Name: name, Cmd: cmd, Out: out, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("%s output (last 8 KiB):\n%s", name, tail(out.String(), 8<<10))
		}
	})
	return p
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Kill sends SIGKILL to the whole process group, and to every descendant
// that left it (the agent starts each program in a group of its own), and
// waits for the process.
func (p *Proc) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	// Found before the kill: once the parent is gone they belong to init.
	rest := descendants(p.Cmd.Process.Pid)
	_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL)
	for _, pid := range rest {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	<-p.done
}

// Descendants lists the processes below p that are running now.
func (p *Proc) Descendants() []int { return descendants(p.Cmd.Process.Pid) }

// Running reports whether process pid exists and has not exited (a zombie
// waiting for its parent has).
func Running(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+1:]))
	return i >= 0 && len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// descendants lists the processes below pid, from /proc.
func descendants(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil {
			children[ppid] = append(children[ppid], child)
		}
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		next := queue[0]
		queue = queue[1:]
		for _, c := range children[next] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// Signal sends sig to the process group.
func (p *Proc) Signal(sig syscall.Signal) error { return syscall.Kill(-p.Cmd.Process.Pid, sig) }

// Stop sends SIGTERM and waits up to grace for the exit, then kills.
func (p *Proc) Stop(grace time.Duration) error {
	_ = p.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return p.err
	case <-t.C:
		p.Kill()
		return fmt.Errorf("%s did not stop within %s", p.Name, grace)
	}
}

// FreeAddr returns a loopback address with a port that was free a moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// PollUntil calls cond every interval until it is true or d passes. Only for
// external processes, which send no signal a test could wait on.
func PollUntil(ctx context.Context, d, interval time.Duration, cond func() bool) bool {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if cond() {
			return true
		}
		select {
		case <-ctx.Done():
			return cond()
		case <-t.C:
		}
	}
}
