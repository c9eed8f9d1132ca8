package registry

import (
	"testing"
	"time"
)

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

// A backlog of more chunks than maxFreeChunks, delivered round after round,
// queues without allocating once warm: as many chunks as a round took are
// kept. trim gives back, every trimEvery, what the rounds since did not
// need.
func TestEventQueueKeepsWhatABacklogNeeds(t *testing.T) {
	var q eventQueue
	const backlog = 3 * maxFreeChunks
	round := func() {
		for i := range backlog * eventChunk {
			q.push(&Event{Seq: uint64(i + 1)})
		}
		q.release(q.take())
	}
	round()
	round()
	if allocs := testing.AllocsPerRun(5, round); allocs > 0 {
		t.Fatalf("a steady backlog of %d chunks allocated %.1f times per round", backlog, allocs)
	}
	free := func() int {
		q.freeMu.Lock()
		defer q.freeMu.Unlock()
		return len(q.free)
	}
	if n := free(); n != backlog {
		t.Fatalf("%d chunks kept after rounds of %d", n, backlog)
	}

	start := time.Unix(1_700_000_000, 0)
	q.trim(start)
	if n := free(); n != backlog {
		t.Fatalf("the first trim kept %d chunks of the %d the rounds took", n, backlog)
	}
	q.trim(start.Add(trimEvery - time.Millisecond))
	if n := free(); n != backlog {
		t.Fatalf("a trim within trimEvery of the last dropped chunks: %d kept", n)
	}
	q.trim(start.Add(trimEvery))
	if n := free(); n != maxFreeChunks {
		t.Fatalf("with no round since, a trim kept %d chunks, not %d", n, maxFreeChunks)
	}
	round()
	if n := free(); n != backlog {
		t.Fatalf("a round after the trim kept %d chunks, not %d", n, backlog)
	}
}
