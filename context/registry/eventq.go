package registry

import "sync"

// eventChunk is how many events one chunk of the event queue holds.
const eventChunk = 256

// maxFreeChunks bounds the delivered chunks kept for reuse.
const maxFreeChunks = 64

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
	for i, c := range chunks {
		clear(c) // drops what the events referenced
		if len(q.free) < maxFreeChunks {
			q.free = append(q.free, c[:0])
		}
		chunks[i] = nil
	}
	if q.outer == nil && chunks != nil {
		q.outer = chunks[:0]
	}
}
