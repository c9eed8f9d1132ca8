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
// before the current one runs out. A block lasts at least about a second:
// when blocks go faster, the next one reserved is twice as large (up to
// maxEpochBlock), so a churn of acquires does not outrun the store's
// reservations. When the block runs out all the same, an acquire waits for
// the reservation under way, at most epochWait; when that does not bring
// one (the store does not answer), it fails with store_unavailable.
type epochRange struct {
	next, limit int64 // next to issue; limit is one past the last reserved
	// spareNext and spareLimit are a block reserved while the current one
	// was not used up and that does not follow on from it (another replica
	// reserved in between): it is used next. Empty when spareNext ==
	// spareLimit.
	spareNext, spareLimit int64
	// size is how many epochs the next reservation asks for.
	size int64
	// lastRefill is when the last reservation started (monotonic).
	lastRefill time.Time
	// refill is not nil while a reservation runs, and closed when it ends.
	refill chan struct{}
	// err is how the last reservation failed; nil after one succeeded.
	err error
}

const (
	// reserveTimeout bounds one reservation in the store.
	reserveTimeout = 10 * time.Second
	// epochBlockLife is how long a block should last at least: a block
	// used up faster makes the next reservation twice as large.
	epochBlockLife = time.Second
	// maxEpochBlock bounds the size a block can grow to.
	maxEpochBlock = 1 << 22
	// epochWait is how long an acquire that found the block empty waits
	// for the reservation under way.
	epochWait = 500 * time.Millisecond
)

// errNoEpochs is why an epoch cannot be issued while a reservation runs.
var errNoEpochs = errors.New("no epoch is reserved: the next block is being reserved")

// reserveFirst reserves the registry's first block, before it runs.
func (r *Registry) reserveFirst(ctx context.Context) error {
	first, err := r.store.ReserveEpochs(ctx, r.cfg.EpochBlock)
	if err != nil {
		return cheetah.StoreUnavailable("registry: reserve epochs", err)
	}
	r.mu.Lock()
	r.epochs.size = r.cfg.EpochBlock
	r.installEpochs(first, r.cfg.EpochBlock)
	r.mu.Unlock()
	return nil
}

// installEpochs takes a newly reserved block of n epochs; r.mu is held. A
// block reserved later always lies above an earlier one, so the rest of the
// current block is kept: the new one extends it when it follows on, and is
// kept aside for when it is used up otherwise.
func (r *Registry) installEpochs(first, n int64) {
	e := &r.epochs
	switch {
	case first < e.limit:
		// Below a block already in use: issuing from it would go backwards.
	case first == e.limit:
		e.limit = first + n
	case e.next >= e.limit:
		e.next, e.limit = first, first+n
	default:
		e.spareNext, e.spareLimit = first, first+n
	}
}

// nextEpoch issues an epoch; r.mu is held. It never calls the store: when
// the block runs low it starts reserving the next one in the background,
// and when it is empty it fails with store_unavailable (see awaitEpochs).
func (r *Registry) nextEpoch() (int64, error) {
	e := &r.epochs
	if e.next >= e.limit && e.spareNext < e.spareLimit {
		e.next, e.limit = e.spareNext, e.spareLimit
		e.spareNext, e.spareLimit = 0, 0
	}
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
	if e.limit-e.next <= e.size/2 && e.spareNext == e.spareLimit {
		r.refillEpochs()
	}
	return n, nil
}

// nextEpochAbove issues an epoch above floor; r.mu is held. Blocks of
// several replicas interleave, so a context that comes from another
// replica may have had an epoch above this replica's block: the block is
// skipped past it (epochs need not be dense, only rising and never
// reused), and when nothing reserved lies above it the next reservation
// will, since it starts above every epoch issued anywhere.
func (r *Registry) nextEpochAbove(floor int64) (int64, error) {
	e := &r.epochs
	if floor >= e.next {
		e.next = min(floor+1, e.limit)
		if floor >= e.spareLimit {
			e.spareNext = e.spareLimit
		} else {
			e.spareNext = max(e.spareNext, floor+1)
		}
	}
	return r.nextEpoch()
}

// refillEpochs starts reserving the next block in the background unless a
// reservation runs already or the registry closed; r.mu is held. Close
// cancels and joins it.
func (r *Registry) refillEpochs() {
	e := &r.epochs
	if e.refill != nil || r.closed {
		return
	}
	now := time.Now()
	if !e.lastRefill.IsZero() && now.Sub(e.lastRefill) < epochBlockLife {
		e.size = min(2*e.size, maxEpochBlock)
	}
	e.lastRefill = now
	n := max(e.size, r.cfg.EpochBlock)
	done := make(chan struct{})
	e.refill = done
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
// that one could not reserve. An acquire waits at most epochWait for a
// reservation; this is for whoever would rather wait (a test, a start after
// an outage).
func (r *Registry) ReserveEpochs(ctx context.Context) error {
	e := &r.epochs
	started := false
	for {
		r.mu.Lock()
		if e.refill == nil && (e.next < e.limit || e.spareNext < e.spareLimit) {
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

// awaitEpochs waits, after an epoch could not be issued, for the
// reservation under way, until deadline at the latest (the first call sets
// it to epochWait from now); r.mu is held, and released while it waits. It
// reports whether a reservation succeeded meanwhile, so that trying again
// may succeed (other acquires may use the new block up first: the caller
// tries again until the deadline).
func (r *Registry) awaitEpochs(ctx context.Context, deadline *time.Time) bool {
	done := r.epochs.refill
	if done == nil {
		return false
	}
	if deadline.IsZero() {
		*deadline = time.Now().Add(epochWait)
	}
	wait := time.Until(*deadline)
	if wait <= 0 {
		return false
	}
	r.mu.Unlock()
	t := time.NewTimer(wait)
	select {
	case <-done:
	case <-t.C:
	case <-ctx.Done():
	}
	t.Stop()
	r.mu.Lock()
	return r.epochs.err == nil && ctx.Err() == nil && time.Now().Before(*deadline)
}
