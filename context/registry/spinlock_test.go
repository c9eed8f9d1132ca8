package registry

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// The registry's lock excludes as a mutex does, whether its Lock retries
// or parks at once, with many goroutines taking it back to back.
func TestSpinMutexExcludes(t *testing.T) {
	t.Parallel()
	for _, spin := range []bool{true, false} {
		m := spinMutex{spin: spin}
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
		require.Zero(t, overlaps, "spin %v", spin)
		require.Equal(t, goroutines*rounds, total, "spin %v", spin)
	}
}
