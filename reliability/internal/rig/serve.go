package rig

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cheetahbroker/cheetah/internal/syncbuf"
)

// Serve is a `cheetah serve` process and the settings to start it again on
// the same store and address.
type Serve struct {
	Bin      string
	Addr     string
	AdminKey string
	Env      []string
	Args     []string
	Proc     *Proc
	API      *API
	// Logs keeps the output of every process started, for the checks that
	// no secret reaches a log.
	Logs []*syncbuf.Buffer
}

// NewServe prepares a broker on addr. store is a --data-dir for SQLite or
// a postgres:// URL; extra are more serve flags.
func NewServe(bin, addr, adminKey, store string, extra ...string) *Serve {
	s := &Serve{Bin: bin, Addr: addr, AdminKey: adminKey, API: NewAPI("http://" + addr)}
	s.Env = []string{"CHEETAH_ADMIN_KEY=" + adminKey}
	s.Args = []string{"serve", "--listen", addr, "--log-level", "debug"}
	if strings.HasPrefix(store, "postgres") {
		s.Args = append(s.Args, "--database-url", store)
	} else {
		s.Args = append(s.Args, "--data-dir", store)
	}
	s.Args = append(s.Args, extra...)
	return s
}

// Start starts the process and waits until /readyz answers.
func (s *Serve) Start(t testing.TB) {
	t.Helper()
	s.Proc = Start(t, "serve", s.Env, s.Bin, s.Args...)
	s.Logs = append(s.Logs, s.Proc.Out)
	ok := PollUntil(context.Background(), 60*time.Second, 20*time.Millisecond, func() bool {
		select {
		case <-s.Proc.Done():
			return true
		default:
		}
		return s.API.Ready(context.Background())
	})
	select {
	case <-s.Proc.Done():
		t.Fatalf("serve exited at start:\n%s", s.Proc.Out.String())
	default:
	}
	if !ok {
		t.Fatalf("serve did not become ready:\n%s", s.Proc.Out.String())
	}
}

// AllLogs is the output of every serve process started so far.
func (s *Serve) AllLogs() string {
	var b strings.Builder
	for _, l := range s.Logs {
		b.WriteString(l.String())
	}
	return b.String()
}
