package registry

import "testing"

// The event queue gives back what was pushed, in order, across chunks, and
// once warm queues a steady stream without allocating.
func TestEventQueueOrderAndReuse(t *testing.T) {
	var q eventQueue
	round := func(n int) {
		for i := range n {
			q.push(&Event{Seq: uint64(i + 1)})
		}
		chunks := q.take()
		next := uint64(1)
		for _, c := range chunks {
			for _, ev := range c {
				if ev.Seq != next {
					t.Fatalf("event %d where %d was due", ev.Seq, next)
				}
				next++
			}
		}
		if next != uint64(n+1) {
			t.Fatalf("%d events back of %d", next-1, n)
		}
		q.release(chunks)
	}
	round(3*eventChunk + 7)
	round(1)
	if allocs := testing.AllocsPerRun(50, func() { round(2 * eventChunk) }); allocs > 0 {
		t.Fatalf("a warm queue allocated %.1f times per round", allocs)
	}
}
