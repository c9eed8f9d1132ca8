package registry

import (
	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/protocol"
)

// ClientInfo is what a client said in its hello, with the identity its key
// proved.
type ClientInfo struct {
	UserID    string
	ClientID  string
	Type      cheetah.ClientType
	Name      string
	Version   string
	Labels    map[string]string
	KeyID     string
	SessionID string
	// MaxContexts is hello.capacity.max_contexts: how many contexts the
	// client can hold in all, for creation on demand (0: none on request).
	MaxContexts int
	// EpochFloor, among replicas, is the highest epoch issued anywhere
	// before the client came here: its contexts' epochs here are above it.
	EpochFloor int64
	// Effects is hello.effects: what each command does (protocol.EffectObserve
	// or protocol.EffectMutate); a command it does not name is a mutation.
	Effects map[string]string
	// Forgets is what Registry.Forgets said as the hello began: Connect
	// attaches nothing if the registry forgot its clients since.
	Forgets uint64
}

// Attachment is one connection's hold on its client. The session passes it
// back with everything the client sends, so that a replaced connection can
// no longer act for the client.
type Attachment struct {
	c         *client
	conn      Conn
	sessionID string
}

// Connect attaches conn as client info.ClientID of info.UserID. A connection
// already attached for that client is closed with 4409 and its commands end
// disconnected. The client's contexts stay not live until its first state
// report; its leases survive the reconnect grace. It attaches nothing, and
// returns nil, if the registry forgot its clients since info.Forgets.
func (r *Registry) Connect(info ClientInfo, conn Conn) *Attachment {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.forgets.Load() != info.Forgets {
		return nil
	}
	p := r.poolFor(info.UserID)
	c := p.clients[info.ClientID]
	if c == nil {
		c = &client{pool: p, id: info.ClientID, contexts: map[string]*wctx{}, dispatched: map[*command]struct{}{}}
		p.clients[info.ClientID] = c
	} else if c.conn != nil {
		old := c.conn
		r.detach(c)
		old.Close(protocol.CloseReplaced, "replaced by a newer connection with the same client_id")
	}
	if c.typ != "" && c.typ != info.Type {
		// A client id that changes type is another client: start afresh.
		r.dropContexts(c)
	}
	c.typ, c.name, c.version, c.labels = info.Type, info.Name, info.Version, info.Labels
	c.keyID, c.sessionID, c.conn = info.KeyID, info.SessionID, conn
	c.maxContexts = info.MaxContexts
	c.effects = info.Effects
	c.nconn, _ = conn.(NoticeConn)
	c.epochFloor = max(c.epochFloor, info.EpochFloor)
	c.reported = false
	c.connectedAt = r.clock.Now()
	// The grace keeps running until the first state report, so a client that
	// says hello and never reports does not hold its leases forever.
	if c.grace == nil && len(c.contexts) > 0 {
		r.startGrace(c)
	}
	r.emit(clientEvent(ClientConnected, c))
	return &Attachment{c: c, conn: conn, sessionID: info.SessionID}
}

// current reports whether a still holds its client; r.mu is held.
func (a *Attachment) current() bool { return a.c.conn == a.conn && a.conn != nil }

// Report applies a full state report: listed contexts are live (and created
// when new); every other context of the client is gone.
func (r *Registry) Report(a *Attachment, contexts []protocol.ContextReport) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !a.current() {
		return
	}
	c := a.c
	if c.grace != nil {
		c.grace.Stop()
		c.grace = nil
	}
	c.reported = true
	seen := make(map[string]bool, len(contexts))
	for _, rep := range contexts {
		seen[rep.ContextID] = true
		w := c.contexts[rep.ContextID]
		if w == nil {
			w = &wctx{client: c, id: rep.ContextID}
			c.contexts[rep.ContextID] = w
		}
		w.tabID, w.url, w.title, w.labels = rep.TabID, rep.URL, rep.Title, rep.Labels
		w.owner = rep.Owner
		if !w.live && w.lease != nil && !w.lease.untold {
			// A lease held across a reconnect: the new connection has not
			// heard of it, so the client is told again.
			r.notify(w, assignedNotice(w.lease, false))
		}
		w.live = true
		if rep.RequestID == "" || !r.settleCreation(w, rep.RequestID) {
			r.refreshIdle(w)
		}
	}
	for id, w := range c.contexts {
		if !seen[id] {
			r.dropContext(w)
		}
	}
}

// Disconnect marks the connection gone: its client's contexts stop being
// live, commands dispatched to it end disconnected, and the reconnect grace
// starts. A connection already replaced changes nothing.
func (r *Registry) Disconnect(a *Attachment) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !a.current() {
		return
	}
	r.disconnect(a.c)
}

// disconnect detaches c's connection and starts its reconnect grace, or
// drops c when it has no contexts; r.mu is held.
func (r *Registry) disconnect(c *client) {
	r.detach(c)
	r.emit(clientEvent(ClientDisconnected, c))
	if len(c.contexts) == 0 {
		r.dropClient(c)
		return
	}
	if c.grace == nil {
		r.startGrace(c)
	}
}

// detach takes c's connection away; r.mu is held.
func (r *Registry) detach(c *client) {
	conn := c.conn
	r.endHoldsOf(c, conn) // holds end with the connection that made them
	c.conn, c.nconn, c.notices = nil, nil, nil
	r.failCreations(c, errCreationFailed) // the connection dropped first
	c.reported = false
	for _, w := range c.contexts {
		w.live = false
		r.refreshIdle(w)
	}
	// Only this client's dispatched commands are visited, not every
	// command in flight.
	var gone []*command
	for cmd := range c.dispatched {
		if cmd.conn == conn {
			gone = append(gone, cmd)
		}
	}
	for _, cmd := range gone {
		r.endCommand(cmd, cheetah.StatusDisconnected, &cheetah.ErrorInfo{Code: "disconnected", Message: "the client's connection dropped"}, nil)
	}
}

func (r *Registry) startGrace(c *client) {
	c.grace = r.afterFunc(r.cfg.ReconnectGrace, func() {
		if c.grace == nil || c.reported {
			return
		}
		c.grace = nil
		// Whether still away or connected without a report, the client did
		// not come back with its contexts in time: they are gone.
		r.dropContexts(c)
		if c.conn == nil {
			r.dropClient(c)
		}
	})
}

// dropContexts removes every context of c; r.mu is held.
func (r *Registry) dropContexts(c *client) {
	for _, w := range c.contexts {
		r.dropContext(w)
	}
}

// dropContext removes a context that is gone: its lease ends
// context_gone; r.mu is held.
func (r *Registry) dropContext(w *wctx) {
	w.live = false
	if w.hold != nil {
		r.endHumanHold(w)
	}
	if w.lease != nil {
		r.endLease(w.lease, cheetah.LostContextGone)
	}
	r.refreshIdle(w)
	delete(w.client.contexts, w.id)
}

// dropClient removes a client with no connection and no contexts; r.mu
// is held.
func (r *Registry) dropClient(c *client) {
	if c.grace != nil {
		c.grace.Stop()
		c.grace = nil
	}
	p := c.pool
	if p.clients[c.id] == c {
		delete(p.clients, c.id)
		r.emit(clientEvent(ClientGone, c))
	}
	r.dropPoolIfEmpty(p)
}

// DisconnectKey closes every connection authenticated by keyID with code
// (4403 when a key is revoked) and returns how many it closed.
func (r *Registry) DisconnectKey(keyID string, code protocol.CloseCode, reason string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	var gone []*client
	for _, p := range r.users {
		for _, c := range p.clients {
			if c.conn != nil && c.keyID == keyID {
				gone = append(gone, c)
			}
		}
	}
	for _, c := range gone {
		r.cut(c, code, reason)
	}
	return len(gone)
}

// DisconnectClient closes a client's connection with code and reports
// whether it was connected.
func (r *Registry) DisconnectClient(userID, clientID string, code protocol.CloseCode, reason string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.users[userID]
	if p == nil || p.clients[clientID] == nil || p.clients[clientID].conn == nil {
		return false
	}
	r.cut(p.clients[clientID], code, reason)
	return true
}

// cut closes c's connection with code and detaches it at once; r.mu is
// held. The close handshake may take seconds (a peer that does not answer
// it takes the library's whole timeout), and a client an admin cut off, or
// whose key was revoked, must not be handed a command meanwhile: its
// contexts stop being live now, as when its connection drops.
func (r *Registry) cut(c *client, code protocol.CloseCode, reason string) {
	c.conn.Close(code, reason)
	r.disconnect(c)
}
