package registry

import (
	"context"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/protocol"
)

// Creation on demand (DESIGN §10). An acquire with Create that finds no
// idle context asks the eligible client with the most room to open one
// (create_context), and waits for the client's state report that lists a
// context with the request's id: that context, and no other, is assigned
// to that acquire. A client's room is its hello's max_contexts less the
// contexts it reports and the creations it was asked for and has not
// answered, so concurrent creations never exceed it.

// creation is one create_context waiting for its context; r.mu guards it.
type creation struct {
	id     string
	client *client
	req    cheetah.AcquireRequest
	l      *lease
	token  string             // the lease's, if the context comes
	key    tokenKey           // its digest
	ch     chan acquireResult // buffered: the hand-off never blocks
}

// errCreationFailed and the like are the reasons of a creation's end.
var (
	errCreationFailed  = &cheetah.NoContextError{Reason: cheetah.ReasonCreationFailed}
	errCreationTimeout = &cheetah.NoContextError{Reason: cheetah.ReasonCreationTimeout}
)

// newCreation prepares, off the lock, the creation an acquire for req will
// ask for if nothing idle matches: its request id, and the token of the
// lease l it would get. The request id is sent to the client, so it is not
// the lease's token.
func newCreation(req *cheetah.AcquireRequest, l *lease, tokenTag string) *creation {
	cr := &creation{id: "cr_" + newToken(""), req: *req, l: l, token: newToken(tokenTag), ch: make(chan acquireResult, 1)}
	cr.key = keyOf(cr.token)
	return cr
}

// startCreation asks a client of p to open a context for cr, whose acquire
// found no idle one; r.mu is held and is released before it returns. It
// waits for the context, the client's refusal, the timeout or ctx.
func (r *Registry) startCreation(ctx context.Context, p *pool, cr *creation) (cheetah.Lease, error) {
	req := &cr.req
	c, err := r.roomiest(p, req)
	if err != nil {
		r.dropPoolIfEmpty(p)
		r.mu.Unlock()
		return cheetah.Lease{}, err
	}
	cr.client, cr.l.key = c, cr.key
	if !c.conn.Send(&protocol.CreateContext{RequestID: cr.id, URL: req.Create.URL}) {
		r.mu.Unlock()
		return cheetah.Lease{}, errCreationFailed
	}
	if r.creations == nil {
		r.creations = map[string]*creation{}
	}
	r.creations[cr.id] = cr
	c.creating++
	r.mu.Unlock()

	t := r.clock.NewTimer(req.Create.Timeout)
	defer t.Stop()
	var cause error = errCreationTimeout
	select {
	case res := <-cr.ch:
		if ctx.Err() == nil {
			return res.lease, res.err
		}
		// Settled as the caller went away.
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.settleWait(res, ctx.Err())
	case <-t.Chan():
	case <-ctx.Done():
		cause = ctx.Err()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.creations[cr.id] != cr {
		// Settled just as the wait ended.
		return r.settleWait(<-cr.ch, ctx.Err())
	}
	// Abandoned: a context reported later with this id is an ordinary
	// idle one.
	r.endCreation(cr)
	return cheetah.Lease{}, cause
}

// roomiest returns the eligible connected client of p with the most room
// for a new context, ties by client id; r.mu is held. Eligible: req's
// type, client id and labels (the client's own labels: the context has
// none yet).
func (r *Registry) roomiest(p *pool, req *cheetah.AcquireRequest) (*client, error) {
	var best *client
	bestRoom, connected, placed := 0, false, false
	for _, c := range p.clients {
		if c.conn == nil || c.typ != req.ClientType {
			continue
		}
		connected = true
		if req.ClientID != "" && c.id != req.ClientID || !c.hasLabels(req.Labels) {
			continue
		}
		placed = true
		room := c.maxContexts - len(c.contexts) - c.creating
		if room > bestRoom || room == bestRoom && room > 0 && c.id < best.id {
			best, bestRoom = c, room
		}
	}
	switch {
	case best != nil:
		return best, nil
	case !connected:
		return nil, &cheetah.NoContextError{Reason: cheetah.ReasonNoEligibleClient}
	case !placed:
		return nil, &cheetah.NoContextError{Reason: cheetah.ReasonPlacementMiss}
	}
	return nil, &cheetah.NoContextError{Reason: cheetah.ReasonCapacityExhausted}
}

func (c *client) hasLabels(want map[string]string) bool {
	for k, v := range want {
		if got, ok := c.labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// endCreation forgets cr; r.mu is held.
func (r *Registry) endCreation(cr *creation) {
	delete(r.creations, cr.id)
	cr.client.creating--
}

// settleCreation hands w, just reported with requestID by its client, to
// the acquire that asked for it, and reports whether it did; r.mu is held.
// A context whose creation is not pending (it timed out, its caller went
// away, another client asked) stays an ordinary one.
func (r *Registry) settleCreation(w *wctx, requestID string) bool {
	cr := r.creations[requestID]
	if cr == nil || cr.client != w.client || !w.idle() || w.idleOn != nil {
		return false
	}
	r.endCreation(cr)
	if err := r.quotaAdmit(cr.l, &cr.req); err != nil {
		cr.ch <- acquireResult{err: err}
		return false
	}
	cr.l.created = true
	l, err := r.assign(w, &cr.req, cr.l, cr.token, r.clock.Now())
	cr.ch <- acquireResult{lease: l, err: err}
	return err == nil
}

// CreateFailed applies a client's create_failed: the acquire waiting for
// that context fails creation_failed. An unknown request id is ignored: it
// may have timed out.
func (r *Registry) CreateFailed(a *Attachment, f *protocol.CreateFailed) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !a.current() {
		return
	}
	cr := r.creations[f.RequestID]
	if cr == nil || cr.client != a.c {
		return
	}
	r.endCreation(cr)
	cr.ch <- acquireResult{err: errCreationFailed}
	r.log.Info("a client could not open a context", "client_id", a.c.id, "request_id", f.RequestID, "code", f.Code, "message", f.Message)
}

// failCreations fails every creation asked of c (its connection dropped),
// or of every client when c is nil (the registry stops), with err; r.mu is
// held.
func (r *Registry) failCreations(c *client, err error) {
	for _, cr := range r.creations {
		if c == nil || cr.client == c {
			r.endCreation(cr)
			cr.ch <- acquireResult{err: err}
		}
	}
}
