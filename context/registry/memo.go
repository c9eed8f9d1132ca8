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
type memo[V any] struct {
	keep      time.Duration
	max       int
	cur, prev map[string]V
	curStart  time.Time
}

func newMemo[V any](keep time.Duration, max int) *memo[V] {
	return &memo[V]{keep: keep, max: max, cur: map[string]V{}, prev: map[string]V{}}
}

func (m *memo[V]) put(key string, v V, now time.Time) {
	m.prune(now)
	if len(m.cur) >= m.max {
		m.rotate(now)
	}
	m.cur[key] = v
}

func (m *memo[V]) get(key string) (V, bool) {
	if v, ok := m.cur[key]; ok {
		return v, true
	}
	v, ok := m.prev[key]
	return v, ok
}

func (m *memo[V]) len() int { return len(m.cur) + len(m.prev) }

// prune retires generations that have outlived keep.
func (m *memo[V]) prune(now time.Time) {
	switch age := now.Sub(m.curStart); {
	case age >= 2*m.keep:
		// Both generations are older than keep.
		m.prev, m.cur, m.curStart = map[string]V{}, map[string]V{}, now
	case age >= m.keep:
		m.rotate(now)
	}
}

func (m *memo[V]) rotate(now time.Time) {
	m.prev, m.cur, m.curStart = m.cur, map[string]V{}, now
}
