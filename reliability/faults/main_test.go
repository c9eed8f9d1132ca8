// Package faults injects faults into a running broker: a client killed or
// frozen mid-command, the broker killed with SIGKILL under load on SQLite
// and on PostgreSQL, PostgreSQL stopped and started under load, and a
// client that stops reading. The broker runs as a real `cheetah serve`
// process, except where memory is measured (in process).
package faults

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cheetahbroker/cheetah/reliability/internal/rig"
)

// Long mode: `make chaos` sets these (CHAOS_ROUNDS, CHAOS_PG_CYCLES, CHAOS_LOAD).
var (
	rounds   = flag.Int("chaos.rounds", 3, "SIGKILL rounds of the broker per store")
	pgCycles = flag.Int("chaos.pgcycles", 1, "PostgreSQL stop/start cycles under load")
	loadFor  = flag.Duration("chaos.load", 700*time.Millisecond, "upper bound of the load before each SIGKILL (a random part of it is used)")
)

var bin string

const adminKey = "reliability-admin-key-0123456789abcdef"

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "cheetah-faults")
	if err != nil {
		panic(err)
	}
	if !testing.Short() {
		bin, err = rig.Build(dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func needProcesses(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts processes")
	}
}

// noSecrets fails the test if any secret appears in the logs.
func noSecrets(t *testing.T, logs string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if s != "" && strings.Contains(logs, s) {
			t.Errorf("a secret (%.8s…) reached a log", s)
		}
	}
}
