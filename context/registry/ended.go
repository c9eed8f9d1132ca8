package registry

import (
	"sync"
	"sync/atomic"
	"time"
)

// endedMemory is how the registry remembers how leases ended (DESIGN §3: a
// late use is told released, expired or revoked for at least EndedMemory).
//
// Under a churn its memo is the registry's largest structure, and a write
// at a random place in it is a cache miss: an eighth of an acquire and
// release, made under r.mu. So an end is staged under r.mu in a small
// ring, which costs a copy, and written into the memo off the lock by
// whoever calls fold next (a release, a revoke, the expiry loop). A
// lookup, under r.mu, sees every end: the ones not yet written in the
// ring, the others in the memo. It waits for a folder that is writing, a
// few entries when the folds keep up; so does an add that finds the ring
// full.
//
// The ring's entries [folded, staged) are not yet in the memo. Only add,
// under r.mu, writes the ring and moves staged; only a folder holding mu
// moves folded, after it wrote the entries into the memo. The atomics order
// the two: a folder reads no entry before its staging, and add overwrites
// none before it was folded.
type endedMemory struct {
	ring   [endedRing]stagedEnd
	staged atomic.Uint64 // entries added so far; r.mu
	folded atomic.Uint64 // entries written into memo so far; mu

	mu   sync.Mutex
	memo *memo[endedKey, endedLease] // mu
}

// endedRing is the number of ends staged at most. A fuller ring is folded
// by add itself, under r.mu: the old cost, when no fold keeps up.
const endedRing = 256

// endedFoldAt is how many staged ends make fold worth its lock: a folder
// writes them in a row, and pays for the lock's cache line once.
const endedFoldAt = 8

// stagedEnd is an end not yet in the memo.
type stagedEnd struct {
	key endedKey
	end endedLease
	at  time.Time
}

func newEndedMemory(keep time.Duration, max int) *endedMemory {
	return &endedMemory{memo: newMemo[endedKey, endedLease](keep, max)}
}

// add remembers that the lease of key ended with e at now; r.mu is held.
func (m *endedMemory) add(key endedKey, e endedLease, now time.Time) {
	n := m.staged.Load()
	if n-m.folded.Load() == endedRing {
		m.mu.Lock()
		m.foldLocked(n)
		m.mu.Unlock()
	}
	m.ring[n%endedRing] = stagedEnd{key: key, end: e, at: now}
	m.staged.Store(n + 1)
}

// get returns how the lease of key ended, if it is remembered; r.mu is
// held, so no add runs meanwhile.
func (m *endedMemory) get(key endedKey) (endedLease, bool) {
	n, f := m.staged.Load(), m.folded.Load()
	// Newest first. An entry a folder writes meanwhile is still here:
	// only add overwrites the ring.
	for i := n; i > f; i-- {
		if s := &m.ring[(i-1)%endedRing]; s.key == key {
			return s.end, true
		}
	}
	// Every entry before f was written into the memo before folded
	// passed it.
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.memo.get(key)
}

// fold writes the staged ends into the memo, unless there are few of them
// or another goroutine is folding. It is called off r.mu.
func (m *endedMemory) fold() {
	if m.staged.Load()-m.folded.Load() < endedFoldAt || !m.mu.TryLock() {
		return
	}
	m.foldLocked(m.staged.Load())
	m.mu.Unlock()
}

// foldLocked writes the staged ends before n into the memo; mu is held.
// folded moves once they are all written: until then add does not reuse
// their slots, and a lookup finds them in the ring or, once it holds mu,
// in the memo. A folded slot keeps its entry, and its pointer, until add
// reuses it: 256 at most.
func (m *endedMemory) foldLocked(n uint64) {
	for i := m.folded.Load(); i < n; i++ {
		s := &m.ring[i%endedRing]
		m.memo.put(s.key, s.end, s.at)
	}
	m.folded.Store(n)
}

// prune drops what is older than the memo keeps; r.mu is held. The staged
// ends are written first, so that none waits in the ring past a prune: put
// with an end's own time, one written much later could start a generation
// in the past (a full generation rotates at the put's time), and the next
// prune would drop ends the memo holds before they are keep old.
func (m *endedMemory) prune(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.foldLocked(m.staged.Load())
	m.memo.prune(now)
}

// len counts the ends remembered; r.mu is held.
func (m *endedMemory) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.memo.len() + int(m.staged.Load()-m.folded.Load())
}
