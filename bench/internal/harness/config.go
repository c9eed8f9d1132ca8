// Package harness runs Cheetah's benchmark scenarios against their peers,
// one after another on this machine, and gathers the figures into a report:
// round-trip latency, throughput, acquire/release churn, history ingest and
// idle connections (issue 6).
package harness

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Config sizes every scenario. Full gives the sizes of the issue, Quick a
// run of a minute or two, Smoke a run of seconds for tests.
type Config struct {
	// Repeats is how many measured runs each figure is the median of.
	Repeats int `json:"repeats"`
	// Seed fixes every pseudo-random choice: payload bytes, keys tried.
	Seed uint64 `json:"seed"`
	// Only lists the scenarios to run (numbers 1–6 or keys); empty is all.
	Only []string `json:"only,omitempty"`

	// 1. Round trips per run, after WarmupRoundTrips excluded ones.
	RoundTrips       int `json:"round_trips"`
	WarmupRoundTrips int `json:"warmup_round_trips"`
	PayloadBytes     int `json:"payload_bytes"`

	// 2. Contexts over clients, for Duration after Warmup.
	ThroughputContexts int           `json:"throughput_contexts"`
	ThroughputClients  int           `json:"throughput_clients"`
	ThroughputDuration time.Duration `json:"throughput_duration_ns"`
	ThroughputWarmup   time.Duration `json:"throughput_warmup_ns"`

	// 3. Contexts and concurrent acquirers, for Duration after Warmup.
	ChurnContexts  int `json:"churn_contexts"`
	ChurnAcquirers int `json:"churn_acquirers"`
	// ChurnPerClient is how many of the contexts each client holds (at
	// most 256, the broker's bound on one state report).
	ChurnPerClient int `json:"churn_per_client"`
	// ChurnPerClientMany, when set and not ChurnPerClient, adds a row of
	// Cheetah in process with this many contexts per client, for the agents
	// dropped under churn with many contexts on one connection.
	ChurnPerClientMany int           `json:"churn_per_client_many,omitempty"`
	ChurnDuration      time.Duration `json:"churn_duration_ns"`
	ChurnWarmup        time.Duration `json:"churn_warmup_ns"`

	// 4. Commands recorded per run by Producers concurrent writers, after
	// Warmup excluded ones.
	IngestCommands  int `json:"ingest_commands"`
	IngestWarmup    int `json:"ingest_warmup"`
	IngestProducers int `json:"ingest_producers"`

	// 5. Idle clients, opened by Dialers concurrent dialers.
	Conns       int `json:"conns"`
	ConnDialers int `json:"conn_dialers"`

	// RunTimeout bounds one measured run of one peer, warm-up included.
	RunTimeout time.Duration `json:"run_timeout_ns"`

	// Where the peers are.
	NATSURL     string `json:"nats_url"`
	RedisAddr   string `json:"redis_addr"`
	PostgresURL string `json:"-"` // may carry a password; not reported

	// ProfileDir, when set, receives CPU and heap profiles of Cheetah's
	// measured phases (the last repeat of each).
	ProfileDir string `json:"-"`
	// Trace adds an execution trace of the same phases (runtime/trace),
	// for go tool trace; it slows what it records.
	Trace bool `json:"-"`
	// Version is Cheetah's version, as the build says.
	Version string `json:"-"`
}

// Defaults of the peers' addresses (the machines this runs on have them).
const (
	DefaultNATSURL     = "nats://127.0.0.1:4222"
	DefaultRedisAddr   = "127.0.0.1:6379"
	DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
)

// Full is the configuration of the issue.
func Full() Config {
	return Config{
		Repeats: 3, Seed: 20260406,
		RoundTrips: 10_000, WarmupRoundTrips: 1_000, PayloadBytes: 256,
		ThroughputContexts: 256, ThroughputClients: 16, ThroughputDuration: 20 * time.Second, ThroughputWarmup: 3 * time.Second,
		ChurnContexts: 10_000, ChurnAcquirers: 64, ChurnPerClient: 16, ChurnPerClientMany: 64, ChurnDuration: 10 * time.Second, ChurnWarmup: 2 * time.Second,
		IngestCommands: 20_000, IngestWarmup: 2_000, IngestProducers: 64,
		Conns: 10_000, ConnDialers: 64,
		RunTimeout:  5 * time.Minute,
		NATSURL:     DefaultNATSURL,
		RedisAddr:   DefaultRedisAddr,
		PostgresURL: DefaultPostgresURL,
	}
}

// Quick keeps the shape of Full at a fraction of its sizes.
func Quick() Config {
	c := Full()
	c.RoundTrips, c.WarmupRoundTrips = 1_000, 100
	c.ThroughputDuration, c.ThroughputWarmup = 2*time.Second, 500*time.Millisecond
	c.ChurnContexts, c.ChurnDuration, c.ChurnWarmup = 1_000, 2*time.Second, 500*time.Millisecond
	c.IngestCommands, c.IngestWarmup = 2_000, 200
	c.Conns = 1_000
	c.RunTimeout = 2 * time.Minute
	return c
}

// Smoke runs every scenario in seconds: for tests of the harness itself.
func Smoke() Config {
	c := Full()
	c.Repeats = 1
	c.RoundTrips, c.WarmupRoundTrips = 30, 5
	c.ThroughputContexts, c.ThroughputClients = 8, 2
	c.ThroughputDuration, c.ThroughputWarmup = 300*time.Millisecond, 100*time.Millisecond
	c.ChurnContexts, c.ChurnAcquirers, c.ChurnPerClient, c.ChurnPerClientMany = 40, 4, 8, 20
	c.ChurnDuration, c.ChurnWarmup = 300*time.Millisecond, 100*time.Millisecond
	c.IngestCommands, c.IngestWarmup, c.IngestProducers = 60, 10, 4
	c.Conns, c.ConnDialers = 20, 4
	c.RunTimeout = 30 * time.Second
	return c
}

// Check refuses sizes that cannot run.
func (c Config) Check() error {
	switch {
	case c.Repeats < 1:
		return fmt.Errorf("repeats must be at least 1")
	case c.RoundTrips < 1 || c.WarmupRoundTrips < 0:
		return fmt.Errorf("round trips must be at least 1")
	case c.PayloadBytes < 16:
		return fmt.Errorf("payload must be at least 16 bytes")
	case c.ThroughputClients < 1 || c.ThroughputContexts < c.ThroughputClients:
		return fmt.Errorf("throughput needs at least one context per client")
	case c.ThroughputContexts > 256*c.ThroughputClients:
		return fmt.Errorf("throughput: at most 256 contexts per client")
	case c.ChurnAcquirers < 1 || c.ChurnContexts < c.ChurnAcquirers:
		return fmt.Errorf("churn needs at least one context per acquirer")
	case c.ChurnPerClient < 1 || c.ChurnPerClient > 256:
		return fmt.Errorf("churn: 1 to 256 contexts per client")
	case c.ChurnPerClientMany < 0 || c.ChurnPerClientMany > 256:
		return fmt.Errorf("churn: 0 (none) to 256 contexts per client in the many-contexts row")
	case c.IngestCommands < 1 || c.IngestProducers < 1:
		return fmt.Errorf("ingest needs commands and producers")
	case c.Conns < 1 || c.ConnDialers < 1:
		return fmt.Errorf("connections needs clients and dialers")
	case c.ThroughputDuration <= 0 || c.ChurnDuration <= 0 || c.RunTimeout <= 0:
		return fmt.Errorf("durations must be positive")
	}
	for _, o := range c.Only {
		if scenarioByName(o) == nil {
			return fmt.Errorf("unknown scenario %q (want 1–5 or %s)", o, strings.Join(scenarioKeys(), ", "))
		}
	}
	return nil
}

// churnMany says whether the churn scenario has its many-contexts row.
func (c Config) churnMany() bool {
	return c.ChurnPerClientMany > 0 && c.ChurnPerClientMany != c.ChurnPerClient
}

func (c Config) wants(s *scenarioDef) bool {
	if len(c.Only) == 0 {
		return true
	}
	return slices.ContainsFunc(c.Only, func(o string) bool { return scenarioByName(o) == s })
}

func scenarioByName(name string) *scenarioDef {
	name = strings.TrimSpace(strings.ToLower(name))
	for i := range scenarios {
		s := &scenarios[i]
		if name == s.key || name == strconv.Itoa(s.number) {
			return s
		}
	}
	return nil
}

func scenarioKeys() []string {
	var keys []string
	for _, s := range scenarios {
		keys = append(keys, s.key)
	}
	return keys
}
