package registry

import (
	"context"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
)

// epochRange is a block of epochs reserved in the store and not yet issued.
// Reserving blocks keeps the store off the acquire path while the persisted
// high-water mark guarantees that no epoch is issued twice, across restarts
// too: a restart abandons the rest of its block and reserves a new one.
type epochRange struct {
	next, limit int64 // next to issue; limit is one past the last reserved
	refilling   bool
}

func (r *Registry) reserveEpochs(ctx context.Context) error {
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
	e.refilling = false
	switch {
	case first < e.limit:
		// Reserved before a block already in use (a background reservation
		// that lost the race to a synchronous one): issuing from it would go
		// backwards, so it is abandoned.
	case first == e.limit:
		e.limit = first + r.cfg.EpochBlock
	case e.next >= e.limit:
		e.next, e.limit = first, first+r.cfg.EpochBlock
	}
}

// nextEpoch issues an epoch; r.mu is held. When the block runs low it starts
// reserving the next one in the background; when it is empty it reserves
// synchronously, which is rare and fails closed when the store is down.
func (r *Registry) nextEpoch() (int64, error) {
	e := &r.epochs
	if e.next >= e.limit {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		first, err := r.store.ReserveEpochs(ctx, r.cfg.EpochBlock)
		if err != nil {
			return 0, cheetah.StoreUnavailable("registry: reserve epochs", err)
		}
		r.installEpochs(first)
	}
	if !e.refilling && e.limit-e.next <= r.cfg.EpochBlock/2 {
		e.refilling = true
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			first, err := r.store.ReserveEpochs(ctx, r.cfg.EpochBlock)
			r.mu.Lock()
			defer r.mu.Unlock()
			if err != nil {
				r.log.Warn("reserve epochs", "err", err)
				r.epochs.refilling = false
				return
			}
			r.installEpochs(first)
		}()
	}
	n := e.next
	e.next++
	return n, nil
}
