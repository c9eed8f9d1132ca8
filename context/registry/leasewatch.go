package registry

import (
	"sync"

	cheetah "github.com/cheetahbroker/cheetah"
)

// The registry is a cheetah.LeaseWatcher: Handle.Done closes at once when
// a lease ends, told by the registry's own event stream (LeaseEnded), which
// one subscription, made on the first watch, fans out by lease.
var _ cheetah.LeaseWatcher = (*Registry)(nil)

// leaseWatches are the watches of leases by the lease's user and epoch
// (an epoch is never issued twice, so it names one lease).
type leaseWatches struct {
	mu     sync.Mutex
	subbed bool
	by     map[watchKey]map[*leaseWatch]struct{}
}

type watchKey struct {
	user  string
	epoch int64
}

type leaseWatch struct {
	once sync.Once
	lost func(cheetah.LostReason)
}

func (w *leaseWatch) fire(reason cheetah.LostReason) { w.once.Do(func() { w.lost(reason) }) }

// WatchLease implements cheetah.LeaseWatcher: lost is called once with the
// reason the lease ended, from the event stream, or at once when the lease
// already ended (with the reason a send would be told). Only the lease's
// token is read.
func (r *Registry) WatchLease(l cheetah.Lease, lost func(cheetah.LostReason)) (stop func()) {
	ws := &r.watches
	ws.mu.Lock()
	if !ws.subbed {
		ws.subbed = true
		ws.by = map[watchKey]map[*leaseWatch]struct{}{}
		r.Subscribe(r.leaseEnded) // for the life of the registry
	}
	ws.mu.Unlock()
	lw := &leaseWatch{lost: lost}
	key := keyOf(l.LeaseToken)
	r.mu.Lock()
	cur := r.leases[key]
	if cur == nil {
		reason := r.lostReason(key)
		r.mu.Unlock()
		lw.fire(reason)
		return func() {}
	}
	// Under r.mu, which every LeaseEnded is emitted under: the end of this
	// lease is delivered after the watch is in place.
	k := watchKey{user: cur.ctx.client.pool.userID, epoch: cur.epoch}
	ws.mu.Lock()
	set := ws.by[k]
	if set == nil {
		set = map[*leaseWatch]struct{}{}
		ws.by[k] = set
	}
	set[lw] = struct{}{}
	ws.mu.Unlock()
	r.mu.Unlock()
	return func() {
		ws.mu.Lock()
		if set := ws.by[k]; set != nil {
			delete(set, lw)
			if len(set) == 0 {
				delete(ws.by, k)
			}
		}
		ws.mu.Unlock()
		lw.once.Do(func() {}) // nothing after stop
	}
}

// WatchedLeases counts the leases watched (for tests: a watch leaves no
// bookkeeping behind).
func (r *Registry) WatchedLeases() int {
	r.watches.mu.Lock()
	defer r.watches.mu.Unlock()
	return len(r.watches.by)
}

// leaseEnded fires the watches of a lease that ended.
func (r *Registry) leaseEnded(ev Event) {
	if ev.Kind != LeaseEnded {
		return
	}
	k := watchKey{user: ev.UserID, epoch: ev.Epoch}
	ws := &r.watches
	ws.mu.Lock()
	set := ws.by[k]
	delete(ws.by, k)
	ws.mu.Unlock()
	for lw := range set {
		lw.fire(ev.Reason)
	}
}
