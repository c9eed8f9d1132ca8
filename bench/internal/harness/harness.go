package harness

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strings"
	"time"

	_ "modernc.org/sqlite" // the driver the history store uses, for its version

	"github.com/cheetahbroker/cheetah/bench/internal/machine"
	"github.com/cheetahbroker/cheetah/bench/internal/peers"
	"github.com/cheetahbroker/cheetah/bench/internal/report"
	"github.com/cheetahbroker/cheetah/bench/internal/stats"
)

// scenarioDef is one scenario of the issue.
type scenarioDef struct {
	number int
	key    string
	run    func(e *env) *report.Scenario
}

var scenarios = []scenarioDef{
	{1, "latency", (*env).latency},
	{2, "throughput", (*env).throughput},
	{3, "churn", (*env).churn},
	{4, "ingest", (*env).ingest},
	{5, "connections", (*env).connections},
	{6, "cluster", (*env).cluster},
}

// env is what every scenario shares: the configuration, the log, and which
// peers answered.
type env struct {
	ctx context.Context
	cfg Config
	log io.Writer

	pg       *peers.Postgres
	pgErr    error
	natsErr  error
	redisErr error

	payload []byte // the params object of every command and message
}

// Run runs the configured scenarios and returns the report. Progress goes
// to log. It fails only when the configuration is wrong; a peer that does
// not answer is absent from its rows, and a run that fails is marked failed.
func Run(ctx context.Context, cfg Config, log io.Writer) (*report.Report, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	if cfg.ProfileDir != "" {
		if err := os.MkdirAll(cfg.ProfileDir, 0o755); err != nil {
			return nil, err
		}
	}
	e := &env{ctx: ctx, cfg: cfg, log: log, payload: Payload(cfg.PayloadBytes, cfg.Seed)}
	rep := &report.Report{
		Tool: "cheetah-bench", Cheetah: cfg.Version, StartedAt: time.Now(),
		Machine: machine.Describe(), Settings: cfg,
	}
	rep.Versions = e.discover()
	for i := range scenarios {
		s := &scenarios[i]
		if !cfg.wants(s) {
			continue
		}
		if ctx.Err() != nil {
			break
		}
		e.logf("scenario %d: %s", s.number, s.key)
		start, load := time.Now(), machine.LoadAvg()
		sc := s.run(e)
		sc.LoadStart, sc.LoadEnd = load, machine.LoadAvg()
		rep.Scenarios = append(rep.Scenarios, sc)
		e.logf("scenario %d: done in %s", s.number, time.Since(start).Round(time.Millisecond))
	}
	rep.Goals = rep.CheckGoals(goals(cfg))
	rep.Readings = readings(rep)
	rep.Footnotes = footnotes()
	rep.Seconds = time.Since(rep.StartedAt).Seconds()
	return rep, ctx.Err()
}

func (e *env) logf(format string, args ...any) {
	fmt.Fprintf(e.log, "%s %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// discover reaches each peer once, for its version and to know who is
// absent.
func (e *env) discover() []report.Version {
	var vs []report.Version
	add := func(name, version, note string, err error) {
		v := report.Version{Name: name, Version: version, Note: note}
		if err != nil {
			v = report.Version{Name: name, Absent: true, Note: err.Error()}
		}
		vs = append(vs, v)
	}
	add("Cheetah", orDev(e.cfg.Version), "", nil)
	add("Go", runtime.Version(), "", nil)
	add("raw echo", "in process", "github.com/coder/websocket "+module("github.com/coder/websocket"), nil)

	nv, err := peers.NATSVersion(e.cfg.NATSURL)
	e.natsErr = err
	add("NATS server", nv, "nats.go "+module("github.com/nats-io/nats.go"), err)

	rv, err := peers.RedisVersion(e.ctx, e.cfg.RedisAddr)
	e.redisErr = err
	add("Redis", rv, "go-redis "+module("github.com/redis/go-redis/v9"), err)

	e.pg, e.pgErr = peers.DialPostgres(e.ctx, e.cfg.PostgresURL)
	pv := ""
	if e.pg != nil {
		pv = e.pg.Version
	}
	add("PostgreSQL", pv, "pgx "+module("github.com/jackc/pgx/v5"), e.pgErr)

	sv, err := sqliteVersion()
	add("SQLite", sv, "modernc.org/sqlite "+module("modernc.org/sqlite")+", WAL, synchronous=FULL", err)
	for _, v := range vs {
		state := v.Version
		if v.Absent {
			state = "absent: " + v.Note
		}
		e.logf("peer %s: %s", v.Name, state)
	}
	return vs
}

func orDev(v string) string {
	if v == "" {
		return "dev"
	}
	return v
}

// module returns the version of a dependency this binary was built with.
func module(path string) string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, d := range bi.Deps {
		if d.Path == path {
			if d.Replace != nil {
				return d.Replace.Version
			}
			return d.Version
		}
	}
	return "unknown"
}

func sqliteVersion() (string, error) {
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		return "", err
	}
	defer db.Close()
	var v string
	err = db.QueryRow("select sqlite_version()").Scan(&v)
	return v, err
}

// Payload returns a JSON object of exactly n bytes, {"pad":"…"}, its
// letters drawn from a generator seeded with seed.
func Payload(n int, seed uint64) []byte {
	const head, tail = `{"pad":"`, `"}`
	const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	rng := rand.New(rand.NewPCG(seed, 1))
	b := []byte(head)
	for len(b) < n-len(tail) {
		b = append(b, letters[rng.IntN(len(letters))])
	}
	return append(b, tail...)
}

// absentError marks a peer that could not be reached.
type absentError struct{ err error }

func (a absentError) Error() string { return a.err.Error() }
func (a absentError) Unwrap() error { return a.err }

func absent(err error) error { return absentError{err} }

// partialError is a run that failed but still took some figures, which the
// row shows with the failure as its note.
type partialError struct {
	figures map[string]float64
	err     error
}

func (p partialError) Error() string { return p.err.Error() }
func (p partialError) Unwrap() error { return p.err }

// trial is one repeat of one peer.
type trial struct {
	ctx     context.Context
	i       int
	profile string // where this trial's profiles go; empty for none
	trace   bool   // an execution trace beside the profiles

	// cpu is the CPU time of this whole process over the measured phase,
	// once it has ended, and busy the whole machine's (every process's) in
	// the wall time elapsed; ops is how many operations a closed loop
	// completed in it.
	cpu, busy, elapsed time.Duration
	ops                int64
}

// measuring starts the measured phase; the returned function ends it. It
// takes the process's and the machine's CPU time over the phase, and with
// profiling on, a CPU profile runs until the end, which then also writes a
// heap profile.
func (t *trial) measuring() (stop func()) {
	stopProfile := t.profiling()
	cpu0, busy0, start := machine.CPUTime(), machine.BusyTime(), time.Now()
	return func() {
		t.cpu, t.busy, t.elapsed = machine.CPUTime()-cpu0, machine.BusyTime()-busy0, time.Since(start)
		stopProfile()
	}
}

// machineFigures puts the machine's CPU time per operation (µs) and how busy
// its CPUs were (% of all of them) over the measured phase into out: with
// every process counted, a peer whose servers run outside this process
// (PostgreSQL, NATS, Redis) is measured whole, and a rate that stops where
// the machine is saturated is told apart from one that waits.
func (t *trial) machineFigures(out map[string]float64) {
	if t.busy <= 0 || t.ops <= 0 || t.elapsed <= 0 {
		return
	}
	out["machine_cpu_us"] = stats.Micros(t.busy) / float64(t.ops)
	out["machine_busy"] = 100 * t.busy.Seconds() / (t.elapsed.Seconds() * float64(runtime.NumCPU()))
}

// cpuPerOp is the CPU time of the measured phase per operation, in µs.
func (t *trial) cpuPerOp(ops int64) (float64, bool) {
	if t.cpu <= 0 || ops <= 0 {
		return 0, false
	}
	return stats.Micros(t.cpu) / float64(ops), true
}

func (t *trial) profiling() (stop func()) {
	if t.profile == "" {
		return func() {}
	}
	f, err := os.Create(t.profile + ".cpu.pprof")
	if err != nil {
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return func() {}
	}
	stopTrace := t.tracing()
	return func() {
		stopTrace()
		pprof.StopCPUProfile()
		f.Close()
		if h, err := os.Create(t.profile + ".heap.pprof"); err == nil {
			runtime.GC()
			_ = pprof.Lookup("heap").WriteTo(h, 0)
			h.Close()
		}
	}
}

// tracing starts the execution trace of the measured phase, when asked
// for: where a round trip waits (a goroutine runnable but not running, a
// read not yet answered) is in it, not in a CPU profile.
func (t *trial) tracing() (stop func()) {
	if !t.trace {
		return func() {}
	}
	f, err := os.Create(t.profile + ".trace")
	if err != nil {
		return func() {}
	}
	if err := trace.Start(f); err != nil {
		f.Close()
		return func() {}
	}
	return func() {
		trace.Stop()
		f.Close()
	}
}

// runner is one peer's setup: it returns the function of one repeat and
// what to clean up.
type runner func() (run func(t *trial) (map[string]float64, error), cleanup func(), err error)

// row measures one peer: setup once, then cfg.Repeats runs, each bounded
// by RunTimeout. A setup that fails with an absentError makes the row
// absent; any other failure marks it failed. profile says whether the last
// repeat is profiled (Cheetah's rows).
func (e *env) row(sc, peer string, profile bool, setup runner) *report.Row {
	return e.rows(sc, profile, []string{peer}, []runner{setup})[0]
}

// rows measures several peers as row does one, set up together and run in
// turn (run 1 of each, then run 2 of each, …), so that a ratio between them
// sees the same moments of the machine. A row that fails or is absent
// leaves the others running.
func (e *env) rows(sc string, profile bool, peers []string, setups []runner) []*report.Row {
	out := make([]*report.Row, len(peers))
	runs := make([]func(*trial) (map[string]float64, error), len(peers))
	figures := make([]map[string][]float64, len(peers))
	for j, peer := range peers {
		row := &report.Row{Peer: peer}
		out[j], figures[j] = row, map[string][]float64{}
		e.logf("  %s: setting up", peer)
		run, cleanup, err := setups[j]()
		if cleanup != nil {
			defer cleanup()
		}
		if err != nil {
			var ab absentError
			if errors.As(err, &ab) {
				row.Absent, row.Reason = true, "absent: "+err.Error()
			} else {
				row.Failed, row.Reason = true, "failed in setup: "+err.Error()
			}
			e.logf("  %s: %s", peer, row.Reason)
			continue
		}
		runs[j] = run
	}
	for i := range e.cfg.Repeats {
		for j, run := range runs {
			if run != nil && !e.repeat(sc, profile, i, out[j], figures[j], run) {
				runs[j] = nil
			}
		}
	}
	for j, row := range out {
		if runs[j] != nil {
			row.Values = map[string]stats.Summary{}
			for k, v := range figures[j] {
				row.Values[k] = stats.Summarize(v)
			}
		}
	}
	return out
}

// repeat is run i of row, whose figures so far are figures; it reports
// whether the row goes on, or ends here (failed, interrupted, or with a
// failed run's partial figures).
func (e *env) repeat(sc string, profile bool, i int, row *report.Row, figures map[string][]float64, run func(*trial) (map[string]float64, error)) bool {
	peer := row.Peer
	if e.ctx.Err() != nil {
		row.Failed, row.Reason = true, "interrupted"
		return false
	}
	runtime.GC()
	ctx, cancel := context.WithTimeout(e.ctx, e.cfg.RunTimeout)
	t := &trial{ctx: ctx, i: i}
	if profile && e.cfg.ProfileDir != "" && i == e.cfg.Repeats-1 {
		t.profile = filepath.Join(e.cfg.ProfileDir, sc+"-"+slug(peer))
		t.trace = e.cfg.Trace
	}
	got, err := run(t)
	cancel()
	var part partialError
	if errors.As(err, &part) {
		// A failed run that still measured something worth reading
		// (agents dropped): that run's figures alone, and why it failed.
		row.Note = fmt.Sprintf("failed in run %d: %v; the figures are that run's that could be taken", i+1, part.err)
		e.logf("  %s: %s", peer, row.Note)
		row.Values = map[string]stats.Summary{}
		for k, v := range part.figures {
			row.Values[k] = stats.Summarize([]float64{v})
		}
		return false
	}
	if err != nil {
		row.Failed, row.Reason = true, fmt.Sprintf("failed in run %d: %v", i+1, err)
		e.logf("  %s: %s", peer, row.Reason)
		return false
	}
	var parts []string
	for k, v := range got {
		figures[k] = append(figures[k], v)
		parts = append(parts, fmt.Sprintf("%s=%s", k, report.Num(v)))
	}
	slices.Sort(parts)
	e.logf("  %s: run %d/%d: %s", peer, i+1, e.cfg.Repeats, strings.Join(parts, " "))
	return true
}

func slug(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.TrimSuffix(b.String(), "-")
}
