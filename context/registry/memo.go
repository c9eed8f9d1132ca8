package registry

import "time"

// memo remembers values for a while: at least keep, unless more than max
// entries arrive within that time, in which case the oldest go first. It is
// how the registry bounds what it remembers about ended leases and finished
// commands. Entries are appended in time order, so pruning looks only at the
// front of a FIFO.
type memo[V any] struct {
	keep  time.Duration
	max   int
	byKey map[string]memoEntry[V]
	fifo  []memoKey
	head  int
}

type memoEntry[V any] struct {
	v  V
	at time.Time
}

type memoKey struct {
	key string
	at  time.Time
}

func newMemo[V any](keep time.Duration, max int) *memo[V] {
	return &memo[V]{keep: keep, max: max, byKey: map[string]memoEntry[V]{}}
}

func (m *memo[V]) put(key string, v V, now time.Time) {
	m.byKey[key] = memoEntry[V]{v: v, at: now}
	m.fifo = append(m.fifo, memoKey{key: key, at: now})
	m.prune(now)
}

func (m *memo[V]) get(key string) (V, bool) {
	e, ok := m.byKey[key]
	return e.v, ok
}

func (m *memo[V]) len() int { return len(m.byKey) }

// prune drops what is older than keep, then the oldest beyond max.
func (m *memo[V]) prune(now time.Time) {
	for m.head < len(m.fifo) {
		k := m.fifo[m.head]
		if now.Sub(k.at) < m.keep && len(m.fifo)-m.head <= m.max {
			break
		}
		// A key put twice has a newer entry; only the entry it matches goes.
		if e, ok := m.byKey[k.key]; ok && e.at.Equal(k.at) {
			delete(m.byKey, k.key)
		}
		m.fifo[m.head] = memoKey{}
		m.head++
	}
	// Compact once the dead prefix dominates, so memory follows the live size.
	if m.head > 1024 && m.head*2 > len(m.fifo) {
		m.fifo = append([]memoKey(nil), m.fifo[m.head:]...)
		m.head = 0
	}
}
