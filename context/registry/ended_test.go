package registry

import (
	"encoding/binary"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func endedKeyOf(i uint64) (k endedKey) {
	binary.LittleEndian.PutUint64(k[:], i+1)
	return k
}

// Every end is found from the moment add returns, whether it is still
// staged, being written by a folder, or in the memo: many goroutines end
// leases, as releases do, and look up ends, as late uses do (the newest,
// the oldest still staged, and one further back), while folders write
// the staged ends into the memo, now and then, so that the ring also fills
// while a fold is under way. rmu stands for the registry's lock.
func TestEndedMemoryFindsEveryEnd(t *testing.T) {
	t.Parallel()
	const workers, perWorker = 16, 4000
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := newEndedMemory(time.Hour, workers*perWorker) // nothing is dropped
	idents := []*ctxIdent{{contextID: "a"}, {contextID: "b"}}
	var rmu sync.Mutex
	var added uint64 // ends added so far, in key order; rmu
	found := func(i uint64) bool {
		e, ok := m.get(endedKeyOf(i))
		return ok && e.at == idents[i%2] && e.reason == endReason(i%4)
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for j := range perWorker {
				rmu.Lock()
				i := added
				m.add(endedKeyOf(i), endedLease{at: idents[i%2], reason: endReason(i % 4)}, now)
				added++
				oldest := min(m.folded.Load(), i) // staged, unless every end is folded
				back := uint64(j*7+w) % added
				ok := found(i) && found(oldest) && found(back)
				rmu.Unlock()
				if !ok {
					t.Errorf("after end %d: ends %d, %d or %d not found", i, i, oldest, back)
					return
				}
				if j%1000 == w {
					m.fold()
				}
			}
		})
	}
	// A folder that waits for a nearly full ring: the adds meanwhile fill
	// it while it writes.
	stop := make(chan struct{})
	var folder sync.WaitGroup
	folder.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if m.staged.Load()-m.folded.Load() >= endedRing-endedRing/8 {
				m.fold()
			}
			runtime.Gosched()
		}
	})
	wg.Wait()
	close(stop)
	folder.Wait()
	rmu.Lock()
	defer rmu.Unlock()
	require.Equal(t, workers*perWorker, m.len())
	for i := range uint64(workers * perWorker) {
		require.True(t, found(i), "end %d", i)
	}
	_, ok := m.get(endedKeyOf(workers * perWorker))
	require.False(t, ok, "an end never added")
}

// With nobody folding, a full ring is written into the memo by add itself,
// and prune writes what is staged before it drops what is old.
func TestEndedMemoryWithoutFolds(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := newEndedMemory(10*time.Minute, 10_000)
	n := uint64(3*endedRing + 5)
	for i := range n {
		m.add(endedKeyOf(i), endedLease{reason: endReason(i % 4)}, start)
		require.LessOrEqual(t, m.staged.Load()-m.folded.Load(), uint64(endedRing))
	}
	require.Equal(t, int(n), m.len())
	require.Equal(t, int(m.folded.Load()), m.memo.len(), "what add folded is in the memo")
	for i := range n {
		e, ok := m.get(endedKeyOf(i))
		require.True(t, ok, "end %d", i)
		require.Equal(t, endReason(i%4), e.reason)
	}
	m.prune(start.Add(5 * time.Minute))
	require.Equal(t, m.staged.Load(), m.folded.Load(), "prune leaves nothing staged")
	require.Equal(t, int(n), m.len(), "nothing younger than keep goes")
	m.prune(start.Add(time.Hour))
	require.Zero(t, m.len(), "everything older than keep goes")
	_, ok := m.get(endedKeyOf(n - 1))
	require.False(t, ok)
}
