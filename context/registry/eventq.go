package registry

import (
	"sync"
	"time"
)

// eventChunk is how many events one chunk of the event queue holds.
const eventChunk = 256

// maxFreeChunks is how many delivered chunks are kept for reuse at least.
const maxFreeChunks = 64

// trimEvery is how often the chunks kept beyond maxFreeChunks are reckoned
// again from what the notifier's rounds took since.
const trimEvery = 10 * time.Second

// eventQueue is the registry's ordered queue of events, in chunks. Events
// are queued under r.mu on every lease transition; in one growing slice,
// an append past its capacity would copy every event queued so far, under
// the lock, and the queue is longest exactly when the notifier falls behind
// a churn. In chunks, an append copies one event, and the chunks the
// notifier has delivered are emptied and reused, so a steady churn queues
// its events without allocating.
type eventQueue struct {
	chunks [][]Event // r.mu

	freeMu sync.Mutex
	free   [][]Event // delivered chunks, emptied
	outer  [][]Event // a delivered chunks slice, emptied, for the next take
	// peak is the most chunks one round of the notifier took since the
	// last trim, and as many delivered chunks are kept, if more than
	// maxFreeChunks: while it falls behind a churn, the producers fill as
	// many as it delivers at once, and a new chunk is allocated, and
	// zeroed, under r.mu (96 KiB; in-process churns spent a fifth of an
	// acquire and release on it and the collections it caused).
	peak    int
	trimmed time.Time // when trim last reckoned
}

// push queues ev; r.mu is held.
func (q *eventQueue) push(ev *Event) {
	n := len(q.chunks)
	if n == 0 || len(q.chunks[n-1]) == cap(q.chunks[n-1]) {
		q.chunks = append(q.chunks, q.chunk())
		n++
	}
	q.chunks[n-1] = append(q.chunks[n-1], *ev)
}

func (q *eventQueue) chunk() []Event {
	q.freeMu.Lock()
	defer q.freeMu.Unlock()
	if k := len(q.free); k > 0 {
		c := q.free[k-1]
		q.free[k-1] = nil
		q.free = q.free[:k-1]
		return c
	}
	return make([]Event, 0, eventChunk)
}

// take returns the queued events, oldest first, and empties the queue;
// r.mu is held. The caller hands the chunks back with release once it has
// delivered them.
func (q *eventQueue) take() [][]Event {
	out := q.chunks
	q.freeMu.Lock()
	q.chunks, q.outer = q.outer, nil
	q.freeMu.Unlock()
	return out
}

// release takes back delivered chunks for reuse.
func (q *eventQueue) release(chunks [][]Event) {
	q.freeMu.Lock()
	defer q.freeMu.Unlock()
	q.peak = max(q.peak, len(chunks))
	keep := max(maxFreeChunks, q.peak)
	for i, c := range chunks {
		clear(c) // drops what the events referenced
		if len(q.free) < keep {
			q.free = append(q.free, c[:0])
		}
		chunks[i] = nil
	}
	if q.outer == nil && chunks != nil {
		q.outer = chunks[:0]
	}
}

// trim gives back, once every trimEvery, the kept chunks beyond what the
// notifier's rounds took since the last time (and maxFreeChunks): what a
// burst's backlog held is freed within two of them once it is gone.
func (q *eventQueue) trim(now time.Time) {
	q.freeMu.Lock()
	defer q.freeMu.Unlock()
	if now.Sub(q.trimmed) < trimEvery {
		return
	}
	q.trimmed = now
	if keep := max(maxFreeChunks, q.peak); len(q.free) > keep {
		clear(q.free[keep:])
		q.free = q.free[:keep]
	}
	q.peak = 0
}
