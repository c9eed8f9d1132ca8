package registry

import (
	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/quota"
)

// placement is what a lease carries of DESIGN §10: the quotas it is
// charged to, its tenant, and how its context was found.
type placement struct {
	// qset is the quota set charges were computed under.
	qset *quota.Set
	// charges are the indexes in qset of the quotas that govern the lease;
	// they point into govBuf while they fit, so most acquires allocate
	// nothing for them.
	charges []int
	govBuf  [4]int
	// held are the scopes each of charges counted the lease in, while it
	// is charged (charge); in heldBuf while they fit.
	held    []heldSlots
	heldBuf [4]heldSlots
	tenant  string
	// reqLabels are the labels the acquire requested: a reload matches
	// the live leases against the new quotas with them.
	reqLabels map[string]string
	affinity  affinityState
	// created is set when the context was opened for this lease.
	created bool
}

// affinityState is what an acquire's affinity key found.
type affinityState uint8

const (
	affinityNone affinityState = iota // no key
	affinityMiss
	affinityHit
)

// describe adds the placement to a lease view.
func (p *placement) describe(v *cheetah.Lease) {
	v.TenantID, v.Created = p.tenant, p.created
	if p.affinity != affinityNone {
		hit := p.affinity == affinityHit
		v.AffinityHit = &hit
	}
}

// affine returns the longest-idle context on l matching req whose last
// lease carried req's affinity key, if any.
func (l *idleList) affine(req *cheetah.AcquireRequest) *wctx {
	for w := l.head; w != nil; w = w.idleNext {
		if w.affinityKey == req.AffinityKey && w.matches(req) {
			return w
		}
	}
	return nil
}

// affinityOf is what req's affinity key finds in w, handed to a waiter.
func affinityOf(w *wctx, req *cheetah.AcquireRequest) affinityState {
	switch {
	case req.AffinityKey == "":
		return affinityNone
	case w.affinityKey == req.AffinityKey:
		return affinityHit
	}
	return affinityMiss
}
