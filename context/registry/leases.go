package registry

import (
	"container/heap"
	"container/list"
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/protocol"
)

// lease is one context assigned to one task.
type lease struct {
	key        tokenKey // the digest of its token; the token itself is not kept
	ctx        *wctx
	taskID     string
	epoch      int64
	ttl        time.Duration
	expiresAt  time.Time
	renewOnUse bool
	// clearState asks the client to clear the context when the lease
	// begins and when it ends (AcquireRequest.ClearState).
	clearState bool
	// generation counts the claims of its row (durable_leases.go): each
	// replica it moves to claims the row with one more, so that two claims
	// that commit out of order leave it the later holder's.
	generation int64
	// preserve counts send_and_wait calls in flight whose callers still wait:
	// while it is above zero the lease cannot expire (invariant 5).
	preserve  int
	heapIndex int // -1 when not in the heap
	// acquired is the span context of the acquire that made the lease; the
	// spans of its commands link to it.
	acquired trace.SpanContext
	// With Config.DurableLeases (durable_leases.go): stored is the expiry
	// its row holds; durable hears of the commit of its first row, and
	// gone of the commit of its deletion.
	stored        time.Time
	durable, gone chan error
	// untold marks a lease whose client is not told of it yet: with
	// durable leases the assigned notice waits for the row, as the
	// acquire's answer does (awaitLeaseRow).
	untold bool
	placement
	// webhook and webhookKey are the acquire's lease_webhook and the key
	// that signs it: LeaseEnded carries them, for the lease.lost delivery.
	webhook, webhookKey string
}

// endedLease is what the registry remembers of a lease that ended, to tell a
// late user why. It is small and holds one pointer: the memory of ended
// leases is large (EndedMax) and written on every release (ended.go).
type endedLease struct {
	at     *ctxIdent // where it was
	reason endReason
}

// endReason is how a lease ended, in a byte: see endReasons.
type endReason uint8

// endReasons are the reasons a lease ends with, by endReason.
var endReasons = [...]cheetah.LostReason{cheetah.LostReleased, cheetah.LostExpired, cheetah.LostRevoked, cheetah.LostContextGone}

func endReasonOf(r cheetah.LostReason) endReason {
	for i, x := range endReasons {
		if x == r {
			return endReason(i)
		}
	}
	panic(fmt.Sprintf("registry: a lease cannot end with reason %q", r))
}

// endedKey is how the memory of ended leases knows a lease: the first half
// of its token's digest. 128 bits tell apart the leases it remembers as
// surely as 256, in half the memory (it is the registry's largest).
type endedKey [16]byte

func (k tokenKey) ended() (e endedKey) {
	copy(e[:], k[:16])
	return e
}

// ctxIdent names a context, shared by every ended lease of it.
type ctxIdent struct {
	userID, clientID, contextID string
	// left says the context left this registry with its client, handed
	// over to another replica or forgotten by a fenced one, while it lives
	// on elsewhere: what it is now is not known here; r.mu guards it.
	left bool
}

// leave takes w out of this registry without ending its lease, which
// lives on elsewhere: its client went to another replica (HandOver), or
// this one was fenced (Forget). The leases of w that ended here become
// those of a context it no longer knows; r.mu is held.
func (r *Registry) leave(w *wctx) {
	if l := w.lease; l != nil {
		delete(r.leases, l.key)
		if l.heapIndex >= 0 {
			heapRemove(r, l)
		}
		w.lease = nil
	}
	w.live = false
	r.refreshIdle(w)
	if w.ident != nil {
		w.ident.left = true
	}
	delete(w.client.contexts, w.id)
}

// identOf returns w's ident, made once per context; r.mu is held.
func identOf(w *wctx) *ctxIdent {
	if w.ident == nil {
		w.ident = &ctxIdent{userID: w.client.pool.userID, clientID: w.client.id, contextID: w.id}
	}
	return w.ident
}

type waiter struct {
	req   cheetah.AcquireRequest
	token string
	l     *lease             // the lease it will get, made off the lock
	ch    chan acquireResult // buffered: the hand-off never blocks
	elem  *list.Element
	pool  *pool
	// qelem is its place among the quota waiters, when a quota governs it.
	qelem *list.Element
	// standIn: it waits for an acquire another replica admitted
	// (AcquireStandIn), which the views count there, not here.
	standIn bool
}

type acquireResult struct {
	lease cheetah.Lease
	err   error
}

// view describes l. token is the lease's token where the caller holds it
// (it is not kept), and empty otherwise.
func (l *lease) view(token string) cheetah.Lease {
	w := l.ctx
	v := cheetah.Lease{
		UserID: w.client.pool.userID, ClientID: w.client.id, ContextID: w.id,
		ClientType: w.client.typ, TaskID: l.taskID, Epoch: l.epoch,
		TTLSeconds: int(l.ttl / time.Second), ExpiresAt: l.expiresAt.UTC(), LeaseToken: token,
		RenewOnUse: l.renewOnUse, ClearState: l.clearState,
	}
	l.placement.describe(&v)
	if h := w.hold; h != nil {
		v.Held = h.info()
	}
	return v
}

// Acquire assigns an idle context to req.TaskID: the one idle the longest
// among those that match. With req.Wait it waits, first come first served.
//
// While the store's database does not answer, Acquire fails closed with
// store_unavailable, although a lease needs no write (its epoch comes from a
// block reserved earlier): no send could use the lease meanwhile, and an
// application is better told at once that the broker cannot work than
// handed a lease that fails on first use.
func (r *Registry) Acquire(ctx context.Context, req cheetah.AcquireRequest) (cheetah.Lease, error) {
	return r.acquireAs(ctx, req, false)
}

// AcquireStandIn is Acquire for an acquire that another replica admitted
// and that waits in every replica's queue at once (DESIGN §9): it takes its
// place in this registry's first-come-first-served order like any other,
// but the views and gauges that count waiting acquires leave it out, since
// the replica that admitted it counts it.
func (r *Registry) AcquireStandIn(ctx context.Context, req cheetah.AcquireRequest) (cheetah.Lease, error) {
	return r.acquireAs(ctx, req, true)
}

func (r *Registry) acquireAs(ctx context.Context, req cheetah.AcquireRequest, standIn bool) (cheetah.Lease, error) {
	ctx, span := r.tel.startAcquire(ctx)
	forgets := r.forgets.Load()
	l, err := r.acquire(ctx, &req, span.SpanContext(), standIn)
	switch {
	case err == nil && r.cfg.DurableLeases:
		l, err = r.awaitLeaseRow(ctx, l, forgets)
	case errors.Is(err, cheetah.ErrNoContextAvailable):
		err = r.showing(ctx, err)
	}
	r.tel.acquired(ctx, span, &req, l, err)
	return l, err
}

// awaitLeaseRow returns l once its row is durable, so that no replica's
// death can lose a lease an acquire returned; a lease whose row could not
// be written is given back. An acquire begun when Forgets said forgets
// that the registry forgot since (the replica fenced; the lease may be
// gone, or adopted elsewhere from its row) is not known to hold its
// lease: store_unavailable.
func (r *Registry) awaitLeaseRow(ctx context.Context, l cheetah.Lease, forgets uint64) (cheetah.Lease, error) {
	key := keyOf(l.LeaseToken) // off the lock
	r.mu.Lock()
	ll := r.leases[key]
	r.mu.Unlock()
	var ch chan error
	if ll != nil {
		ch = ll.durable
	}
	err := awaitStored(ctx, ch)
	if err == nil && r.forgets.Load() != forgets {
		err = errFencedBeforeDurable
	}
	if err != nil {
		_, _ = r.Release(context.WithoutCancel(ctx), l)
		return cheetah.Lease{}, err
	}
	if ll != nil {
		r.mu.Lock()
		if r.leases[key] == ll { // not ended meanwhile
			r.tellAssigned(ll)
		}
		r.mu.Unlock()
	}
	return l, nil
}

func (r *Registry) acquire(ctx context.Context, req *cheetah.AcquireRequest, sc trace.SpanContext, standIn bool) (cheetah.Lease, error) {
	if err := normalizeAcquire(req, r.cfg.DefaultTTL); err != nil {
		return cheetah.Lease{}, err
	}
	if err := r.store.Health(); err != nil {
		return cheetah.Lease{}, fmt.Errorf("registry: acquire: %w", err)
	}
	// The token, its digest and the lease are made off the lock.
	token := newToken(r.cfg.TokenTag)
	nl := &lease{key: keyOf(token), heapIndex: -1, acquired: sc}
	r.governing(nl, req)
	var cr *creation
	if req.Create != nil {
		cr = newCreation(req, nl, r.cfg.TokenTag)
	}
	r.mu.Lock()
	var p *pool
	var deadline time.Time // of the wait for epochs, once one was needed
	quotaFull := false
	for {
		if r.draining {
			r.mu.Unlock()
			return cheetah.Lease{}, errShuttingDown
		}
		p = r.poolFor(req.UserID)
		if qerr := r.quotaAdmit(nl, req); qerr != nil {
			if req.Wait <= 0 || !errors.Is(qerr, cheetah.ErrNoContextAvailable) {
				r.dropPoolIfEmpty(p)
				r.mu.Unlock()
				return cheetah.Lease{}, qerr
			}
			quotaFull = true
			break
		}
		w := r.pickIdle(p, req, nl)
		if w == nil {
			break
		}
		l, err := r.assign(w, req, nl, token, r.clock.Now())
		if err != nil && r.awaitEpochs(ctx, &deadline) {
			// The block ran out under a burst: the next one was being
			// reserved, and is now at hand.
			continue
		}
		r.mu.Unlock()
		return l, err
	}
	if req.Create != nil && !quotaFull {
		// Nothing idle: a client is asked to open a context (create.go).
		return r.startCreation(ctx, p, cr)
	}
	if req.Wait <= 0 {
		err := r.miss(p, req, nl)
		r.dropPoolIfEmpty(p)
		r.mu.Unlock()
		return cheetah.Lease{}, err
	}
	wt := &waiter{req: *req, token: token, l: nl, ch: make(chan acquireResult, 1), pool: p, standIn: standIn}
	wt.elem = p.waiters.PushBack(wt)
	if len(nl.charges) > 0 {
		wt.qelem = r.quotas.waiters.PushBack(wt)
	}
	r.mu.Unlock()

	t := r.clock.NewTimer(req.Wait)
	defer t.Stop()
	var cause error
	select {
	case res := <-wt.ch:
		return res.lease, res.err
	case <-t.Chan():
	case <-ctx.Done():
		cause = ctx.Err()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if wt.elem == nil {
		// A context was handed over just as the wait ended.
		return r.settleWait(<-wt.ch, cause)
	}
	r.unwait(wt)
	if cause != nil {
		r.dropPoolIfEmpty(p)
		return cheetah.Lease{}, cause
	}
	err := r.miss(p, req, nl)
	r.dropPoolIfEmpty(p)
	return cheetah.Lease{}, err
}

// settleWait is the outcome of a wait that was handed res: a lease that a
// caller who went away (gone is why) would never learn of goes back at
// once; r.mu is held.
func (r *Registry) settleWait(res acquireResult, gone error) (cheetah.Lease, error) {
	if gone != nil && res.err == nil {
		r.release(keyOf(res.lease.LeaseToken), res.lease)
		return cheetah.Lease{}, gone
	}
	return res.lease, res.err
}

// miss is why nothing could be assigned to req: a full quota first, then
// missReason; r.mu is held.
func (r *Registry) miss(p *pool, req *cheetah.AcquireRequest, l *lease) error {
	if err := r.quotaAdmit(l, req); err != nil {
		return err
	}
	return &cheetah.NoContextError{Reason: r.missReason(p, req)}
}

func normalizeAcquire(req *cheetah.AcquireRequest, defaultTTL time.Duration) error {
	if err := cheetah.CheckID("user_id", req.UserID); err != nil {
		return err
	}
	if err := cheetah.CheckTaskID("task_id", req.TaskID); err != nil {
		return err
	}
	if req.ClientType == "" {
		req.ClientType = cheetah.Browser
	}
	if !req.ClientType.Valid() {
		return cheetah.Invalidf("client_type must be browser or console")
	}
	if req.ClientID != "" {
		if err := cheetah.CheckID("client_id", req.ClientID); err != nil {
			return err
		}
	}
	if err := cheetah.CheckLabels("labels", req.Labels); err != nil {
		return err
	}
	switch {
	case req.TTL == 0:
		req.TTL = defaultTTL
	case !validTTL(req.TTL):
		return cheetah.Invalidf("%s", cheetah.MsgTTL)
	}
	if req.Wait < 0 || req.Wait > MaxWait {
		return cheetah.Invalidf("%s", cheetah.MsgWait)
	}
	if req.Create != nil {
		c := *req.Create // the caller's stays as it was
		req.Create = &c
	}
	if err := cheetah.CheckPlacement(req); err != nil {
		return err
	}
	if req.TenantID == "" {
		req.TenantID = cheetah.DefaultTenant
	}
	return nil
}

// validTTL reports whether d is a lease TTL an acquire or renew may ask for.
func validTTL(d time.Duration) bool {
	return d >= MinTTL && d <= MaxTTL && d%time.Second == 0
}

// pickIdle returns the context to assign to req, to become l: with an
// affinity key, the longest-idle matching one whose last lease carried it,
// else the longest-idle matching one; r.mu is held.
func (r *Registry) pickIdle(p *pool, req *cheetah.AcquireRequest, l *lease) *wctx {
	lst := p.idle[req.ClientType]
	if lst == nil {
		return nil
	}
	if req.AffinityKey != "" {
		if w := lst.affine(req); w != nil {
			l.affinity = affinityHit
			return w
		}
		l.affinity = affinityMiss
	}
	for w := lst.head; w != nil; w = w.idleNext {
		if w.matches(req) {
			return w
		}
	}
	return nil
}

// missReason says why nothing matched req; r.mu is held.
func (r *Registry) missReason(p *pool, req *cheetah.AcquireRequest) cheetah.NoContextReason {
	connected, placed := false, false
	for _, c := range p.clients {
		if c.conn == nil || c.typ != req.ClientType {
			continue
		}
		connected = true
		for _, w := range c.contexts {
			if w.live && w.owner == cheetah.OwnerWorker && w.matches(req) {
				placed = true
			}
		}
	}
	switch {
	case !connected:
		return cheetah.ReasonNoEligibleClient
	case !placed && (req.ClientID != "" || len(req.Labels) > 0):
		return cheetah.ReasonPlacementMiss
	}
	return cheetah.ReasonNoIdleWorker
}

// assign gives idle context w the new lease l, made off the lock with its
// key and span (token is the one whose digest l.key is); r.mu is held.
func (r *Registry) assign(w *wctx, req *cheetah.AcquireRequest, l *lease, token string, now time.Time) (cheetah.Lease, error) {
	epoch, err := r.nextEpochAbove(max(w.lastEpoch, w.client.epochFloor))
	if err != nil {
		return cheetah.Lease{}, err
	}
	l.ctx, l.taskID, l.epoch, l.ttl = w, req.TaskID, epoch, req.TTL
	w.lastEpoch = epoch
	l.expiresAt, l.renewOnUse = now.Add(req.TTL), req.RenewOnUse == nil || *req.RenewOnUse
	l.webhook, l.webhookKey, l.clearState = req.LeaseWebhook, req.LeaseWebhookKeyID, req.ClearState
	w.lease = l
	w.affinityKey = req.AffinityKey
	r.charge(l)
	r.refreshIdle(w)
	r.leases[l.key] = l
	r.pushDeadline(l)
	r.storeNew(l)
	if !l.untold {
		r.notify(w, assignedNotice(l, true))
	}
	ev := leaseEvent(LeaseAcquired, l)
	ev.At = now
	r.emit(ev)
	return l.view(token), nil
}

// endLease ends l for reason; r.mu is held. The context becomes idle again
// if it still can be. Work already dispatched keeps running (invariant 4).
func (r *Registry) endLease(l *lease, reason cheetah.LostReason) {
	w := l.ctx
	if w.lease != l {
		return
	}
	delete(r.leases, l.key)
	if l.heapIndex >= 0 {
		heap.Remove(&r.heap, l.heapIndex)
	}
	w.lease = nil
	r.storeGone(l)
	now := r.clock.Now()
	ev := leaseEvent(LeaseEnded, l)
	ev.Reason, ev.At = reason, now
	ev.LeaseWebhook, ev.LeaseWebhookKeyID = l.webhook, l.webhookKey
	r.emit(ev)
	r.endedLeases.add(l.key.ended(), endedLease{at: identOf(w), reason: endReasonOf(reason)}, now)
	if !l.untold {
		// A lease its client never heard of ends unheard of too.
		r.notify(w, protocol.Assignment{ContextID: w.id, TaskID: l.taskID, Epoch: l.epoch, State: protocol.AssignmentState(reason),
			ClearState: l.clearState})
	}
	r.discharge(l) // after the event: a slot it frees goes to the next lease
	r.refreshIdleAt(w, now)
}

// check finds the active lease of handle h and confirms its context is live
// and worker-owned; r.mu is held. This is the ownership check of invariant 2.
func (r *Registry) check(h cheetah.Lease) (*lease, error) {
	return r.checkKey(keyOf(h.LeaseToken), h)
}

// checkKey is check with the digest of h's token made off the lock.
func (r *Registry) checkKey(key tokenKey, h cheetah.Lease) (*lease, error) {
	l, err := r.checkLease(key, h)
	if err != nil {
		if ll, ok := err.(*cheetah.LeaseLostError); ok {
			r.tel.lost(ll.Reason)
		}
	}
	return l, err
}

func (r *Registry) checkLease(key tokenKey, h cheetah.Lease) (*lease, error) {
	l := r.leases[key]
	if l == nil {
		return nil, &cheetah.LeaseLostError{Reason: r.lostReason(key)}
	}
	if !sameHolder(l, h) {
		// A token presented with another lease's identity is not this lease.
		return nil, &cheetah.LeaseLostError{Reason: cheetah.LostUnknownLease}
	}
	switch w := l.ctx; {
	case !w.live:
		return nil, &cheetah.LeaseLostError{Reason: cheetah.LostNotLive}
	case w.owner != cheetah.OwnerWorker:
		return nil, &cheetah.LeaseLostError{Reason: cheetah.LostNotWorker}
	}
	return l, nil
}

// sameHolder compares what the handle says of itself with the lease. Remote
// callers present only the token, so empty fields match.
func sameHolder(l *lease, h cheetah.Lease) bool {
	w := l.ctx
	return (h.UserID == "" || h.UserID == w.client.pool.userID) &&
		(h.ClientID == "" || h.ClientID == w.client.id) &&
		(h.ContextID == "" || h.ContextID == w.id) &&
		(h.TaskID == "" || h.TaskID == l.taskID) &&
		(h.Epoch == 0 || h.Epoch == l.epoch)
}

// lostReason describes, for a token that carries no active lease, its
// context as it is now: first match wins; r.mu is held.
func (r *Registry) lostReason(key tokenKey) cheetah.LostReason {
	e, ok := r.endedLeases.get(key.ended())
	if !ok {
		return cheetah.LostUnknownLease
	}
	w := r.findContext(e.at.userID, e.at.clientID, e.at.contextID)
	switch {
	case w == nil && e.at.left:
		// Its context went on elsewhere: this registry can no more say
		// what it is now than one that never issued the lease.
		return cheetah.LostUnknownLease
	case w == nil:
		return cheetah.LostContextGone
	case !w.live:
		return cheetah.LostNotLive
	case w.owner != cheetah.OwnerWorker:
		return cheetah.LostNotWorker
	case w.lease != nil, w.awaiting:
		// A context that waits for its lease from another replica carries
		// a lease too, only not one held here yet.
		return cheetah.LostReassigned
	}
	return endReasons[e.reason]
}

// Renew extends the lease from now by ttl, or by its own TTL when ttl is
// zero, after the same ownership check as a send.
func (r *Registry) Renew(ctx context.Context, h cheetah.Lease, ttl time.Duration) (cheetah.Lease, error) {
	if ttl != 0 && !validTTL(ttl) {
		return cheetah.Lease{}, cheetah.Invalidf("%s", cheetah.MsgTTL)
	}
	key := keyOf(h.LeaseToken) // off the lock
	r.mu.Lock()
	l, err := r.checkKey(key, h)
	if err != nil {
		r.mu.Unlock()
		return cheetah.Lease{}, r.showing(ctx, err)
	}
	if ttl != 0 {
		l.ttl = ttl
	}
	r.extend(l, r.clock.Now())
	r.emit(leaseEvent(LeaseRenewed, l))
	view := l.view(h.LeaseToken)
	r.mu.Unlock()
	return view, nil
}

// extend moves l's deadline to now + its TTL; r.mu is held.
func (r *Registry) extend(l *lease, now time.Time) {
	l.expiresAt = now.Add(l.ttl)
	r.storeExpiry(l)
	if l.heapIndex >= 0 {
		heap.Fix(&r.heap, l.heapIndex)
		r.wakeExpiryFor(l) // a shorter TTL can bring the deadline forward
	} else if l.preserve == 0 {
		r.pushDeadline(l)
	}
}

// Release clears the lease if its context still carries it, live or not.
// It reports whether it did; it never fails with lease_lost.
func (r *Registry) Release(ctx context.Context, h cheetah.Lease) (bool, error) {
	key := keyOf(h.LeaseToken) // off the lock
	forgets := r.forgets.Load()
	r.mu.Lock()
	l := r.leases[key]
	released := r.release(key, h)
	r.mu.Unlock()
	r.endedLeases.fold()
	if released {
		// With durable leases, a release is told once no replica could
		// bring the lease back from its row.
		if err := awaitStored(ctx, l.gone); err != nil {
			return true, err
		}
		return true, r.endsStand(ctx, forgets, key)
	}
	return false, r.showing(ctx, nil)
}

// release ends the lease of digest key if h holds it; r.mu is held.
func (r *Registry) release(key tokenKey, h cheetah.Lease) bool {
	l := r.leases[key]
	if l == nil || !sameHolder(l, h) {
		return false
	}
	r.endLease(l, cheetah.LostReleased)
	return true
}

// ReleaseAll releases every token and returns how many leases it cleared,
// once their rows are deleted (with durable leases), as Release does.
func (r *Registry) ReleaseAll(ctx context.Context, tokens []string) (int, error) {
	keys := make([]tokenKey, len(tokens))
	for i, t := range tokens {
		keys[i] = keyOf(t)
	}
	forgets := r.forgets.Load()
	r.mu.Lock()
	var released []tokenKey
	for i := range tokens {
		if r.release(keys[i], cheetah.Lease{LeaseToken: tokens[i]}) {
			released = append(released, keys[i])
		}
	}
	r.mu.Unlock()
	r.endedLeases.fold()
	// Told once the rows of what it released (the last lease rows written
	// when it decided), and of what it found ended, are deleted.
	if err := r.leaseRowsDurable(ctx); err != nil {
		return 0, err
	}
	if err := r.endsStand(ctx, forgets, released...); err != nil {
		return 0, err
	}
	return len(released), nil
}

// errLeaseElsewhere answers a revoke of a context that waits for its lease
// from another replica, or whose client's leases are moving (Moving): there
// may be a lease, but not one this replica can end now.
var errLeaseElsewhere = cheetah.StoreUnavailable("registry: revoke",
	errors.New("the context's lease is held by another replica, or on its way between replicas; try again shortly"))

// Revoke ends the lease on a context, if any, with reason revoked, and tells
// the client. It reports whether there was one; a context that waits for
// its lease from another replica, or whose client's leases are moving
// here or away, answers store_unavailable. With durable leases, as a
// release, it returns once the lease's row is deleted, so that no replica's
// death can bring a revoked lease back.
func (r *Registry) Revoke(ctx context.Context, userID, clientID, contextID string) (bool, error) {
	forgets := r.forgets.Load()
	r.mu.Lock()
	w := r.findContext(userID, clientID, contextID)
	if w == nil || w.lease == nil {
		elsewhere := w != nil && w.awaiting || r.moving[[2]string{userID, clientID}] > 0
		r.mu.Unlock()
		if elsewhere {
			return false, errLeaseElsewhere
		}
		return false, r.showing(ctx, nil)
	}
	l := w.lease
	r.endLease(l, cheetah.LostRevoked)
	r.mu.Unlock()
	r.endedLeases.fold()
	if err := awaitStored(ctx, l.gone); err != nil {
		return true, err
	}
	return true, r.endsStand(ctx, forgets, l.key)
}

func (r *Registry) findContext(userID, clientID, contextID string) *wctx {
	if p := r.users[userID]; p != nil {
		if c := p.clients[clientID]; c != nil {
			return c.contexts[contextID]
		}
	}
	return nil
}

// The deadline heap: etcd's lessor keeps leases the same way, so the next
// expiry is found in O(log n).
type leaseHeap []*lease

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].expiresAt.Before(h[j].expiresAt) }
func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIndex, h[j].heapIndex = i, j
}
func (h *leaseHeap) Push(x any) {
	l := x.(*lease)
	l.heapIndex = len(*h)
	*h = append(*h, l)
}
func (h *leaseHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	l.heapIndex = -1
	*h = old[:len(old)-1]
	return l
}

// pushDeadline puts l in the heap; r.mu is held.
func (r *Registry) pushDeadline(l *lease) {
	heap.Push(&r.heap, l)
	r.wakeExpiryFor(l)
}

// wakeExpiryFor kicks the expiry loop if l's deadline comes before the
// loop's next wake-up; r.mu is held. A later deadline waits for that
// wake-up, so a lease back in the heap at the end of each of its commands
// (renewed, later than before) wakes nobody.
func (r *Registry) wakeExpiryFor(l *lease) {
	if r.expiryWake.IsZero() || l.expiresAt.Before(r.expiryWake) {
		r.expiryWake = l.expiresAt // the loop, kicked, wakes by then
		kick(r.kick)
	}
}

// ExpireDue ends every lease whose deadline has passed and that no admitted
// work preserves, and returns the next deadline (zero when none). The expiry
// loop calls it; tests call it after moving a fake clock.
func (r *Registry) ExpireDue() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock.Now()
	r.expiryWake = time.Time{}
	for len(r.heap) > 0 {
		l := r.heap[0]
		if l.expiresAt.After(now) {
			r.expiryWake = l.expiresAt
			return l.expiresAt
		}
		heap.Pop(&r.heap)
		if l.preserve > 0 {
			// Admitted work holds it; it re-enters the heap when that ends.
			continue
		}
		r.endLease(l, cheetah.LostExpired)
	}
	return time.Time{}
}

// expiryLoop sleeps until the earliest deadline, or a minute at most, and
// expires what is due. A new earliest deadline wakes it through kick.
func (r *Registry) expiryLoop() {
	defer close(r.done)
	t := r.clock.NewTimer(time.Minute)
	defer t.Stop()
	for {
		next := r.ExpireDue()
		r.endedLeases.fold() // what expired, off the lock; PruneMemory folds the rest under it
		r.PruneMemory()
		wait := time.Minute
		if !next.IsZero() {
			wait = min(max(next.Sub(r.clock.Now()), 0), time.Minute)
		}
		t.Reset(wait)
		select {
		case <-r.stop:
			return
		case <-r.kick:
		case <-t.Chan():
		}
	}
}

func heapRemoveAt(h *leaseHeap, i int) { heap.Remove(h, i) }
