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
// before the current one runs out; when it is not (the store does not
// answer), an acquire fails at once with store_unavailable and starts
// another reservation.
type epochRange struct {
	next, limit int64 // next to issue; limit is one past the last reserved
	// refill is not nil while a reservation runs, and closed when it ends.
	refill chan struct{}
	// err is how the last reservation failed; nil after one succeeded.
	err error
}

// reserveTimeout bounds one reservation in the store.
const reserveTimeout = 10 * time.Second

// errNoEpochs is why an epoch cannot be issued while a reservation runs.
var errNoEpochs = errors.New("no epoch is reserved: the next block is being reserved")

// reserveFirst reserves the registry's first block, before it runs.
func (r *Registry) reserveFirst(ctx context.Context) error {
	first, err := r.store.ReserveEpochs(ctx, r.cfg.EpochBlock)
	if err != nil {
		return cheetah.StoreUnavailable("registry: reserve epochs", err)
	}
	r.mu.Lock()
	r.installEpochs(first)
	r.mu.Unlock()
	return nil
}

// installEpochs takes a newly reserved block; r.mu is held. A block reserved
// later always lies above an earlier one, so the rest of the current block is
// kept and the new one only extends the limit when it follows on.
func (r *Registry) installEpochs(first int64) {
	e := &r.epochs
	switch {
	case first < e.limit:
		// Below a block already in use: issuing from it would go backwards.
	case first == e.limit:
		e.limit = first + r.cfg.EpochBlock
	case e.next >= e.limit:
		e.next, e.limit = first, first+r.cfg.EpochBlock
	}
}

// nextEpoch issues an epoch; r.mu is held. It never calls the store: when
// the block runs low it starts reserving the next one in the background,
// and when it is empty it fails with store_unavailable.
func (r *Registry) nextEpoch() (int64, error) {
	e := &r.epochs
	if e.next >= e.limit {
		r.refillEpochs()
		why := e.err
		if why == nil {
			why = errNoEpochs
		}
		return 0, cheetah.StoreUnavailable("registry: issue an epoch", why)
	}
	n := e.next
	e.next++
	if e.limit-e.next <= r.cfg.EpochBlock/2 {
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
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		ctx, cancel := context.WithTimeout(r.bg, reserveTimeout)
		first, err := r.store.ReserveEpochs(ctx, r.cfg.EpochBlock)
		cancel()
		r.mu.Lock()
		defer r.mu.Unlock()
		if err != nil {
			r.log.Warn("reserve epochs", "err", err)
		} else {
			r.installEpochs(first)
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
