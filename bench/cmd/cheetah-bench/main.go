// Command cheetah-bench measures Cheetah against its peers — a raw
// WebSocket echo, NATS, Redis and PostgreSQL — in one run on this machine,
// and prints a Markdown table and writes JSON (issue 6). `make bench` runs
// it at the sizes; -quick runs the same scenarios small.
//
//	go run ./bench/cmd/cheetah-bench -quick
//	go run ./bench/cmd/cheetah-bench -only 1,3 -repeats 5 -json out.json
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/cheetahbroker/cheetah/bench/internal/harness"
	"github.com/cheetahbroker/cheetah/bench/internal/machine"
)

// version is set by the Makefile (-ldflags "-X main.version=…").
var version = ""

func main() {
	if harness.IsChild() {
		os.Exit(harness.ChildMain())
	}
	os.Exit(run())
}

func run() int {
	quick := false
	for _, a := range os.Args[1:] {
		if a == "-quick" || a == "--quick" || a == "-quick=true" || a == "--quick=true" {
			quick = true
		}
	}
	cfg := harness.Full()
	if quick {
		cfg = harness.Quick()
	}
	fs := flag.NewFlagSet("cheetah-bench", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: cheetah-bench [flags]\n\nRuns Cheetah's benchmark scenarios (issue 6) against their peers on this machine.\nDefaults are the issue's sizes; -quick sets small ones first, and other flags override either.\n\n")
		fs.PrintDefaults()
	}
	fs.Bool("quick", quick, "small sizes: a run of a minute or two with the same scenarios")
	only := fs.String("only", "", "comma-separated scenarios to run: 1-5 or latency, throughput, churn, ingest, connections (default all)")
	fs.IntVar(&cfg.Repeats, "repeats", cfg.Repeats, "measured runs per figure (the median is reported)")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of every pseudo-random choice")
	fs.IntVar(&cfg.RoundTrips, "round-trips", cfg.RoundTrips, "1: measured round trips per run")
	fs.IntVar(&cfg.WarmupRoundTrips, "warmup-round-trips", cfg.WarmupRoundTrips, "1: warm-up round trips per run")
	fs.IntVar(&cfg.PayloadBytes, "payload", cfg.PayloadBytes, "params object size in bytes")
	fs.IntVar(&cfg.ThroughputContexts, "tp-contexts", cfg.ThroughputContexts, "2: contexts (one caller each)")
	fs.IntVar(&cfg.ThroughputClients, "tp-clients", cfg.ThroughputClients, "2: clients the contexts are spread over")
	fs.DurationVar(&cfg.ThroughputDuration, "tp-duration", cfg.ThroughputDuration, "2: measured time per run")
	fs.DurationVar(&cfg.ThroughputWarmup, "tp-warmup", cfg.ThroughputWarmup, "2: warm-up per run")
	fs.IntVar(&cfg.ChurnContexts, "churn-contexts", cfg.ChurnContexts, "3: contexts")
	fs.IntVar(&cfg.ChurnAcquirers, "churn-acquirers", cfg.ChurnAcquirers, "3: concurrent acquirers")
	fs.IntVar(&cfg.ChurnPerClient, "churn-per-client", cfg.ChurnPerClient, "3: contexts per client (1-256)")
	fs.IntVar(&cfg.ChurnPerClientMany, "churn-per-client-many", cfg.ChurnPerClientMany, "3: contexts per client of the extra in-process row for agents dropped under churn (0: no such row)")
	fs.DurationVar(&cfg.ChurnDuration, "churn-duration", cfg.ChurnDuration, "3: measured time per run")
	fs.DurationVar(&cfg.ChurnWarmup, "churn-warmup", cfg.ChurnWarmup, "3: warm-up per run")
	fs.IntVar(&cfg.IngestCommands, "ingest-commands", cfg.IngestCommands, "4: measured commands per run")
	fs.IntVar(&cfg.IngestWarmup, "ingest-warmup", cfg.IngestWarmup, "4: warm-up commands per run")
	fs.IntVar(&cfg.IngestProducers, "ingest-producers", cfg.IngestProducers, "4: concurrent producers")
	fs.IntVar(&cfg.Conns, "conns", cfg.Conns, "5: idle clients")
	fs.IntVar(&cfg.ConnDialers, "conn-dialers", cfg.ConnDialers, "5: concurrent dialers")
	fs.DurationVar(&cfg.RunTimeout, "run-timeout", cfg.RunTimeout, "bound of one measured run of one peer")
	fs.StringVar(&cfg.NATSURL, "nats", cfg.NATSURL, "NATS server URL")
	fs.StringVar(&cfg.RedisAddr, "redis", cfg.RedisAddr, "Redis address")
	fs.StringVar(&cfg.PostgresURL, "postgres", envOr("CHEETAH_BENCH_POSTGRES_URL", cfg.PostgresURL), "PostgreSQL URL of a database to connect to for creating the harness's own databases (or $CHEETAH_BENCH_POSTGRES_URL)")
	fs.StringVar(&cfg.ProfileDir, "profile", "", "directory for CPU and heap profiles of Cheetah's measured phases (off when empty)")
	fs.BoolVar(&cfg.Trace, "trace", false, "with -profile, an execution trace of each profiled phase as well (runtime/trace; it slows what it records)")
	jsonPath := fs.String("json", "cheetah-bench.json", "where to write the JSON report (empty: nowhere)")
	mdPath := fs.String("md", "", "where to write the Markdown report as well as printing it (empty: print only)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if *only != "" {
		cfg.Only = strings.Split(*only, ",")
	}
	cfg.Version = version
	if cfg.Version == "" {
		cfg.Version = gitVersion()
	}
	if _, err := machine.RaiseFileLimit(uint64(2*cfg.Conns + 4096)); err != nil {
		fmt.Fprintf(os.Stderr, "cheetah-bench: raise the file limit: %v\n", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := harness.Run(ctx, cfg, os.Stderr)
	if rep == nil {
		fmt.Fprintf(os.Stderr, "cheetah-bench: %v\n", err)
		return 2
	}
	rep.Markdown(os.Stdout)
	if *mdPath != "" {
		f, ferr := os.Create(*mdPath)
		if ferr == nil {
			rep.Markdown(f)
			ferr = f.Close()
		}
		if ferr != nil {
			fmt.Fprintf(os.Stderr, "cheetah-bench: %v\n", ferr)
		}
	}
	if *jsonPath != "" {
		if err := rep.WriteJSON(*jsonPath); err != nil {
			fmt.Fprintf(os.Stderr, "cheetah-bench: %v\n", err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "cheetah-bench: wrote %s\n", *jsonPath)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "cheetah-bench: %v\n", err)
		return 1
	}
	return 0
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// gitVersion describes the work tree when the build did not say.
func gitVersion() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "git", "describe", "--tags", "--always", "--dirty").Output()
	if err != nil {
		return "dev"
	}
	return strings.TrimSpace(string(out))
}
