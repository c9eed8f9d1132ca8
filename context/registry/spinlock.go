package registry

import (
	"runtime"
	"sync"
	"time"
)

// spinMutex is the registry's lock: a sync.Mutex whose Lock, finding it
// held, retries for a moment before it parks, when another processor can
// be running the holder.
//
// With many goroutines taking the lock back to back (an acquire and a
// release take it once each), a waiter that parks is woken onto its
// waker's processor, and runs only once the goroutine running there
// stops: under such a load, at the end of its time slice, up to 10 ms
// later. Having waited over a millisecond it turns the mutex to its
// starvation mode, where every unlock hands over to the next parked
// waiter, and the waiters queue behind each other. The registry's
// critical sections take a microsecond or two, so a waiter that retries
// for up to spinFor takes the lock once it is free, and parks only when
// the holder is itself off its processor.
//
// With one processor the holder of a held lock is off it, and retrying only
// delays it. The processor governor (internal/procs) changes GOMAXPROCS
// while the registry runs, so a Lock that finds the lock held reads it then
// (a few tens of nanoseconds, beside retries of microseconds).
type spinMutex struct {
	sync.Mutex
}

// spinFor bounds the retries of one Lock: several critical sections.
const spinFor = 10 * time.Microsecond

// spins reports whether a Lock that finds m held retries before it parks.
func spins() bool { return runtime.GOMAXPROCS(0) > 1 }

// Lock locks m.
func (m *spinMutex) Lock() {
	if m.TryLock() {
		return
	}
	if spins() {
		start := time.Now()
		for i := 1; ; i++ {
			if m.TryLock() {
				return
			}
			// A failed TryLock is a load: the clock is read now and then.
			if i%256 == 0 && time.Since(start) > spinFor {
				break
			}
		}
	}
	m.Mutex.Lock()
}
