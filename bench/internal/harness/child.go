package harness

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/bench/internal/broker"
	"github.com/cheetahbroker/cheetah/bench/internal/machine"
	"github.com/cheetahbroker/cheetah/bench/internal/peers"
)

// The connections scenario measures a server's memory, so the server runs
// in a process of its own: this binary again, told by childEnv what to
// serve. The child prints one JSON line (childHello) and serves until its
// standard input closes, which also ends it if the harness dies.
const childEnv = "CHEETAH_BENCH_CHILD"

// Child kinds.
const (
	childBroker = "broker"
	childEcho   = "echo"
)

type childHello struct {
	URL   string `json:"url"`   // the server: http://… for the broker, ws://… for the echo
	Debug string `json:"debug"` // http://… serving /mem and /debug/pprof/
	Key   string `json:"key,omitempty"`
	Error string `json:"error,omitempty"`
}

// memInfo is the child's memory as /mem reports it.
type memInfo struct {
	RSS        uint64 `json:"rss"`
	HeapInuse  uint64 `json:"heap_inuse"`
	StackInuse uint64 `json:"stack_inuse"`
	Goroutines int    `json:"goroutines"`
	Ready      int    `json:"ready"` // idle contexts (broker) or open connections (echo)
}

// IsChild reports whether this process was started as a harness child.
// Programs embedding the harness (its main, its tests) call ChildMain first
// thing when it is.
func IsChild() bool { return os.Getenv(childEnv) != "" }

// ChildMain serves as a child and returns the exit code.
func ChildMain() int {
	kind := os.Getenv(childEnv)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	out := json.NewEncoder(os.Stdout)
	fail := func(err error) int {
		_ = out.Encode(childHello{Error: err.Error()})
		return 1
	}
	var hello childHello
	var ready func() int
	var closeServer func()
	switch kind {
	case childBroker:
		b, err := broker.Start(ctx, broker.Options{Store: broker.SQLite})
		if err != nil {
			return fail(err)
		}
		hello.URL, hello.Key = b.URL, b.ClientKey
		mgr := b.Manager()
		ready = func() int {
			got, _ := mgr.ListAvailable(context.Background(), broker.User, cheetah.Console)
			return len(got)
		}
		closeServer = b.Close
	case childEcho:
		e, err := peers.StartEcho()
		if err != nil {
			return fail(err)
		}
		hello.URL, ready, closeServer = e.URL, e.Active, e.Close
	default:
		return fail(fmt.Errorf("unknown child kind %q", kind))
	}
	defer closeServer()

	mux := http.NewServeMux()
	mux.HandleFunc("/mem", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("gc") != "" {
			runtime.GC()
			debug.FreeOSMemory()
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		_ = json.NewEncoder(w).Encode(memInfo{
			RSS: machine.RSS(), HeapInuse: ms.HeapInuse, StackInuse: ms.StackInuse,
			Goroutines: runtime.NumGoroutine(), Ready: ready(),
		})
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	dbg := &http.Server{Handler: mux}
	go func() { _ = dbg.Serve(ln) }()
	defer dbg.Close()
	hello.Debug = "http://" + ln.Addr().String()
	if err := out.Encode(hello); err != nil {
		return 1
	}
	stdinClosed := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stdinClosed) }()
	select {
	case <-stdinClosed:
	case <-ctx.Done():
	}
	return 0
}

// child is a running child process.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	hello childHello
	hc    *http.Client
}

// startChild starts this binary as a child of kind and reads its hello.
func startChild(ctx context.Context, kind string, stderr io.Writer) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childEnv+"="+kind)
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, stdin: stdin, hc: &http.Client{Timeout: 2 * time.Minute}}
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- s
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case s := <-line:
		if err := json.Unmarshal([]byte(s), &c.hello); err != nil {
			c.stop()
			return nil, fmt.Errorf("child %s: %q: %w", kind, strings.TrimSpace(s), err)
		}
	case <-ctx.Done():
		c.stop()
		return nil, ctx.Err()
	case <-time.After(time.Minute):
		c.stop()
		return nil, errors.New("child " + kind + ": no hello within a minute")
	}
	if c.hello.Error != "" {
		c.stop()
		return nil, fmt.Errorf("child %s: %s", kind, c.hello.Error)
	}
	return c, nil
}

// mem asks the child for its memory, after a collection when gc is set.
func (c *child) mem(ctx context.Context, gc bool) (memInfo, error) {
	u := c.hello.Debug + "/mem"
	if gc {
		u += "?gc=1"
	}
	var m memInfo
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	resp, err := c.hc.Do(req)
	if err != nil {
		return m, err
	}
	defer resp.Body.Close()
	return m, json.NewDecoder(resp.Body).Decode(&m)
}

// saveHeapProfile writes the child's heap profile (after a collection).
func (c *child) saveHeapProfile(ctx context.Context, path string) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.hello.Debug+"/debug/pprof/heap?gc=1", nil)
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

// stop closes the child's standard input, which ends it, and waits; a
// child that does not end in 30 s is killed.
func (c *child) stop() {
	c.stdin.Close()
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
}
