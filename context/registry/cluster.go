package registry

import (
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
)

// IdleSince returns since when the context an acquire of req would get now
// has been idle, and false when there is none (or req is not valid). The
// replicas of one database compare it to give the context idle longest in
// the whole cluster, as one registry would (DESIGN §9).
func (r *Registry) IdleSince(req cheetah.AcquireRequest) (time.Time, bool) {
	if normalizeAcquire(&req, r.cfg.DefaultTTL) != nil {
		return time.Time{}, false
	}
	var scratch lease // pickIdle notes the affinity outcome on it
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.users[req.UserID]
	if p == nil {
		return time.Time{}, false
	}
	w := r.pickIdle(p, &req, &scratch)
	if w == nil {
		return time.Time{}, false
	}
	return w.idleSince, true
}
