package procs

import (
	"cmp"
	"context"
	"math"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeProcess is the counters and GOMAXPROCS of a governor under test. The
// governor's Read blocks until the test feeds it the next counters, so the
// test knows which window each change came after.
type fakeProcess struct {
	feed chan Counters
	max  int

	mu      sync.Mutex
	reads   int
	changes []change
}

type change struct {
	window int // windows observed before it
	set    int // the argument of SetProcs
}

func (p *fakeProcess) config(clock clockwork.Clock) Config {
	return Config{Clock: clock, Read: func() Counters {
		c := <-p.feed
		p.mu.Lock()
		p.reads++
		p.mu.Unlock()
		return c
	}, SetProcs: func(n int) int {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.changes = append(p.changes, change{window: max(p.reads-1, 0), set: n})
		if n == 0 {
			return p.max
		}
		return n
	}}
}

// load is one window of a test: the cores used, and the share of the
// goroutines made ready that waited LongWait or more.
type load struct {
	cores, long float64
	waits       uint64 // 400 when 0
}

var (
	idle    = load{cores: 0.02}
	light   = load{cores: 0.6, long: 0.005} // round trips one after the other
	crowded = load{cores: 0.5, long: 0.5}   // a throughput load on one processor
	heavy   = load{cores: 1.6}              // the same on two
	quiet   = load{cores: QuietCores - 0.05}
	busy    = load{cores: QuietCores}
)

// run starts a governor, feeds it one window per load, stops it, and
// returns the SetProcs calls it made.
func run(t *testing.T, loads []load) []change {
	t.Helper()
	clock := clockwork.NewFakeClock()
	p := &fakeProcess{feed: make(chan Counters), max: 2}
	g := New(p.config(clock))
	require.True(t, g.Enabled())
	g.Start()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, clock.BlockUntilContext(ctx, 1)) // its ticker
	var c Counters
	p.feed <- c
	for _, l := range loads {
		clock.Advance(Window)
		waits := cmp.Or(l.waits, 400)
		c.CPU += time.Duration(l.cores * float64(Window))
		c.Waits += waits
		c.LongWaits += uint64(math.Round(l.long * float64(waits)))
		p.feed <- c
	}
	g.Stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.changes
}

func times(l load, n int) []load { return slices.Repeat([]load{l}, n) }

func TestGovernor(t *testing.T) {
	t.Parallel()
	up, down, held := int(RaiseAfter/Window), int(LowerAfter/Window), int(HeldAfter/Window)
	seq := func(parts ...[]load) []load { return slices.Concat(parts...) }
	cases := []struct {
		name  string
		loads []load
		want  []change // after Start's set(1), before Stop's set(0)
	}{
		{"an idle process stays on one processor", times(idle, 30), []change{}},
		{"round trips stay on one", times(light, 30), []change{}},
		{"crowded windows short of RaiseAfter stay on one",
			seq(times(crowded, up-1), times(light, 1), times(crowded, up-1)), []change{}},
		{"too few waits to judge stay on one", times(load{cores: 0.01, long: 1, waits: MinWaits - 1}, 30), []change{}},
		{"crowded for RaiseAfter raises", seq(times(light, 15), times(crowded, up), times(heavy, 30)),
			[]change{{window: 15 + up, set: 0}}},
		{"a busy window restarts the quiet time", seq(times(crowded, up), times(quiet, down-1), times(busy, 1), times(quiet, down-1)),
			[]change{{window: up, set: 0}}},
		{"quiet for LowerAfter lowers, and one processor holds", seq(times(light, 15), times(crowded, up), times(quiet, down), times(light, 30)),
			[]change{{window: 15 + up, set: 0}, {window: 15 + up + down, set: 1}}},
		{
			"a try that fails waits twice as long next time",
			seq(times(light, 15), times(crowded, up), times(quiet, down), // raised, tried
				times(crowded, up), times(quiet, 2*down), // failed: raised, tried after twice as long
				times(crowded, up), times(quiet, 4*down-1), // failed again: not tried within four times
			),
			[]change{
				{window: 15 + up, set: 0}, {window: 15 + up + down, set: 1},
				{window: 15 + 2*up + down, set: 0}, {window: 15 + 2*up + 3*down, set: 1},
				{window: 15 + 3*up + 3*down, set: 0},
			},
		},
		{
			"a try that held HeldAfter resets the wait",
			seq(times(crowded, up), times(quiet, down), times(crowded, up), times(quiet, 2*down), // one failed try
				times(light, held), times(crowded, up), times(quiet, down)), // one held: tried after LowerAfter again
			[]change{
				{window: up, set: 0}, {window: up + down, set: 1},
				{window: 2*up + down, set: 0}, {window: 2*up + 3*down, set: 1},
				{window: 3*up + 3*down + held, set: 0}, {window: 3*up + 4*down + held, set: 1},
			},
		},
		{
			"bursts that come back within HeldAfter make the tries rarer",
			seq(times(crowded, up), times(quiet, down), times(light, 30), // tried, held 3 s
				times(crowded, up), times(quiet, 2*down), times(light, 30), // raised: next try after 2 s
				times(crowded, up), times(quiet, 4*down-1)), // raised: next try after 4 s
			[]change{
				{window: up, set: 0}, {window: up + down, set: 1},
				{window: 2*up + down + 30, set: 0}, {window: 2*up + 3*down + 30, set: 1},
				{window: 3*up + 3*down + 60, set: 0},
			},
		},
		{"a full core raises without waits", seq(times(light, 5), times(load{cores: FullCores, waits: 5}, up)),
			[]change{{window: 5 + up, set: 0}}},
		{"just under a full core stays on one", times(load{cores: FullCores - 0.01, waits: 5}, 30), []change{}},
		{"a tenth of waits past LongWait raises", times(load{cores: 0.5, long: CrowdedShare}, up),
			[]change{{window: up, set: 0}}},
		{"just under a tenth stays on one", times(load{cores: 0.5, long: CrowdedShare - 0.01}, 30), []change{}},
		{"MinWaits waits are enough to judge", times(load{cores: 0.1, long: 1, waits: MinWaits}, up),
			[]change{{window: up, set: 0}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := run(t, tc.loads)
			require.GreaterOrEqual(t, len(got), 2)
			require.Equal(t, change{window: 0, set: 1}, got[0], "Start sets one processor")
			require.Equal(t, 0, got[len(got)-1].set, "Stop gives the runtime its default back")
			require.Equal(t, tc.want, slices.Clip(got[1:len(got)-1]))
		})
	}
}

// TestRuntime governs this test process's real GOMAXPROCS, and reads its
// real counters.
func TestRuntime(t *testing.T) {
	if os.Getenv("GOMAXPROCS") != "" || runtime.GOMAXPROCS(0) < 2 {
		t.Skip("needs two processors and no GOMAXPROCS in the environment")
	}
	before := runtime.GOMAXPROCS(0)
	g := New(Config{})
	require.True(t, g.Enabled())
	g.Start()
	require.Equal(t, 1, runtime.GOMAXPROCS(0))
	g.Stop()
	g.Stop() // twice is once
	require.Equal(t, before, runtime.GOMAXPROCS(0))

	// Goroutines made ready by the hundred, each spinning past LongWait
	// on the one processor, count as long waits.
	c, ok := newRuntimeCounters()
	require.True(t, ok)
	first := c.read()
	runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(before)
	var wg sync.WaitGroup
	for range 200 {
		wg.Go(func() {
			for start := time.Now(); time.Since(start) < 2*LongWait; {
			}
		})
	}
	wg.Wait()
	second := c.read()
	require.Greater(t, second.CPU, first.CPU)
	require.Greater(t, second.Waits, first.Waits)
	require.Greater(t, second.LongWaits, first.LongWaits)
}

// TestLongBucket: the runtime's bucket that holds LongWait, and those after
// it, are the long waits.
func TestLongBucket(t *testing.T) {
	t.Parallel()
	s := []metrics.Sample{{Name: schedLatencies}}
	metrics.Read(s)
	buckets := s[0].Value.Float64Histogram().Buckets
	long := longBucket(buckets)
	require.LessOrEqual(t, buckets[long], LongWait.Seconds())
	require.Greater(t, buckets[long+1], LongWait.Seconds())
	require.Greater(t, buckets[long], LongWait.Seconds()/2, "a bucket a quarter of a power of two wide")
	require.Equal(t, 1, longBucket([]float64{0, 150e-6, 250e-6, 400e-6, math.Inf(1)}))
	require.Equal(t, 2, longBucket([]float64{0, 100e-6, 200e-6, 400e-6, math.Inf(1)}))
}

// TestStartStop: Stop without Start, and Start or Stop twice, are safe;
// only a Start that set GOMAXPROCS makes Stop set it back.
func TestStartStop(t *testing.T) {
	t.Parallel()
	p := &fakeProcess{feed: make(chan Counters), max: 2}
	g := New(p.config(clockwork.NewFakeClock()))
	g.Stop()
	g.Start()
	g.Stop()
	require.Empty(t, p.changes)

	clock := clockwork.NewFakeClock()
	g = New(p.config(clock))
	g.Start()
	g.Start()
	p.feed <- Counters{}
	g.Stop()
	g.Stop()
	require.Equal(t, []change{{set: 1}, {set: 0}}, p.changes)
}

// TestEnvironment: an operator's GOMAXPROCS wins.
func TestEnvironment(t *testing.T) {
	t.Setenv("GOMAXPROCS", "3")
	before := runtime.GOMAXPROCS(0)
	g := New(Config{})
	require.False(t, g.Enabled())
	g.Start()
	require.Equal(t, before, runtime.GOMAXPROCS(0))
	g.Stop()
	require.Equal(t, before, runtime.GOMAXPROCS(0))
}
