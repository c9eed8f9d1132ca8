// Package procs runs the process on one processor while one is enough, and
// on all of GOMAXPROCS when goroutines wait for it or it is full.
//
// A round trip through the broker hands work from goroutine to goroutine
// (session writer, agent, reader, store writer, notifier), one at a time.
// With a second processor idle, each hand-over wakes it: a futex call, a
// thread that spins, steals or finds nothing, and sleeps again. On a
// two-processor virtual machine that costs a light load a third of its
// round trip's time and half of its CPU (bench/RESULTS.md). One processor
// runs the same hand-overs back to back. Under load, goroutines that are
// ready to run start waiting for it (the runtime's scheduling latencies),
// or it is busy all the time, and the governor gives the runtime all of
// its processors again.
package procs

import (
	"log/slog"
	"os"
	"runtime"
	"runtime/metrics"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// When the governor changes the processors.
//
// On one processor, a window is crowded when at least CrowdedShare of the
// goroutines made ready in it waited LongWait or more before they ran (of
// the runtime's sample, one scheduling in eight, when it holds MinWaits or
// more), or when the process used FullCores or more. RaiseAfter of crowded
// windows in a row raise. A light load's hand-overs wait microseconds (p90
// under 30 µs, and under 2 % of them past 200 µs, in the benchmark's round
// trips); a throughput load on one processor has a fifth to two thirds of
// them past 200 µs while it uses as little as 0.4 of a core, its processor
// held in system calls.
//
// On more than one processor, the waits say nothing of whether one would
// do, nor does the CPU time (the same throughput load uses over a core on
// two), so the governor tries: after LowerAfter of windows in a row under
// QuietCores, it lowers to one. A try raised again before it held for
// HeldAfter makes the next one wait twice as long, up to MaxBackoff; a try
// that held that long brings the wait back to LowerAfter.
const (
	// Window is how often the governor reads the process's counters.
	Window       = 100 * time.Millisecond
	LongWait     = 200 * time.Microsecond
	CrowdedShare = 0.1
	MinWaits     = 20
	FullCores    = 0.95
	RaiseAfter   = 200 * time.Millisecond
	QuietCores   = 0.9
	LowerAfter   = time.Second
	HeldAfter    = 10 * time.Second
	MaxBackoff   = time.Minute
)

// Counters are the process's cumulative counters the governor reads.
type Counters struct {
	// CPU is the user and system time of the process so far.
	CPU time.Duration
	// Waits counts the goroutines that were made ready to run (a sample
	// of them, the runtime's scheduling latencies), and LongWaits those
	// of them that waited LongWait or more for a processor.
	Waits, LongWaits uint64
}

// Config configures a Governor. The zero value governs this process.
type Config struct {
	Clock clockwork.Clock
	Log   *slog.Logger
	// Read returns the process's counters; nil reads the operating
	// system's and the runtime's. Tests give their own.
	Read func() Counters
	// SetProcs sets GOMAXPROCS to n, or, for n = 0, back to the runtime's
	// default, and returns the setting after; nil is the runtime's. Tests
	// give their own.
	SetProcs func(n int) int
}

// Governor lowers and raises GOMAXPROCS (see the package comment). Stop
// leaves GOMAXPROCS at the runtime's default.
type Governor struct {
	cfg     Config
	enabled bool

	startOnce, stopOnce sync.Once
	started             bool // it set GOMAXPROCS
	stop                chan struct{}
	done                chan struct{}

	// The loop's own state.
	procs   int
	streak  time.Duration // how long the windows have asked for a change
	since   time.Duration // time at the current setting
	backoff time.Duration // quiet time before the next try of one processor
	trying  bool          // the one processor is a try
}

// New makes a governor. It governs nothing (Start and Stop do nothing)
// where the operator set GOMAXPROCS in the environment, where the runtime
// has one processor anyway, and where the process's CPU time or the
// runtime's scheduling latencies cannot be read.
func New(cfg Config) *Governor {
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	g := &Governor{stop: make(chan struct{}), done: make(chan struct{}), backoff: LowerAfter}
	switch {
	case cfg.Read != nil || cfg.SetProcs != nil:
		g.enabled = cfg.Read != nil && cfg.SetProcs != nil
	case os.Getenv("GOMAXPROCS") != "":
		cfg.Log.Info("GOMAXPROCS is set: the processors are not governed", "gomaxprocs", runtime.GOMAXPROCS(0))
	case runtime.GOMAXPROCS(0) < 2:
	case !cpuTimeSupported:
		cfg.Log.Info("no CPU time on this system: the processors are not governed")
	default:
		c, ok := newRuntimeCounters()
		if !ok {
			cfg.Log.Info("no scheduling latencies in this runtime: the processors are not governed")
			break
		}
		g.enabled = true
		cfg.Read, cfg.SetProcs = c.read, setRuntimeProcs
	}
	g.cfg = cfg
	return g
}

// Enabled reports whether the governor changes GOMAXPROCS.
func (g *Governor) Enabled() bool { return g.enabled }

// Start sets one processor (a process that starts is idle) and starts
// watching the counters. A second Start does nothing.
func (g *Governor) Start() {
	g.startOnce.Do(func() {
		if !g.enabled {
			close(g.done)
			return
		}
		g.started = true
		g.procs = g.cfg.SetProcs(1)
		go g.run()
	})
}

// Stop stops the governor, waits for its goroutine and, if Start changed
// GOMAXPROCS, gives the runtime its default back. Stop without Start, or a
// second Stop, does nothing more.
func (g *Governor) Stop() {
	g.startOnce.Do(func() { close(g.done) }) // never started: no goroutine
	g.stopOnce.Do(func() {
		close(g.stop)
		<-g.done
		if g.started {
			g.cfg.SetProcs(0)
		}
	})
}

func (g *Governor) run() {
	defer close(g.done)
	t := g.cfg.Clock.NewTicker(Window)
	defer t.Stop()
	lastAt := g.cfg.Clock.Now()
	last := g.cfg.Read()
	for {
		select {
		case <-g.stop:
			return
		case <-t.Chan():
		}
		at := g.cfg.Clock.Now()
		now := g.cfg.Read()
		if wall := at.Sub(lastAt); wall > 0 {
			g.observe(window{
				wall:      wall,
				cores:     float64(now.CPU-last.CPU) / float64(wall),
				waits:     now.Waits - last.Waits,
				longWaits: now.LongWaits - last.LongWaits,
			})
		}
		last, lastAt = now, at
	}
}

// window is what the counters said over one window.
type window struct {
	wall             time.Duration
	cores            float64
	waits, longWaits uint64
}

func (w window) crowded() bool {
	return w.cores >= FullCores ||
		w.waits >= MinWaits && float64(w.longWaits) >= CrowdedShare*float64(w.waits)
}

// observe takes one window and sets the processors.
func (g *Governor) observe(w window) {
	g.since += w.wall
	if g.procs == 1 {
		if !w.crowded() {
			g.streak = 0
			return
		}
		if g.streak += w.wall; g.streak < RaiseAfter {
			return
		}
		if g.trying {
			if g.since-g.streak < HeldAfter {
				g.backoff = min(2*g.backoff, MaxBackoff) // the crowd came back
			} else {
				g.backoff = LowerAfter // one processor held
			}
		}
		g.trying = false
		g.set(0, w)
		return
	}
	if w.cores >= QuietCores {
		g.streak = 0
		return
	}
	if g.streak += w.wall; g.streak >= g.backoff {
		g.trying = true
		g.set(1, w)
	}
}

func (g *Governor) set(n int, w window) {
	g.procs = g.cfg.SetProcs(n)
	g.streak, g.since = 0, 0
	g.cfg.Log.Info("processors", "gomaxprocs", g.procs, "cores_used", w.cores,
		"waits", w.waits, "long_waits", w.longWaits, "next_try_after", g.backoff)
}

// setRuntimeProcs is SetProcs on the runtime.
func setRuntimeProcs(n int) int {
	if n == 0 {
		runtime.SetDefaultGOMAXPROCS()
	} else {
		runtime.GOMAXPROCS(n)
	}
	return runtime.GOMAXPROCS(0)
}

// runtimeCounters reads the counters from the operating system (CPU time)
// and the runtime (scheduling latencies).
type runtimeCounters struct {
	sample []metrics.Sample
	long   int           // the bucket that holds LongWait: it and those after count
	cpu    time.Duration // the last CPU time read, kept when a read fails
}

const schedLatencies = "/sched/latencies:seconds"

func newRuntimeCounters() (*runtimeCounters, bool) {
	c := &runtimeCounters{sample: []metrics.Sample{{Name: schedLatencies}}}
	metrics.Read(c.sample)
	if c.sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return nil, false
	}
	c.long = longBucket(c.sample[0].Value.Float64Histogram().Buckets) // fixed for the process's life
	return c, true
}

// longBucket is the index of the bucket that holds LongWait. The runtime's
// buckets are a quarter of a power of two wide (196.6 and 229.4 µs around
// 200 µs): waits from the bucket's lower bound count as long.
func longBucket(buckets []float64) int {
	long := 0
	for i, b := range buckets[:len(buckets)-1] {
		if b <= LongWait.Seconds() {
			long = i
		}
	}
	return long
}

func (c *runtimeCounters) read() Counters {
	if cpu, ok := processCPUTime(); ok {
		c.cpu = cpu
	}
	out := Counters{CPU: c.cpu}
	metrics.Read(c.sample)
	for i, n := range c.sample[0].Value.Float64Histogram().Counts {
		out.Waits += n
		if i >= c.long {
			out.LongWaits += n
		}
	}
	return out
}
