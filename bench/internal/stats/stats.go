// Package stats turns raw measurements into the figures the harness
// reports: latency percentiles within one run, and the median, minimum and
// maximum of a figure over repeated runs.
package stats

import (
	"math"
	"slices"
	"time"
)

// Summary is one figure over repeated runs: the median is what the report
// shows, the minimum and maximum how far the runs spread.
type Summary struct {
	Median float64   `json:"median"`
	Min    float64   `json:"min"`
	Max    float64   `json:"max"`
	Runs   []float64 `json:"runs"`
}

// Summarize returns the median, minimum and maximum of runs (one value per
// repeat). With an even count the median is the mean of the middle two.
func Summarize(runs []float64) Summary {
	if len(runs) == 0 {
		return Summary{Median: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	}
	s := slices.Clone(runs)
	slices.Sort(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return Summary{Median: med, Min: s[0], Max: s[n-1], Runs: slices.Clone(runs)}
}

// Percentile returns the nearest-rank p-th percentile (0 < p ≤ 100) of
// sorted, which must be sorted ascending. It returns 0 for no samples.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	// The epsilon keeps 99.9% of 1,000 at rank 999 despite rounding.
	rank := int(math.Ceil(p/100*float64(len(sorted)) - 1e-9))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// Latencies gathers the latencies of one run. It is not safe for
// concurrent use: give each worker its own and Merge them.
type Latencies struct {
	d []time.Duration
}

// NewLatencies returns a recorder with room for n samples.
func NewLatencies(n int) *Latencies { return &Latencies{d: make([]time.Duration, 0, n)} }

// Add records one sample.
func (l *Latencies) Add(d time.Duration) { l.d = append(l.d, d) }

// Len is the number of samples.
func (l *Latencies) Len() int { return len(l.d) }

// Merge adds every sample of o.
func (l *Latencies) Merge(o *Latencies) { l.d = append(l.d, o.d...) }

// Percentiles sorts the samples and returns the requested percentiles in
// microseconds, in the order asked.
func (l *Latencies) Percentiles(ps ...float64) []float64 {
	slices.Sort(l.d)
	out := make([]float64, len(ps))
	for i, p := range ps {
		out[i] = Micros(Percentile(l.d, p))
	}
	return out
}

// Micros converts a duration to microseconds.
func Micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
