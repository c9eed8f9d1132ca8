package registry

import (
	"context"
	"errors"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
)

// epochRange is a block of epochs reserved in the store and not yet issued.
// Reserving blocks keeps the store off the acquire path while the persisted
// high-water mark guarantees that no epoch is issued twice, across restarts
// too: a restart abandons the rest of its block and reserves a new one.
//
// The store is never called under r.mu. The next block is reserved in the
// background once half of the current one is issued, so that it is at hand
// before the current one runs out. When it is not, an acquire waits for the
// reservation under way outside the lock (ReserveEpochs) and fails with
// store_unavailable only when that fails; a hand-over to a waiting acquire
// fails at once. A block that ran out makes the next one twice as large, up
// to maxEpochBlock, so that a burst of acquires soon finds its epochs at
// hand however fast the store answers.
type epochRange struct {
	next, limit int64 // next to issue; limit is one past the last reserved
	// size is how many epochs the next reservation asks for.
	size int64
	// refill is not nil while a reservation runs, and closed when it ends.
	refill chan struct{}
	// err is how the last reservation failed; nil after one succeeded.
	err error
}

// reserveTimeout bounds one reservation in the store.
const reserveTimeout = 10 * time.Second

// maxEpochBlock bounds how large a block of epochs grows. A restart
// abandons what is left of its block: a million epochs out of 2^63.
const maxEpochBlock = 1 << 20

// errNoEpochs is why an epoch cannot be issued while a reservation runs.
var errNoEpochs = errors.New("no epoch is reserved: the next block is being reserved")

// reserveFirst reserves the registry's first block, before it runs.
func (r *Registry) reserveFirst(ctx context.Context) error {
	r.epochs.size = r.cfg.EpochBlock
	first, err := r.store.ReserveEpochs(ctx, r.epochs.size)
	if err != nil {
		return cheetah.StoreUnavailable("registry: reserve epochs", err)
	}
	r.mu.Lock()
	r.installEpochs(first, r.epochs.size)
	r.mu.Unlock()
	return nil
}

// installEpochs takes a newly reserved block of n epochs; r.mu is held. A
// block reserved later always lies above an earlier one, so the rest of the
// current block is kept and the new one only extends the limit when it
// follows on.
func (r *Registry) installEpochs(first, n int64) {
	e := &r.epochs
	switch {
	case first < e.limit:
		// Below a block already in use: issuing from it would go backwards.
	case first == e.limit:
		e.limit = first + n
	case e.next >= e.limit:
		e.next, e.limit = first, first+n
	}
}

// ranOut records that the block was found empty; r.mu is held. The next
// reservation asks for twice as many.
func (r *Registry) ranOut() {
	r.epochs.size = min(2*r.epochs.size, max(maxEpochBlock, r.cfg.EpochBlock))
}

// nextEpoch issues an epoch; r.mu is held. It never calls the store: when
// the block runs low it starts reserving the next one in the background,
// and when it is empty it fails with store_unavailable.
func (r *Registry) nextEpoch() (int64, error) {
	e := &r.epochs
	if e.next >= e.limit {
		r.ranOut()
		r.refillEpochs()
		why := e.err
		if why == nil {
			why = errNoEpochs
		}
		return 0, cheetah.StoreUnavailable("registry: issue an epoch", why)
	}
	n := e.next
	e.next++
	if e.limit-e.next <= e.size/2 {
		r.refillEpochs()
	}
	return n, nil
}

// refillEpochs starts reserving the next block in the background unless a
// reservation runs already or the registry closed; r.mu is held. Close
// cancels and joins it.
func (r *Registry) refillEpochs() {
	e := &r.epochs
	if e.refill != nil || r.closed {
		return
	}
	done := make(chan struct{})
	e.refill = done
	n := e.size
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		ctx, cancel := context.WithTimeout(r.bg, reserveTimeout)
		first, err := r.store.ReserveEpochs(ctx, n)
		cancel()
		r.mu.Lock()
		defer r.mu.Unlock()
		if err != nil {
			r.log.Warn("reserve epochs", "err", err)
		} else {
			r.installEpochs(first, n)
		}
		e.err = err
		e.refill = nil
		close(done)
	}()
}

// ReserveEpochs makes sure a block of epochs is at hand: it waits for the
// reservation under way, if any, and when the block is still empty starts
// one of its own and waits for it; it fails with store_unavailable when
// that one could not reserve. An acquire never waits for the store; this is
// for whoever would rather wait (a test, a start after an outage).
func (r *Registry) ReserveEpochs(ctx context.Context) error {
	e := &r.epochs
	started := false
	for {
		r.mu.Lock()
		if e.refill == nil && e.next < e.limit {
			r.mu.Unlock()
			return nil
		}
		if e.refill == nil {
			if started {
				why := e.err
				if why == nil {
					why = errNoEpochs
				}
				r.mu.Unlock()
				return cheetah.StoreUnavailable("registry: reserve epochs", why)
			}
			r.refillEpochs()
			started = true
		}
		done := e.refill
		r.mu.Unlock()
		if done == nil {
			return errShuttingDown
		}
		select {
		case <-done:
		case <-ctx.Done():
			return cheetah.StoreUnavailable("registry: reserve epochs", ctx.Err())
		}
	}
}
