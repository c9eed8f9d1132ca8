package registry

import (
	"container/list"
	"sort"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/quota"
)

// The quota funnel of DESIGN §10. Slots are counted from live leases: a
// lease is charged to the quotas that govern it when it is assigned, and
// discharged when it ends (endLease: release, expiry, revoke, a lost
// context, a grace that ran out), the only two places a lease enters and
// leaves r.leases, so no path can leak a slot. A reload counts the live
// leases again under the new quotas. Everything here runs under r.mu and
// does no store I/O; the per-acquire work is a few map lookups.

// quotaState is the quotas in force and their occupancy; r.mu guards it.
type quotaState struct {
	set *quota.Set // the last good file's quotas; nil is none
	// broken is set while the last load failed: acquires that set's
	// quotas govern fail quota_unavailable until a good file is loaded.
	broken error
	uses   []quotaUse // by index in set
	// waiters are the waiting acquires that some quota governs, first
	// come first served: when a slot frees, the first of them that now
	// passes every level and finds an idle context gets it.
	waiters list.List
}

// quotaUse is one quota's slots in use, per level and scope. A scope's
// entry is deleted when it drops to zero, so the maps hold only holders.
type quotaUse struct {
	global  int
	tenants map[string]*scopeCount
	users   map[userScope]*scopeCount
	// spare are the counts of scopes that emptied, for the next scope that
	// opens: an acquire allocates no count under the lock.
	spare []*scopeCount
}

// scopeCount is one scope's slots in use. A charged lease keeps a pointer
// to each of its scopes' (heldSlots), so that its end gives its slots back
// without looking them up: the acquire path's map work under the lock.
type scopeCount struct{ n int }

// heldSlots are the scopes one quota charges a lease to.
type heldSlots struct{ tenant, user *scopeCount }

// userScope is the user level's scope: a user within a tenant.
type userScope struct{ tenant, user string }

func newQuotaUses(n int) []quotaUse {
	u := make([]quotaUse, n)
	for i := range u {
		u[i] = quotaUse{tenants: map[string]*scopeCount{}, users: map[userScope]*scopeCount{}}
	}
	return u
}

func (u *quotaUse) used(level quota.Level, tenant, user string) int {
	var c *scopeCount
	switch level {
	case quota.Global:
		return u.global
	case quota.Tenant:
		c = u.tenants[tenant]
	default:
		c = u.users[userScope{tenant, user}]
	}
	if c == nil {
		return 0
	}
	return c.n
}

// take counts one slot in every scope of tenant and user, and returns the
// scopes' counts.
func (u *quotaUse) take(tenant, user string) heldSlots {
	u.global++
	t := u.tenants[tenant]
	if t == nil {
		t = u.newCount()
		u.tenants[tenant] = t
	}
	us := userScope{tenant, user}
	c := u.users[us]
	if c == nil {
		c = u.newCount()
		u.users[us] = c
	}
	t.n++
	c.n++
	return heldSlots{tenant: t, user: c}
}

// give gives back the slot take counted in h, for tenant and user.
func (u *quotaUse) give(tenant, user string, h heldSlots) {
	u.global--
	if h.tenant.n--; h.tenant.n == 0 {
		delete(u.tenants, tenant)
		u.spare = append(u.spare, h.tenant)
	}
	if h.user.n--; h.user.n == 0 {
		delete(u.users, userScope{tenant, user})
		u.spare = append(u.spare, h.user)
	}
}

// newCount returns a zero count, a spare one if there is one.
func (u *quotaUse) newCount() *scopeCount {
	if n := len(u.spare); n > 0 {
		c := u.spare[n-1]
		u.spare = u.spare[:n-1]
		return c
	}
	return &scopeCount{}
}

// SetQuotas puts s in force (nil: no quotas) and clears a broken state.
// The live leases are counted again under s, and waiting acquires that
// now find a slot get one. Leases already held above a lowered cap are
// kept: a cap limits new acquires.
func (r *Registry) SetQuotas(s *quota.Set) {
	if s != nil && s.Len() == 0 {
		s = nil
	}
	r.qset.Store(s)
	r.mu.Lock()
	defer r.mu.Unlock()
	q := &r.quotas
	q.set, q.broken = s, nil
	q.uses = newQuotaUses(s.Len())
	for _, l := range r.leases {
		l.qset, l.charges = s, s.Governing(l.charges[:0], l.ctx.client.typ, l.reqLabels)
		r.charge(l)
	}
	// Waiting acquires are matched again: one the new quotas govern waits
	// for a slot too (after those that already did), one they no longer
	// govern waits for a context alone.
	for _, p := range r.users {
		for e := p.waiters.Front(); e != nil; e = e.Next() {
			wt := e.Value.(*waiter)
			wt.l.qset, wt.l.charges = s, s.Governing(wt.l.charges[:0], wt.req.ClientType, wt.req.Labels)
			switch governed := len(wt.l.charges) > 0; {
			case governed && wt.qelem == nil:
				wt.qelem = q.waiters.PushBack(wt)
			case !governed && wt.qelem != nil:
				q.waiters.Remove(wt.qelem)
				wt.qelem = nil
			}
		}
	}
	r.slotsFreed()
}

// QuotasBroken records that loading the quota file failed with err: the
// quotas last in force stay defined, and the acquires they govern fail
// quota_unavailable, waiting ones included, until SetQuotas.
func (r *Registry) QuotasBroken(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.quotas.broken = err
	for e := r.quotas.waiters.Front(); e != nil; {
		next := e.Next()
		wt := e.Value.(*waiter)
		if len(wt.l.charges) > 0 {
			r.unwait(wt)
			wt.ch <- acquireResult{err: errQuotaUnavailable}
		}
		e = next
	}
}

var errQuotaUnavailable = &cheetah.Error{Code: cheetah.CodeQuotaUnavailable,
	Message: "the quota file could not be loaded; acquires it governs are refused until a good one is"}

// governing fills l.charges with the quotas that govern req, off the lock,
// from the set in force when it is read; quotaAdmit checks it is still so.
func (r *Registry) governing(l *lease, req *cheetah.AcquireRequest) {
	s := r.qset.Load()
	l.qset = s
	l.charges = s.Governing(l.govBuf[:0], req.ClientType, req.Labels)
	l.tenant, l.reqLabels = req.TenantID, req.Labels
}

// quotaAdmit checks that l, to be made for req, finds a free slot at every
// level of every quota that governs it, narrow to wide; r.mu is held.
func (r *Registry) quotaAdmit(l *lease, req *cheetah.AcquireRequest) error {
	q := &r.quotas
	if l.qset != q.set {
		// The quotas were reloaded since governing ran: rare.
		l.qset = q.set
		l.charges = q.set.Governing(l.charges[:0], req.ClientType, req.Labels)
	}
	if len(l.charges) == 0 {
		return nil
	}
	if q.broken != nil {
		return errQuotaUnavailable
	}
	for _, level := range quota.Levels {
		for _, i := range l.charges {
			qt := q.set.Quotas[i]
			limit := qt.CapsFor(l.tenant).Of(level)
			if limit == 0 {
				continue
			}
			if used := q.uses[i].used(level, l.tenant, req.UserID); used >= limit {
				return &cheetah.NoContextError{Reason: cheetah.ReasonQuotaExceeded,
					Quota: &cheetah.QuotaFull{Quota: qt.Name, Level: string(level), Used: used, Cap: limit}}
			}
		}
	}
	return nil
}

// charge counts l's slots; r.mu is held and l was just made live.
func (r *Registry) charge(l *lease) {
	l.held = l.heldBuf[:0]
	for _, i := range l.charges {
		l.held = append(l.held, r.quotas.uses[i].take(l.tenant, l.ctx.client.pool.userID))
	}
}

// discharge gives l's slots back and hands them to waiting acquires; r.mu
// is held and l just ended.
func (r *Registry) discharge(l *lease) {
	if len(l.charges) == 0 {
		return
	}
	for k, i := range l.charges {
		r.quotas.uses[i].give(l.tenant, l.ctx.client.pool.userID, l.held[k])
	}
	clear(l.held)
	l.held = l.held[:0]
	r.slotsFreed()
}

// slotsFreed hands free slots to the waiting acquires that quotas govern,
// first come first served: the first one that passes every level and
// finds an idle context gets it; r.mu is held.
func (r *Registry) slotsFreed() {
	q := &r.quotas
	for e := q.waiters.Front(); e != nil; {
		next := e.Next()
		wt := e.Value.(*waiter)
		if r.quotaAdmit(wt.l, &wt.req) == nil {
			if w := r.pickIdle(wt.pool, &wt.req, wt.l); w != nil {
				r.unwait(wt)
				l, err := r.assign(w, &wt.req, wt.l, wt.token, r.clock.Now())
				wt.ch <- acquireResult{lease: l, err: err}
			}
		}
		e = next
	}
}

// unwait takes wt off its pool's waiters and the quota waiters; r.mu is
// held.
func (r *Registry) unwait(wt *waiter) {
	if wt.elem != nil {
		wt.pool.waiters.Remove(wt.elem)
		wt.elem = nil
	}
	if wt.qelem != nil {
		r.quotas.waiters.Remove(wt.qelem)
		wt.qelem = nil
	}
}

// QuotasView is GET /api/v1/admin/quotas: each quota as merged with its
// overrides, its occupancy per level and scope, and its holders.
type QuotasView struct {
	// Broken is why the last load failed, while it did: acquires the
	// quotas govern are refused with quota_unavailable meanwhile.
	Broken string      `json:"broken,omitempty"`
	Quotas []QuotaView `json:"quotas"`
}

// QuotaView is one quota in QuotasView.
type QuotaView struct {
	quota.Quota
	Occupancy QuotaOccupancy  `json:"occupancy"`
	Holders   []cheetah.Lease `json:"holders"`
}

// QuotaOccupancy is a quota's slots in use per level and scope.
type QuotaOccupancy struct {
	Global  ScopeUse   `json:"global"`
	Tenants []ScopeUse `json:"tenants"`
	Users   []ScopeUse `json:"users"`
}

// ScopeUse is one scope's slots in use and cap (0: no cap).
type ScopeUse struct {
	TenantID string `json:"tenant_id,omitempty"`
	UserID   string `json:"user_id,omitempty"`
	Used     int    `json:"used"`
	Cap      int    `json:"cap"`
}

// Quotas returns the quotas in force and their occupancy. Holders are lease
// views without tokens.
func (r *Registry) Quotas() QuotasView {
	r.mu.Lock()
	q := &r.quotas
	v := QuotasView{Quotas: make([]QuotaView, q.set.Len())}
	if q.broken != nil {
		v.Broken = q.broken.Error()
	}
	for i := range v.Quotas {
		qt := q.set.Quotas[i]
		u := &q.uses[i]
		qv := QuotaView{Quota: *qt, Holders: []cheetah.Lease{},
			Occupancy: QuotaOccupancy{Global: ScopeUse{Used: u.global, Cap: qt.Caps.Global}, Tenants: []ScopeUse{}, Users: []ScopeUse{}}}
		for t, c := range u.tenants {
			qv.Occupancy.Tenants = append(qv.Occupancy.Tenants, ScopeUse{TenantID: t, Used: c.n, Cap: qt.CapsFor(t).Tenant})
		}
		for s, c := range u.users {
			qv.Occupancy.Users = append(qv.Occupancy.Users, ScopeUse{TenantID: s.tenant, UserID: s.user, Used: c.n, Cap: qt.CapsFor(s.tenant).User})
		}
		v.Quotas[i] = qv
	}
	for _, l := range r.leases {
		for _, i := range l.charges {
			v.Quotas[i].Holders = append(v.Quotas[i].Holders, l.view(""))
		}
	}
	r.mu.Unlock()
	for i := range v.Quotas {
		qv := &v.Quotas[i]
		sort.Slice(qv.Occupancy.Tenants, func(a, b int) bool { return qv.Occupancy.Tenants[a].TenantID < qv.Occupancy.Tenants[b].TenantID })
		sort.Slice(qv.Occupancy.Users, func(a, b int) bool {
			x, y := qv.Occupancy.Users[a], qv.Occupancy.Users[b]
			return x.TenantID < y.TenantID || x.TenantID == y.TenantID && x.UserID < y.UserID
		})
		sort.Slice(qv.Holders, func(a, b int) bool { return qv.Holders[a].Epoch < qv.Holders[b].Epoch })
	}
	return v
}

// slots counts the slots in use at every level and scope; r.mu is held.
func (q *quotaState) slots() int {
	n := 0
	for i := range q.uses {
		u := &q.uses[i]
		n += u.global
		for _, c := range u.tenants {
			n += c.n
		}
		for _, c := range u.users {
			n += c.n
		}
	}
	return n
}

// quotaGauge is one quota level's occupancy, for the metrics.
type quotaGauge struct {
	quota, level string
	used, full   int // used: the fullest scope's; full: scopes at their cap
}

// quotaGauges reads the occupancy of every quota level, once per metrics
// collection, never on a request's path.
func (r *Registry) quotaGauges() []quotaGauge {
	r.mu.Lock()
	defer r.mu.Unlock()
	q := &r.quotas
	out := make([]quotaGauge, 0, 3*q.set.Len())
	for i := 0; i < q.set.Len(); i++ {
		qt, u := q.set.Quotas[i], &q.uses[i]
		g := quotaGauge{quota: qt.Name, level: string(quota.Global), used: u.global}
		if qt.Caps.Global > 0 && u.global >= qt.Caps.Global {
			g.full = 1
		}
		t := quotaGauge{quota: qt.Name, level: string(quota.Tenant)}
		for tenant, sc := range u.tenants {
			t.used = max(t.used, sc.n)
			if c := qt.CapsFor(tenant).Tenant; c > 0 && sc.n >= c {
				t.full++
			}
		}
		us := quotaGauge{quota: qt.Name, level: string(quota.User)}
		for s, sc := range u.users {
			us.used = max(us.used, sc.n)
			if c := qt.CapsFor(s.tenant).User; c > 0 && sc.n >= c {
				us.full++
			}
		}
		out = append(out, us, t, g)
	}
	return out
}
