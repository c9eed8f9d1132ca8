package harness

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cheetahbroker/cheetah/bench/internal/stats"
)

// sequential runs op warm times unmeasured, then n times measured, one at a
// time, and returns the measured latencies. It stops at the first error or
// when ctx ends.
func sequential(ctx context.Context, t *trial, warm, n int, op func(ctx context.Context) error) (*stats.Latencies, error) {
	for i := range warm {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("warm-up %d/%d: %w", i, warm, err)
		}
		if err := op(ctx); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	lat := stats.NewLatencies(n)
	stop := t.measuring()
	defer stop()
	for i := range n {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("after %d of %d round trips: %w", i, n, err)
		}
		start := time.Now()
		if err := op(ctx); err != nil {
			return nil, err
		}
		lat.Add(time.Since(start))
	}
	return lat, nil
}

// loadResult is what a closed loop measured.
type loadResult struct {
	ops     int64 // operations completed inside the measured window
	elapsed time.Duration
	lat     *stats.Latencies
	errs    int64
	err     error // the first error
	cut     bool  // the run's context ended before the window did
}

func (r loadResult) perSecond() float64 { return float64(r.ops) / r.elapsed.Seconds() }

// closedLoop runs workers goroutines, each calling op back to back: for warm
// unmeasured, then for dur measured, then they stop. An operation counts
// when it completes inside the measured window; its latency is kept then.
// A failed operation counts as an error and the worker goes on, unless more
// than half of the attempts fail, which ends the run as failed.
func closedLoop(ctx context.Context, t *trial, workers int, warm, dur time.Duration, op func(ctx context.Context, worker int) error) loadResult {
	const (
		warming = iota
		measuring
		stopping
	)
	var phase atomic.Int32
	var attempts, errs atomic.Int64
	var firstErr error
	var errOnce sync.Once
	lats := make([]*stats.Latencies, workers)
	ops := make([]int64, workers)
	var wg sync.WaitGroup
	for w := range workers {
		lats[w] = stats.NewLatencies(1024)
		wg.Go(func() {
			for phase.Load() != stopping && ctx.Err() == nil {
				// No per-operation timeout: ctx (the run's, bounded by
				// RunTimeout) bounds every operation, and a timer per
				// operation would cost as much as an in-process acquire.
				start := time.Now()
				err := op(ctx, w)
				d := time.Since(start)
				attempts.Add(1)
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					errs.Add(1)
					errOnce.Do(func() { firstErr = err })
					if e, a := errs.Load(), attempts.Load(); a > 100 && e*2 > a {
						return
					}
					continue
				}
				if phase.Load() == measuring {
					ops[w]++
					lats[w].Add(d)
				}
			}
		})
	}
	sleep(ctx, warm)
	stop := t.measuring()
	start := time.Now()
	phase.Store(measuring)
	sleep(ctx, dur)
	phase.Store(stopping)
	elapsed := time.Since(start)
	stop()
	wg.Wait()
	res := loadResult{elapsed: elapsed, lat: stats.NewLatencies(0), errs: errs.Load(), err: firstErr}
	for w := range workers {
		res.ops += ops[w]
		res.lat.Merge(lats[w])
	}
	if ctx.Err() != nil {
		res.cut = true
		res.err = errors.Join(fmt.Errorf("run cut short: %w", ctx.Err()), res.err)
	}
	return res
}

// check turns a load result into an error when the run was not sound.
func (r loadResult) check() error {
	switch {
	case r.cut:
		return r.err
	case r.ops == 0 && r.err != nil:
		return fmt.Errorf("no operation succeeded: %w", r.err)
	case r.ops == 0:
		return errors.New("no operation completed in the measured window")
	case r.errs*2 > r.ops:
		return fmt.Errorf("%d of %d operations failed: %w", r.errs, r.ops+r.errs, r.err)
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
