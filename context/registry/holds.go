package registry

import (
	"time"

	"github.com/jonboulle/clockwork"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/protocol"
)

// Human control (DESIGN §10): a person takes over a context through the
// client that reports it. One lifecycle, all of it under r.mu:
//
//   - Hold fences the context at once: from then on a new mutation on it
//     fails held (423); an observation passes. The hold is pending while
//     the context's admitted mutations run (draining) and turns active when
//     the last of them ends. Draining never cancels them.
//   - While held the context's lease, if any, cannot expire: the hold
//     preserves it as admitted work does (lease.preserve). A held idle
//     context is out of selection.
//   - The hold ends by unhold, by its TTL (the registry's clock), or with
//     the connection that made it (a drop, a replacement, a cut), pending
//     or active. The lease, if any, then gets its whole TTL from that
//     moment.
//
// A context has one hold at most: a second hold on a held context is the
// same hold, its TTL restarted, its state and since unchanged. Holds live
// in memory only, and nothing about them is written to the store.

// hold is a person's hold on one context.
type hold struct {
	conn  Conn // the connection that made it; it ends with it
	state protocol.HoldState
	since time.Time
	timer clockwork.Timer
	// preserved is the lease it keeps from expiring, if any.
	preserved *lease
}

func (h *hold) info() *cheetah.HoldInfo {
	return &cheetah.HoldInfo{State: string(h.state), Since: h.since.UTC()}
}

// isMutation says whether command name, sent to w, may change it: what
// its client declared in hello.effects, a mutation when it declared
// nothing for it.
func (w *wctx) isMutation(name string) bool {
	return w.client.effects[name] != protocol.EffectObserve
}

// Hold takes a hold on contextID of a's client for ttl (default
// protocol.DefaultHoldTTL seconds when zero), or restarts the TTL of the
// hold it already has. It tells the client the hold's state in a hold_state
// frame and returns it: pending while admitted mutations drain, active,
// or ended when there is no such context or a is no longer its client's
// connection.
func (r *Registry) Hold(a *Attachment, contextID string, ttl time.Duration) protocol.HoldState {
	if ttl <= 0 {
		ttl = protocol.DefaultHoldTTL * time.Second
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	w := a.c.contexts[contextID]
	if !a.current() || w == nil {
		a.conn.Send(&protocol.HoldStateFrame{ContextID: contextID, State: protocol.HoldEnded})
		return protocol.HoldEnded
	}
	h := w.hold
	if h == nil {
		h = &hold{conn: a.conn, state: protocol.HoldPending, since: r.clock.Now()}
		w.hold = h
		if l := w.lease; l != nil {
			h.preserved = l
			r.preserveLease(l)
		}
		r.refreshIdle(w) // out of selection
		if w.mutating == 0 {
			h.state = protocol.HoldActive
		}
	} else {
		h.timer.Stop()
	}
	h.timer = r.afterFunc(ttl, func() {
		if w.hold == h {
			r.endHumanHold(w)
		}
	})
	a.conn.Send(&protocol.HoldStateFrame{ContextID: w.id, State: h.state})
	return h.state
}

// Unhold ends a's hold on contextID, if any, and answers ended.
func (r *Registry) Unhold(a *Attachment, contextID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w := a.c.contexts[contextID]; w != nil && w.hold != nil && w.hold.conn == a.conn {
		r.endHumanHold(w)
		return
	}
	a.conn.Send(&protocol.HoldStateFrame{ContextID: contextID, State: protocol.HoldEnded})
}

// endHumanHold ends w's hold and tells the connection that made it; r.mu is
// held. The lease it preserved gets its TTL again from now, and the context
// may be selected again.
func (r *Registry) endHumanHold(w *wctx) {
	h := w.hold
	w.hold = nil
	h.timer.Stop()
	if l := h.preserved; l != nil {
		r.unpreserveLease(l, true)
	}
	h.conn.Send(&protocol.HoldStateFrame{ContextID: w.id, State: protocol.HoldEnded})
	r.refreshIdle(w)
}

// endHoldsOf ends the holds conn made on c's contexts; r.mu is held.
func (r *Registry) endHoldsOf(c *client, conn Conn) {
	for _, w := range c.contexts {
		if w.hold != nil && w.hold.conn == conn {
			r.endHumanHold(w)
		}
	}
}

// fenced is the error a mutation on a held w fails with; r.mu is held.
func fenced(w *wctx) error {
	return &cheetah.HeldError{Hold: *w.hold.info()}
}

// mutationEnded counts down w's admitted mutations and activates a
// pending hold once the last one ended; r.mu is held.
func (r *Registry) mutationEnded(w *wctx) {
	w.mutating--
	if h := w.hold; h != nil && w.mutating == 0 && h.state == protocol.HoldPending {
		h.state, h.since = protocol.HoldActive, r.clock.Now()
		h.conn.Send(&protocol.HoldStateFrame{ContextID: w.id, State: protocol.HoldActive})
	}
}

// preserveLease keeps l from expiring until unpreserveLease; r.mu is held.
func (r *Registry) preserveLease(l *lease) {
	l.preserve++
	if l.heapIndex >= 0 {
		heapRemove(r, l)
	}
}

// unpreserveLease drops one preservation of l; r.mu is held. When none is
// left, l's deadline is back in the heap: from now plus its TTL when renew
// is set, else as it stood (it may expire at once).
func (r *Registry) unpreserveLease(l *lease, renew bool) {
	l.preserve--
	if r.leases[l.key] != l || l.preserve > 0 {
		return
	}
	if renew {
		l.expiresAt = r.clock.Now().Add(l.ttl)
		r.storeExpiry(l)
	}
	r.pushDeadline(l)
}
