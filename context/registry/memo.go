package registry

import "time"

// memo remembers values for a while: at least keep, unless more than max
// entries arrive within that time, in which case the oldest go first. It is
// how the registry bounds what it remembers about ended leases and finished
// commands.
//
// It keeps two generations of maps and drops the older one whole when the
// newer one is keep old or max full: an entry lives through the rest of its
// own generation and the whole next one, so at least keep, in at most 2×max
// entries, without a deletion per put (which the hot acquire/release path
// would pay for).
type memo[K comparable, V any] struct {
	keep      time.Duration
	max       int
	cur, prev map[K]V
	curStart  time.Time
}

func newMemo[K comparable, V any](keep time.Duration, max int) *memo[K, V] {
	return &memo[K, V]{keep: keep, max: max, cur: map[K]V{}, prev: map[K]V{}}
}

func (m *memo[K, V]) put(key K, v V, now time.Time) {
	m.prune(now)
	if len(m.cur) >= m.max {
		m.rotate(now)
	}
	m.cur[key] = v
}

func (m *memo[K, V]) get(key K) (V, bool) {
	if v, ok := m.cur[key]; ok {
		return v, true
	}
	v, ok := m.prev[key]
	return v, ok
}

func (m *memo[K, V]) len() int { return len(m.cur) + len(m.prev) }

// prune retires generations that have outlived keep.
func (m *memo[K, V]) prune(now time.Time) {
	switch age := now.Sub(m.curStart); {
	case age >= 2*m.keep:
		// Both generations are older than keep: new maps, so that a memo
		// idle that long gives back the room a burst made.
		m.prev, m.cur, m.curStart = map[K]V{}, map[K]V{}, now
	case age >= m.keep:
		m.rotate(now)
	}
}

// rotate makes the current generation the previous one and starts a new
// one in the map of the generation dropped, emptied: a map keeps the room it
// grew to, and a busy memo fills every generation to about the same size,
// so the new one grows by no rehash and allocates nothing.
func (m *memo[K, V]) rotate(now time.Time) {
	old := m.prev
	clear(old)
	m.prev, m.cur, m.curStart = m.cur, old, now
}
