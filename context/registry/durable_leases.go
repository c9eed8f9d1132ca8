package registry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/protocol"
)

// With Config.DurableLeases every lease has a row in the store, written in
// the registry's decision order through the outbox: when a lease is made
// (the acquire returns once that row is durable), when its expiry moves
// more than half its TTL past the row's, when it moves here with its
// client, and when it ends (deleted; a release returns once the deletion is
// durable). The row's expiry is never later than the lease's, so a lease
// whose replica died comes back, if at all, with no more time than it had.

// rowOf is l's row.
func rowOf(l *lease) history.PutLease {
	w := l.ctx
	return history.PutLease{TokenDigest: l.key, UserID: w.client.pool.userID, ClientID: w.client.id, ContextID: w.id,
		TaskID: l.taskID, Epoch: l.epoch, TTL: l.ttl, RenewOnUse: l.renewOnUse, ClearState: l.clearState, ExpiresAt: l.expiresAt,
		Generation: l.generation}
}

// storeNew writes a new lease's row; r.mu is held.
func (r *Registry) storeNew(l *lease) {
	if !r.cfg.DurableLeases {
		return
	}
	ch := make(chan error, 1)
	l.durable, l.stored, l.untold = ch, l.expiresAt, true
	r.lastLeaseRow = ch
	row := rowOf(l)
	row.Kind = history.LeaseNew
	r.write(func(err error) { ch <- err }, row)
}

// storeExpiry writes l's expiry when it moved more than half its TTL past
// the row's, or before it (a renew to a shorter TTL); r.mu is held.
func (r *Registry) storeExpiry(l *lease) {
	if d := l.expiresAt.Sub(l.stored); !r.cfg.DurableLeases || (d >= 0 && d <= l.ttl/2) {
		return
	}
	l.stored = l.expiresAt
	r.write(nil, rowOf(l))
}

// storeMoved claims the row of a lease that came here with its client, or
// that this replica adopted; r.mu is held.
func (r *Registry) storeMoved(l *lease) {
	if !r.cfg.DurableLeases {
		return
	}
	l.stored = l.expiresAt
	row := rowOf(l)
	row.Kind = history.LeaseClaim
	r.write(nil, row)
}

// storeGone deletes an ended lease's row; r.mu is held.
func (r *Registry) storeGone(l *lease) {
	if !r.cfg.DurableLeases {
		return
	}
	ch := make(chan error, 1)
	l.gone, r.lastLeaseRow = ch, ch
	r.write(func(err error) { ch <- err }, history.DeleteLease{TokenDigest: l.key})
}

// tellAssigned tells l's client of l, once its row is durable, unless it
// was told already; l is active, and r.mu is held.
//
// Until then the client is not told: a replica that died before the row
// committed would have shown the client an epoch that no other replica
// knows, and the lease the context carries there (one ended here in memory
// only, adopted back from its row) is older. The client would see epochs go
// back. The acquire answers only after this, so the notice still comes
// before any command of the lease.
func (r *Registry) tellAssigned(l *lease) {
	if !l.untold {
		return
	}
	l.untold = false
	if l.ctx.live {
		r.notify(l.ctx, assignedNotice(l, true))
	}
}

// assignedNotice is the assignment frame that tells a client of l: the
// first time (begins) it carries the lease's clear_state; told again (a
// reconnect, an adoption), the context is not cleared in the middle.
func assignedNotice(l *lease, begins bool) protocol.Assignment {
	return protocol.Assignment{ContextID: l.ctx.id, TaskID: l.taskID, Epoch: l.epoch, State: protocol.AssignmentAssigned,
		ClearState: begins && l.clearState}
}

// awaitStored waits for a row's commit; a nil channel (leases not durable)
// has nothing to wait for.
func awaitStored(ctx context.Context, ch chan error) error {
	if ch == nil {
		return nil
	}
	select {
	case err := <-ch:
		ch <- err // others may wait for the same commit
		if err != nil {
			return cheetah.StoreUnavailable("registry: lease row", err)
		}
		return nil
	case <-ctx.Done():
		return cheetah.StoreUnavailable("registry: lease row", fmt.Errorf("waiting for its commit: %w", ctx.Err()))
	}
}

// errFencedBeforeDurable answers a caller whose lease row committed, or
// may have, only after the registry forgot its clients (Forget, a fence
// between the decision and the commit): the others may have taken the row
// over meanwhile, so what the registry decided is not known to stand.
var errFencedBeforeDurable = cheetah.StoreUnavailable("registry: lease row",
	errors.New("this replica lost the database before the lease row was durable; try again"))

// endsStand tells a release or revoke decided when Forgets said forgets,
// whose rows' deletion committed, whether its ends stand. Unless the
// registry forgot its clients since, they do. Otherwise a deletion that
// committed after others took this replica's rows over (they reaped it, or
// it gave its rows up, and the orphans were adopted) changed nothing: an
// end stands only if no row of its lease is left.
func (r *Registry) endsStand(ctx context.Context, forgets uint64, keys ...tokenKey) error {
	if r.forgets.Load() == forgets {
		return nil
	}
	for _, k := range keys {
		held, err := r.store.LeaseRowHeld(ctx, [32]byte(k))
		if err != nil {
			return cheetah.StoreUnavailable("registry: lease row", err)
		}
		if held {
			return errFencedBeforeDurable
		}
	}
	return nil
}

// leaseRowsDurable returns once every lease row written so far, made or
// deleted, is committed, or fails with store_unavailable when the store
// cannot say so. An answer that shows other leases without writing
// anything (a lease_lost reason, no context available, a release or
// revoke that found no lease) waits for it before it is given: the
// registry decides before the store commits, and a replica that died
// between the two would leave its successors without a lease, or an end,
// that such an answer had already shown (a send told `reassigned` for a
// lease whose acquire never became durable). The store commits rows in the
// order they were written, so the last one's commit covers every one
// before it; r.mu is not held.
func (r *Registry) leaseRowsDurable(ctx context.Context) error {
	if !r.cfg.DurableLeases {
		return nil
	}
	r.mu.Lock()
	ch := r.lastLeaseRow
	r.mu.Unlock()
	if ch == nil {
		return nil
	}
	err := awaitStored(ctx, ch)
	if err == nil || ctx.Err() != nil {
		return err
	}
	// The row did not commit (the database did not answer; the store holds
	// it for later): the answer waits until the store has written
	// everything enqueued so far, held writes included, or says it cannot.
	if werr := r.store.Write(ctx); werr != nil {
		return cheetah.StoreUnavailable("registry: lease rows", werr)
	}
	return nil
}

// LeaseRowsDurable returns once every lease row written so far is
// committed (see leaseRowsDurable): for an answer outside the registry
// that shows a lease's end, as the HTTP lease wait's.
func (r *Registry) LeaseRowsDurable(ctx context.Context) error { return r.leaseRowsDurable(ctx) }

// showing returns err, an answer that shows other leases, once
// leaseRowsDurable returned, or what stopped the wait.
func (r *Registry) showing(ctx context.Context, err error) error {
	if werr := r.leaseRowsDurable(ctx); werr != nil {
		return werr
	}
	return err
}

// AdoptOrphans takes in the leases of a connected client whose replica
// died: orphaned rows this replica claimed (history.ClaimOrphanedLeases),
// at their Generation. Each goes back on its context, with its token
// digest, task, epoch and the expiry its row holds, if the context is
// here, free, and was not leased here since (a lease of a later epoch
// means the old one was lost); the client is told of it again. It returns
// how many it adopted, and what it did not take, for the caller to
// settle: everything if the client is not connected here, or if the
// registry forgot its clients since forgets (Forgets, read before the rows
// were claimed).
func (r *Registry) AdoptOrphans(forgets uint64, userID, clientID string, rows []history.PutLease) (adopted int, untaken Untaken) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.users[userID]
	if r.forgets.Load() != forgets || p == nil || p.clients[clientID] == nil || p.clients[clientID].conn == nil {
		return 0, AllBack(rows)
	}
	c := p.clients[clientID]
	for _, row := range rows {
		w := c.contexts[row.ContextID]
		key := tokenKey(row.TokenDigest)
		if l := r.leases[key]; l != nil {
			// Here already (handed over before its old replica died, whose
			// row was not rewritten yet): its row is this replica's again.
			l.generation = max(l.generation, row.Generation)
			r.storeMoved(l)
			continue
		}
		if w == nil || w.lease != nil || row.Epoch <= w.lastEpoch {
			// Not here (yet), taken, or leased here since: the last means
			// that lease was lost.
			untaken.add(key, w != nil && row.Epoch <= w.lastEpoch)
			continue
		}
		l := &lease{key: key, ctx: w, taskID: row.TaskID, epoch: row.Epoch, ttl: row.TTL,
			expiresAt: row.ExpiresAt, renewOnUse: row.RenewOnUse, clearState: row.ClearState, heapIndex: -1,
			generation: row.Generation}
		l.stored = l.expiresAt // as its row holds
		w.lease = l
		w.lastEpoch = max(w.lastEpoch, l.epoch)
		r.leases[key] = l
		r.stopAwaiting(w)
		r.pushDeadline(l)
		r.refreshIdle(w)
		if w.live {
			r.notify(w, assignedNotice(l, false))
		}
		adopted++
	}
	return adopted, untaken
}

// A client that reconnects here while the replica it left holds leases of
// its contexts and does not answer (dead, and not reaped yet, or cut off
// from this one) has those contexts wait (Adopt with HandedContext's
// AwaitUntil): leased here meanwhile, they would be leased twice, once
// that replica is reaped and its leases orphaned for adoption here.

// stopAwaiting ends w's wait for a lease held elsewhere; r.mu is held.
func (r *Registry) stopAwaiting(w *wctx) {
	if w.awaiting {
		w.awaiting = false
		delete(r.awaiting, w)
	}
}

// Awaiting returns the clients that have contexts waiting for a lease
// another replica holds, as user id and client id.
func (r *Registry) Awaiting() [][2]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[[2]string]bool{}
	var out [][2]string
	for w := range r.awaiting {
		k := [2]string{w.client.pool.userID, w.client.id}
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}

// StopAwaiting ends the wait of each context of the client that is not in
// held (the contexts whose lease another replica still holds), or whose
// wait ran out: it may be leased here again.
func (r *Registry) StopAwaiting(userID, clientID string, held []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock.Now()
	for w, until := range r.awaiting {
		if w.client.pool.userID != userID || w.client.id != clientID {
			continue
		}
		if slices.Contains(held, w.id) && now.Before(until) {
			continue
		}
		r.stopAwaiting(w)
		if r.findContext(userID, clientID, w.id) == w {
			r.refreshIdle(w)
		}
	}
}

// Connected reports whether the client is connected here.
func (r *Registry) Connected(userID, clientID string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.users[userID]
	return p != nil && p.clients[clientID] != nil && p.clients[clientID].conn != nil
}

// Forgets counts the calls of Forget so far. A hello reads it as it
// begins, before anything it reads from the database or other replicas,
// and passes it to Adopt and Connect (ClientInfo.Forgets), which take
// nothing in once it changed: a hello under way when its replica fenced
// waits out the outage in its reads and may end after the replica gave
// its rows up, while its client went elsewhere; what it read then is
// another replica's by now. AdoptOrphans takes the count of its caller's
// reads alike.
func (r *Registry) Forgets() uint64 { return r.forgets.Load() }

// ReconnectGrace is how long a disconnected client's leases survive.
func (r *Registry) ReconnectGrace() time.Duration { return r.cfg.ReconnectGrace }

// Forget drops every client, context and lease, writing no lease row: what
// a replica does once it may no longer act (fenced), since other replicas
// may take its clients and leases over from now on. Its connections are
// closed with code, which ends the commands dispatched on them
// disconnected; tokens of its leases, active or ended, then answer as
// unknown here.
//
// The replica's commands in flight are marked interrupted in history when
// it gives its rows up (history.Store.AbandonReplica) or the others reap
// it, and an end not durable yet may be written after such a mark, which
// it then leaves as it was: the caller waiting for such an end hears, once
// it is written, what history holds (command.uncertain).
func (r *Registry) Forget(code protocol.CloseCode, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forgets.Add(1)
	clear(r.awaiting)
	for _, p := range r.users {
		for _, c := range p.clients {
			if c.conn != nil {
				c.conn.Close(code, reason)
				r.detach(c)
			}
			if c.grace != nil {
				c.grace.Stop()
				c.grace = nil
			}
			for _, w := range c.contexts {
				r.leave(w)
			}
			r.dropClient(c)
		}
	}
	for c := range r.ending {
		c.uncertain.Store(true)
	}
}
