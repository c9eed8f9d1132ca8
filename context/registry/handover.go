package registry

import (
	"encoding/hex"
	"sync"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/protocol"
)

// Among the replicas of one database (DESIGN §9) a client may reconnect to
// another replica than the one that held it: through a balancer, after a
// network blip. The reconnect grace still holds there: the replica it left
// hands the client over (HandOver), the one it joined adopts it (Adopt)
// before it attaches the new connection, and the client finds its leases
// and their epochs as a reconnect to one registry would. Requests that
// still go to the replica it left (lease tokens name their replica) are
// passed on: MovedTo says where.

// HandedOver is a client as one replica hands it to another.
type HandedOver struct {
	Contexts []HandedContext `json:"contexts"`
}

// HandedContext is one context of a handed-over client, with its lease.
type HandedContext struct {
	ID     string            `json:"id"`
	TabID  string            `json:"tab_id,omitempty"`
	Owner  cheetah.Owner     `json:"owner"`
	URL    string            `json:"url,omitempty"`
	Title  string            `json:"title,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	Lease  *HandedLease      `json:"lease,omitempty"`
	// LastEpoch is the epoch of its last lease: its next is above it.
	LastEpoch int64 `json:"last_epoch,omitempty"`
	// AwaitUntil, with no Lease, says that another replica holds its lease
	// and has not handed it over: it is not leased here until then, or
	// until that lease comes here or is gone (StopAwaiting). A client
	// handed over moves on with its contexts' waits.
	AwaitUntil time.Time `json:"await_until,omitzero"`
}

// HandedLease is a lease that moves with its client. The token never
// travels: its digest does, which is how a registry knows a lease.
type HandedLease struct {
	TokenDigest string        `json:"token_digest"`
	TaskID      string        `json:"task_id"`
	Epoch       int64         `json:"epoch"`
	TTL         time.Duration `json:"ttl"`
	ExpiresAt   time.Time     `json:"expires_at"`
	RenewOnUse  bool          `json:"renew_on_use"`
	ClearState  bool          `json:"clear_state,omitempty"`
	// Generation is the claim generation of its row; the adopter claims it
	// with one more, unless Claimed.
	Generation int64 `json:"generation,omitempty"`
	// Claimed says that the adopter claimed the row already, at
	// Generation: an orphan it took (history.Store.ClaimOrphanedLeases),
	// never one handed over by another replica.
	Claimed bool `json:"-"`
	// LeaseWebhook and LeaseWebhookKeyID go with the lease, so that the
	// replica it moves to delivers its lease.lost.
	LeaseWebhook      string `json:"lease_webhook,omitempty"`
	LeaseWebhookKeyID string `json:"lease_webhook_key_id,omitempty"`
}

// HandOver gives up the client clientID of userID, which reconnected to
// the replica to: its connection, if any, is closed (4409, replaced) and
// its commands dispatched on it end disconnected, as when a newer
// connection replaces one here; its contexts and leases leave this
// registry without ending, and the leases' tokens are remembered as moved
// to to; the leases of its contexts that ended here answer unknown_lease
// from now on, as this registry no longer knows those contexts. It reports
// false when the client is not here.
func (r *Registry) HandOver(userID, clientID, to string) (HandedOver, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.users[userID]
	if p == nil || p.clients[clientID] == nil {
		return HandedOver{}, false
	}
	c := p.clients[clientID]
	if c.conn != nil {
		old := c.conn
		r.detach(c)
		old.Close(protocol.CloseReplaced, "the client connected to another replica")
	}
	now := r.clock.Now()
	out := HandedOver{Contexts: make([]HandedContext, 0, len(c.contexts))}
	for _, w := range c.contexts {
		hc := HandedContext{ID: w.id, TabID: w.tabID, Owner: w.owner, URL: w.url, Title: w.title, Labels: w.labels,
			LastEpoch: w.lastEpoch}
		if l := w.lease; l != nil {
			hc.Lease = &HandedLease{TokenDigest: hex.EncodeToString(l.key[:]), TaskID: l.taskID, Epoch: l.epoch,
				TTL: l.ttl, ExpiresAt: l.expiresAt, RenewOnUse: l.renewOnUse, ClearState: l.clearState, Generation: l.generation,
				LeaseWebhook: l.webhook, LeaseWebhookKeyID: l.webhookKey}
			r.moved.put(l.key.ended(), to, now)
		}
		if w.awaiting {
			hc.AwaitUntil = r.awaiting[w]
			r.stopAwaiting(w)
		}
		out.Contexts = append(out.Contexts, hc)
		r.leave(w)
	}
	r.dropClient(c)
	return out, true
}

// Moving marks the leases of a client as on their way here or away, until
// done is called: a hand-over from this replica (HandOver, then making
// orphans of the rows), or an adoption of rows claimed for it (a claim,
// then Adopt or AdoptOrphans). Meanwhile a lease may be in no registry
// while its row is this replica's, so a revoke that finds no lease on one
// of the client's contexts answers store_unavailable rather than "no
// lease".
func (r *Registry) Moving(userID, clientID string) (done func()) {
	k := [2]string{userID, clientID}
	r.mu.Lock()
	r.moving[k]++
	r.mu.Unlock()
	return sync.OnceFunc(func() {
		r.mu.Lock()
		if r.moving[k]--; r.moving[k] == 0 {
			delete(r.moving, k)
		}
		r.mu.Unlock()
	})
}

// Adopt takes in a client another replica handed over, before its new
// connection attaches (Connect): the client is here as one away within
// its reconnect grace, with its contexts not live and its leases as they
// were. A client this registry still holds (it was here before, left
// through another replica and came back within its grace) takes in what
// was handed: the contexts it lacks, and each handed lease whose context
// carries none here and whose epoch is above the context's last one here
// (a lease issued here since is newer, and the handed one was lost).
//
// It takes nothing in, and reports false, if the registry forgot its
// clients since forgets (Forgets, read as the hello began). What it did
// not take of the claimed leases (HandedLease.Claimed), whose rows are
// this replica's, is in untaken, for the caller to settle.
func (r *Registry) Adopt(forgets uint64, userID, clientID string, h HandedOver) (untaken Untaken, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.forgets.Load() != forgets {
		return Untaken{Back: h.digests(true)}, false
	}
	p := r.poolFor(userID)
	c := p.clients[clientID]
	fresh := c == nil
	if fresh {
		c = &client{pool: p, id: clientID, contexts: map[string]*wctx{}, dispatched: map[*command]struct{}{}}
	}
	for _, hc := range h.Contexts {
		w := c.contexts[hc.ID]
		if w == nil {
			w = &wctx{client: c, id: hc.ID, tabID: hc.TabID, owner: hc.Owner, url: hc.URL, title: hc.Title, labels: hc.Labels}
			c.contexts[w.id] = w
		}
		last := w.lastEpoch
		w.lastEpoch = max(w.lastEpoch, hc.LastEpoch)
		if hc.Lease == nil && !hc.AwaitUntil.IsZero() && w.lease == nil {
			w.awaiting = true
			if hc.AwaitUntil.After(r.awaiting[w]) {
				r.awaiting[w] = hc.AwaitUntil
			}
			r.refreshIdle(w)
			continue
		}
		hl := hc.Lease
		if hl == nil {
			continue
		}
		key, ok := digestOf(hl.TokenDigest)
		if !ok {
			continue
		}
		if r.leases[key] != nil {
			continue // here already, on another context: never twice
		}
		if w.lease != nil || hl.Epoch <= last {
			if hl.Claimed {
				untaken.add(key, hl.Epoch <= last)
			}
			continue
		}
		gen := hl.Generation
		if !hl.Claimed {
			gen++
		}
		l := &lease{key: key, ctx: w, taskID: hl.TaskID, epoch: hl.Epoch, ttl: hl.TTL,
			expiresAt: hl.ExpiresAt, renewOnUse: hl.RenewOnUse, clearState: hl.ClearState, heapIndex: -1,
			webhook: hl.LeaseWebhook, webhookKey: hl.LeaseWebhookKeyID, generation: gen}
		w.lastEpoch = max(w.lastEpoch, hl.Epoch)
		w.lease = l
		r.leases[key] = l
		r.stopAwaiting(w)
		r.pushDeadline(l)
		r.refreshIdle(w)
		if hl.Claimed {
			l.stored = l.expiresAt // as its row holds
		} else {
			r.storeMoved(l)
		}
	}
	if !fresh {
		return untaken, true
	}
	if len(c.contexts) == 0 {
		r.dropPoolIfEmpty(p)
		return untaken, true
	}
	p.clients[clientID] = c
	return untaken, true
}

// Untaken is what a registry did not take of the orphans its replica
// claimed (history.Store.ClaimOrphanedLeases), by token digest.
type Untaken struct {
	// Lost are the leases whose context was leased here since, at a later
	// epoch: they can never hold it again, and their rows are deleted.
	// Given back, such an orphan would be adopted once the later lease's
	// row is gone, and the context would see an older epoch again.
	Lost [][32]byte
	// Back are the rest, given back as orphans (history.Store.GiveBackLeases).
	Back [][32]byte
}

// AllBack is rows, claimed and none of them taken, all to be given back.
func AllBack(rows []history.PutLease) Untaken {
	u := Untaken{Back: make([][32]byte, len(rows))}
	for i, row := range rows {
		u.Back[i] = row.TokenDigest
	}
	return u
}

func (u *Untaken) add(key tokenKey, lost bool) {
	if lost {
		u.Lost = append(u.Lost, key)
	} else {
		u.Back = append(u.Back, key)
	}
}

// Digests are the token digests of the leases h carries.
func (h HandedOver) Digests() [][32]byte { return h.digests(false) }

// digests are the token digests of the leases h carries, or of those this
// replica claimed only (HandedLease.Claimed).
func (h HandedOver) digests(claimedOnly bool) [][32]byte {
	var out [][32]byte
	for _, hc := range h.Contexts {
		if hl := hc.Lease; hl != nil && (hl.Claimed || !claimedOnly) {
			if key, ok := digestOf(hl.TokenDigest); ok {
				out = append(out, [32]byte(key))
			}
		}
	}
	return out
}

// digestOf decodes a hex token digest.
func digestOf(s string) (tokenKey, bool) {
	var key tokenKey
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != len(key) {
		return key, false
	}
	copy(key[:], b)
	return key, true
}

// Knows reports whether the lease of token is active here, or ended here
// recently enough to say how.
func (r *Registry) Knows(token string) bool {
	key := keyOf(token)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.leases[key] != nil {
		return true
	}
	_, ended := r.endedLeases.get(key.ended())
	return ended
}

// Holds reports whether the lease of token is active here.
func (r *Registry) Holds(token string) bool {
	key := keyOf(token)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.leases[key] != nil
}

// MovedTo returns the replica a lease moved to with its client, if it did
// within the last MaxTTL (a lease renewed past that is no longer found
// through the replica that issued it).
func (r *Registry) MovedTo(token string) (string, bool) {
	key := keyOf(token).ended()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.moved.get(key)
}
