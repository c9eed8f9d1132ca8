package registry

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestMemoKeepsAtLeastKeep(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := newMemo[string, int](10*time.Minute, 1000)
	for i := range 100 {
		// One entry every 30 s over 50 minutes.
		now := start.Add(time.Duration(i) * 30 * time.Second)
		m.put(fmt.Sprint(i), i, now)
		for j := 0; j <= i; j++ {
			age := now.Sub(start.Add(time.Duration(j) * 30 * time.Second))
			if age < 10*time.Minute {
				v, ok := m.get(fmt.Sprint(j))
				require.True(t, ok, "entry %d aged %s is remembered", j, age)
				require.Equal(t, j, v)
			}
		}
	}
	require.LessOrEqual(t, m.len(), 2*40, "nothing much older than two generations")
	m.prune(start.Add(2 * time.Hour))
	require.Zero(t, m.len(), "everything older than keep goes")
}

func TestMemoBounded(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := newMemo[string, int](time.Hour, 100)
	for i := range 10_000 {
		m.put(fmt.Sprint(i), i, now)
		require.LessOrEqual(t, m.len(), 200)
	}
	_, ok := m.get("9999")
	require.True(t, ok, "the newest is kept")
	_, ok = m.get("9899")
	require.True(t, ok, "the last max are kept")
}

// A busy memo's generations fill to the same size: once both maps have
// grown, rotating reuses the dropped one, and puts allocate nothing. Not
// parallel: AllocsPerRun counts the whole process's allocations.
func TestMemoReusesItsMaps(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := newMemo[int, int](time.Hour, 1000)
	for i := range 3000 {
		m.put(i, i, now)
	}
	next := 3000
	allocs := testing.AllocsPerRun(1, func() {
		for range 2500 { // two more rotations
			m.put(next, next, now)
			next++
		}
	})
	require.Zero(t, allocs)
	_, ok := m.get(next - 1)
	require.True(t, ok)
	_, ok = m.get(next - 2001)
	require.False(t, ok, "two generations back is gone")
}
