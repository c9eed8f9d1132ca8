package registry

import (
	"container/list"
	"encoding/json"
	"time"

	"github.com/jonboulle/clockwork"

	cheetah "github.com/cheetahbroker/cheetah"
)

// pool is one user's clients, their idle contexts and the acquires waiting
// for one. Users never share a pool: that is the user boundary.
type pool struct {
	userID  string
	clients map[string]*client
	// idle holds the idle contexts of each client type in the order they
	// became idle, which is the selection order (longest idle first). The
	// clock only moves forward, so appending keeps the list sorted.
	idle    map[cheetah.ClientType]*idleList
	waiters *list.List // of *waiter, first come first served
}

// client is one connected (or recently disconnected) client of a user.
type client struct {
	pool      *pool
	id        string
	typ       cheetah.ClientType
	name      string
	version   string
	labels    map[string]string
	keyID     string
	sessionID string
	conn      Conn // nil while disconnected
	// reported is false from a (re)connect until the first state report:
	// until then no context of the client is live.
	reported bool
	contexts map[string]*wctx
	grace    clockwork.Timer // ends the client when it does not come back
	// dispatched holds the client's commands dispatched and not yet ended,
	// so that a disconnect visits only them.
	dispatched  map[*command]struct{}
	connectedAt time.Time
	// epochFloor is the highest epoch issued anywhere when the client came
	// to this replica (ClientInfo.EpochFloor): its contexts' next epochs
	// are above it, whatever they had on the replica it left.
	epochFloor int64
	// notices is the batch of assignment notices queued on conn and not
	// yet written, which later changes update in place (notices.go); nil
	// when there is none, or once a command was sent after it.
	notices *Notices
	// nconn is conn as a NoticeConn, when it is one (nil otherwise).
	nconn NoticeConn
	// maxContexts is its hello's capacity.max_contexts (0: it opens none
	// on request), and creating the create_context requests it has not
	// answered (create.go).
	maxContexts, creating int
	// effects is its hello's effects: which commands only observe.
	effects map[string]string
}

// wctx is a worker context: a tab or a console flow.
type wctx struct {
	client *client
	id     string
	tabID  string
	// tabTarget is the target of its commands that name none,
	// {"tab_id": tabID}, made once for the tab id in tabTargetOf (see
	// defaultTarget).
	tabTarget   json.RawMessage
	tabTargetOf string
	owner       cheetah.Owner
	url         string
	title       string
	labels      map[string]string
	live        bool
	lease       *lease
	// idleOn is the idle list w is on (nil when not idle), and idlePrev,
	// idleNext its neighbours there.
	idleOn             *idleList
	idlePrev, idleNext *wctx
	idleSince          time.Time
	// inflight counts this context's commands admitted and not yet ended.
	inflight int
	// lastEpoch is the epoch of the context's last lease, here or on the
	// replica it came from: the next is above it (nextEpochAbove).
	lastEpoch int64
	// ident names it in the memory of ended leases (made on first use).
	ident *ctxIdent
	// affinityKey is the affinity key of its last lease ("" for none).
	affinityKey string
	// hold is a person's hold on it (holds.go), and mutating counts its
	// admitted mutations not yet ended, which a pending hold waits for.
	hold     *hold
	mutating int
	// awaiting: its lease is on another replica that has not handed it
	// over (durable_leases.go); it is not leased here meanwhile.
	awaiting bool
}

func (r *Registry) poolFor(userID string) *pool {
	p := r.users[userID]
	if p == nil {
		p = &pool{userID: userID, clients: map[string]*client{}, idle: map[cheetah.ClientType]*idleList{}, waiters: list.New()}
		r.users[userID] = p
	}
	return p
}

// dropPoolIfEmpty drops a user with nothing left, so bookkeeping returns to
// zero when every client is gone.
func (r *Registry) dropPoolIfEmpty(p *pool) {
	if len(p.clients) == 0 && p.waiters.Len() == 0 {
		delete(r.users, p.userID)
	}
}

// label returns the context's label, or where it lacks the key the client's.
func (w *wctx) label(key string) (string, bool) {
	if v, ok := w.labels[key]; ok {
		return v, true
	}
	v, ok := w.client.labels[key]
	return v, ok
}

func (w *wctx) matches(req *cheetah.AcquireRequest) bool {
	if w.client.typ != req.ClientType {
		return false
	}
	if req.ClientID != "" && w.client.id != req.ClientID {
		return false
	}
	for k, v := range req.Labels {
		if got, ok := w.label(k); !ok || got != v {
			return false
		}
	}
	return true
}

func (w *wctx) idle() bool {
	return w.live && w.owner == cheetah.OwnerWorker && w.lease == nil && w.hold == nil && !w.awaiting
}

func (w *wctx) state() string {
	switch {
	case !w.live:
		return cheetah.StateNotLive
	case w.owner != cheetah.OwnerWorker:
		return cheetah.StateHuman
	case w.lease != nil, w.awaiting:
		return cheetah.StateLeased
	}
	return cheetah.StateIdle
}

// waiting counts the acquires waiting in p that this replica admitted, and
// those that wait here for another replica's (stand-ins); r.mu is held.
func (p *pool) waiting() (own, standIns int) {
	for e := p.waiters.Front(); e != nil; e = e.Next() {
		if e.Value.(*waiter).standIn {
			standIns++
		}
	}
	return p.waiters.Len() - standIns, standIns
}

// refreshIdle puts w in or out of its pool's idle list to match its state,
// handing a newly idle context to the first matching waiter; r.mu is held.
// When that hand-over fails, the waiter gets the error and w still goes on
// the idle list.
func (r *Registry) refreshIdle(w *wctx) { r.refreshIdleAt(w, time.Time{}) }

// refreshIdleAt is refreshIdle for a caller that read the clock already
// (now; zero when it did not): a release reads it once under r.mu.
func (r *Registry) refreshIdleAt(w *wctx, now time.Time) {
	p := w.client.pool
	if !w.idle() {
		if w.idleOn != nil {
			w.idleOn.remove(w)
		}
		return
	}
	if w.idleOn != nil {
		return
	}
	if now.IsZero() {
		now = r.clock.Now()
	}
	for e := p.waiters.Front(); e != nil; e = e.Next() {
		wt := e.Value.(*waiter)
		if w.matches(&wt.req) && r.quotaAdmit(wt.l, &wt.req) == nil {
			r.unwait(wt)
			wt.l.affinity = affinityOf(w, &wt.req)
			l, err := r.assign(w, &wt.req, wt.l, wt.token, now)
			wt.ch <- acquireResult{lease: l, err: err}
			if err == nil {
				return
			}
			// The waiter learns why (no epoch could be issued), and the
			// context is not stranded: it goes on the idle list below, where
			// a later acquire finds it.
			break
		}
	}
	lst := p.idle[w.client.typ]
	if lst == nil {
		lst = &idleList{}
		p.idle[w.client.typ] = lst
	}
	w.idleSince = now
	lst.pushBack(w)
}

func (w *wctx) snapshot() cheetah.ContextSnapshot {
	s := cheetah.ContextSnapshot{
		UserID: w.client.pool.userID, ClientID: w.client.id, ContextID: w.id,
		ClientType: w.client.typ, TabID: w.tabID, Owner: w.owner, URL: w.url,
		Title: w.title, Labels: w.labels, State: w.state(),
	}
	if w.hold != nil {
		s.Held = w.hold.info()
	}
	if s.Labels == nil {
		s.Labels = map[string]string{}
	}
	if w.idleOn != nil {
		t := w.idleSince.UTC()
		s.IdleSince = &t
	}
	return s
}

// idleList is a pool's idle contexts of one client type, longest idle
// first. It is linked through the contexts themselves, so that a context
// joins and leaves it, on every release and acquire, without allocating.
type idleList struct{ head, tail *wctx }

func (l *idleList) pushBack(w *wctx) {
	w.idleOn, w.idlePrev, w.idleNext = l, l.tail, nil
	if l.tail != nil {
		l.tail.idleNext = w
	} else {
		l.head = w
	}
	l.tail = w
}

func (l *idleList) remove(w *wctx) {
	if w.idlePrev != nil {
		w.idlePrev.idleNext = w.idleNext
	} else {
		l.head = w.idleNext
	}
	if w.idleNext != nil {
		w.idleNext.idlePrev = w.idlePrev
	} else {
		l.tail = w.idlePrev
	}
	w.idleOn, w.idlePrev, w.idleNext = nil, nil, nil
}

// defaultTarget is the target of w's commands that name none: its tab, as
// {"tab_id": …}. It is made once per tab id and shared by those commands,
// which only read it; r.mu is held.
func (w *wctx) defaultTarget() json.RawMessage {
	if w.tabTarget == nil || w.tabTargetOf != w.tabID {
		// A map of strings always encodes, as a JSON object.
		w.tabTarget, _ = json.Marshal(map[string]string{"tab_id": w.tabID})
		w.tabTargetOf = w.tabID
	}
	return w.tabTarget
}
