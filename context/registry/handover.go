package registry

import (
	"encoding/hex"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
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
	// with one more.
	Generation int64 `json:"generation,omitempty"`
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

// Adopt takes in a client another replica handed over, before its new
// connection attaches (Connect): the client is here as one away within
// its reconnect grace, with its contexts not live and its leases as they
// were. A client this registry still holds (it was here before, left
// through another replica and came back within its grace) takes in what
// was handed: the contexts it lacks, and each handed lease whose context
// carries none here and whose epoch is above the context's last one here
// (a lease issued here since is newer, and the handed one was lost).
func (r *Registry) Adopt(userID, clientID string, h HandedOver) {
	r.mu.Lock()
	defer r.mu.Unlock()
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
		if hl == nil || w.lease != nil || hl.Epoch <= last {
			continue
		}
		var key tokenKey
		if b, err := hex.DecodeString(hl.TokenDigest); err != nil || len(b) != len(key) {
			continue
		} else {
			copy(key[:], b)
		}
		if r.leases[key] != nil {
			continue // here already, on another context: never twice
		}
		l := &lease{key: key, ctx: w, taskID: hl.TaskID, epoch: hl.Epoch, ttl: hl.TTL,
			expiresAt: hl.ExpiresAt, renewOnUse: hl.RenewOnUse, clearState: hl.ClearState, heapIndex: -1,
			webhook: hl.LeaseWebhook, webhookKey: hl.LeaseWebhookKeyID, generation: hl.Generation + 1}
		w.lastEpoch = max(w.lastEpoch, hl.Epoch)
		w.lease = l
		r.leases[key] = l
		r.stopAwaiting(w)
		r.pushDeadline(l)
		r.refreshIdle(w)
		r.storeMoved(l)
	}
	if !fresh {
		return
	}
	if len(c.contexts) == 0 {
		r.dropPoolIfEmpty(p)
		return
	}
	p.clients[clientID] = c
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
