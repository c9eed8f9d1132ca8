package registry

import (
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// The registry's lock excludes as a mutex does, whether its Lock retries
// (more than one processor) or parks at once (one), with many goroutines
// taking it back to back. Not parallel: it sets GOMAXPROCS.
func TestSpinMutexExcludes(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, procs := range []int{2, 1} {
		runtime.GOMAXPROCS(procs)
		var m spinMutex
		const goroutines, rounds = 64, 2000
		var inside, total, overlaps int
		var wg sync.WaitGroup
		for range goroutines {
			wg.Go(func() {
				for range rounds {
					m.Lock()
					inside++
					if inside != 1 {
						overlaps++
					}
					total++
					inside--
					m.Unlock()
				}
			})
		}
		wg.Wait()
		require.Zero(t, overlaps, "GOMAXPROCS %d", procs)
		require.Equal(t, goroutines*rounds, total, "GOMAXPROCS %d", procs)
	}
}

// Whether a Lock that finds the lock held retries follows GOMAXPROCS as it
// is then: the processor governor lowers and raises it while the registry
// runs, and a lock made while it held one processor must retry once it
// raised them. Not parallel: it sets GOMAXPROCS.
func TestSpinMutexFollowsTheProcessors(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var m spinMutex // made on one processor
	runtime.GOMAXPROCS(2)
	require.True(t, spins(), "two processors")
	runtime.GOMAXPROCS(1)
	require.False(t, spins(), "one processor")
	m.Lock()
	require.False(t, m.TryLock(), "held")
	m.Unlock()
}
