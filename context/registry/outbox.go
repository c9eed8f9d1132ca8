package registry

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history"
)

// What the registry decides under its lock and does after it.
//
// Nothing under r.mu waits on the store or on a subscriber. What a
// transition must write is appended to the outbox, in the order the
// registry decided it, and one goroutine (flushLoop) hands the outbox to
// the store in that order: a command's record, its ack, its messages and
// its terminal status reach the store as they were decided,
// whichever goroutines decided them. The events of the transitions go to an
// ordered queue the same way, and one goroutine (notifyLoop) delivers them
// to the subscribers, ends the spans of the commands that ended, and hands
// the waiting callers their resolutions once the ends are durable. Close
// joins both, after they handed on what was decided before it.

// outWrite is one entry of the outbox: ops for the store, with the callback
// that learns how they fared, or a barrier that the flusher closes when it
// reaches it.
type outWrite struct {
	ops     []history.Op
	done    func(error)
	barrier chan struct{}
}

// durableEnd is a command's record (record set) or end whose write came
// back from the store. The store calls back in commit order, so a
// command's record comes before its end.
type durableEnd struct {
	c      *command
	err    error
	record bool
}

// spanEnd is a command whose spans end off the lock.
type spanEnd struct {
	c        *command
	status   cheetah.Status
	e        *cheetah.ErrorInfo
	terminal cheetah.MessageKind
}

// afterLock is the state of the goroutines that act on what was decided
// under r.mu. Fields marked r.mu are guarded by the registry's lock.
type afterLock struct {
	outbox    []outWrite // r.mu
	outClosed bool       // r.mu; the flusher has stopped
	outKick   chan struct{}

	events    eventQueue // r.mu (eventq.go)
	spanEnds  []spanEnd  // r.mu
	seq       uint64     // r.mu
	evClosed  bool       // r.mu; the notifier has stopped
	notifKick chan struct{}

	endsMu     sync.Mutex
	ends       []durableEnd // ends that came back from the store
	endsClosed bool         // the notifier has stopped: resolve inline

	subsMu sync.Mutex
	subs   []*subscriber
}

type subscriber struct{ f func(Event) }

func kick(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// write appends ops to the outbox; r.mu is held. done, if not nil, learns
// how they fared; it is called by the store's writer (or inline once the
// registry closed) and must not block or take r.mu.
func (r *Registry) write(done func(error), ops ...history.Op) {
	if r.after.outClosed {
		if done != nil {
			done(cheetah.StoreUnavailable("registry: write", fmt.Errorf("the registry is closed")))
		}
		return
	}
	r.after.outbox = append(r.after.outbox, outWrite{ops: ops, done: done})
	kick(r.after.outKick)
}

// handedOver returns once everything the outbox held when it was called is
// handed to the store, or when ctx ends.
func (r *Registry) handedOver(ctx context.Context) error {
	ch := make(chan struct{})
	r.mu.Lock()
	if r.after.outClosed {
		close(ch)
	} else {
		r.after.outbox = append(r.after.outbox, outWrite{barrier: ch})
		kick(r.after.outKick)
	}
	r.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// flushLoop hands the outbox to the store, in order. It stops once Close
// was called and the outbox is empty.
func (r *Registry) flushLoop() {
	defer r.wg.Done()
	// The drained batch goes back as the next outbox, so that appending
	// under r.mu reuses its array instead of allocating one per flush.
	var spare []outWrite
	for {
		stopping := false
		select {
		case <-r.after.outKick:
		case <-r.stop:
			stopping = true
		}
		for {
			r.mu.Lock()
			batch := r.after.outbox
			r.after.outbox, spare = spare[:0], nil
			if stopping && len(batch) == 0 {
				r.after.outClosed = true
			}
			r.mu.Unlock()
			if len(batch) == 0 {
				break
			}
			for i, w := range batch {
				if w.barrier != nil {
					close(w.barrier)
				} else {
					r.store.WriteAsync(w.done, w.ops...)
				}
				batch[i] = outWrite{}
			}
			spare = batch
		}
		if stopping {
			return
		}
	}
}

// emit queues ev for the subscribers; r.mu is held.
func (r *Registry) emit(ev Event) {
	if r.after.evClosed {
		return
	}
	r.after.seq++
	ev.Seq = r.after.seq
	if ev.At.IsZero() {
		ev.At = r.clock.Now()
	}
	r.after.events.push(&ev)
	kick(r.after.notifKick)
}

// endSpansLater ends c's spans off the lock; r.mu is held.
func (r *Registry) endSpansLater(c *command, status cheetah.Status, e *cheetah.ErrorInfo, terminal cheetah.MessageKind) {
	if c.traced {
		r.after.spanEnds = append(r.after.spanEnds, spanEnd{c: c, status: status, e: e, terminal: terminal})
		kick(r.after.notifKick)
	}
}

// ended is the store's callback for a command's end: err is how writing it
// fared. It runs on the store's writer and must not block, so it only
// queues the end for notifyLoop; once the registry closed, it hands the
// waiting caller its outcome itself.
func (r *Registry) endWritten(c *command, err error) {
	r.after.endsMu.Lock()
	if !r.after.endsClosed {
		r.after.ends = append(r.after.ends, durableEnd{c: c, err: err})
		r.after.endsMu.Unlock()
		kick(r.after.notifKick)
		return
	}
	r.after.endsMu.Unlock()
	if err == nil && c.uncertain.Load() {
		// Closed, the registry starts no read of history: the caller is
		// told to read it.
		err = errEndUnread
	}
	r.resolve(c, err)
}

// errEndUnread is why a caller of an uncertain end (command.uncertain) was
// not told it: the registry closed before it could read it.
var errEndUnread = errors.New("the broker stopped before it read the command's end from history")

// resolve hands c's waiting caller (if any) its outcome: the resolution, or
// store_unavailable when the end could not be made durable (invariant 8:
// no resolution that history cannot show). It never blocks.
func (r *Registry) resolve(c *command, werr error) {
	if c.resolved == nil {
		return
	}
	o := outcome{res: c.res}
	switch {
	case werr != nil:
		o = outcome{err: cheetah.StoreUnavailable("registry: record the command's end", werr)}
	case c.uncertain.Load():
		// The end is written, but a mark may have committed first.
		r.wg.Go(func() { r.resolveAs(c, r.readEnd(c)) })
		return
	}
	r.resolveAs(c, o)
}

// resolveAs hands c's waiting caller o. It never blocks.
func (r *Registry) resolveAs(c *command, o outcome) {
	select {
	case c.resolved <- o:
	default: // Close resolved it already
	}
}

// readEnd is the outcome of c as history holds it.
func (r *Registry) readEnd(c *command) outcome {
	ctx, cancel := context.WithTimeout(r.bg, readEndTimeout)
	defer cancel()
	rec, err := r.store.Get(ctx, c.user, c.rec.CommandID)
	if err != nil {
		return outcome{err: cheetah.StoreUnavailable("registry: read the command's end", err)}
	}
	return outcome{res: rec.Resolution()}
}

// readEndTimeout bounds readEnd: the caller is told store_unavailable
// after it, and reads history itself.
const readEndTimeout = 10 * time.Second

// notifyLoop delivers events, ends spans and resolves waiting callers, in
// the order they were queued. It stops once Close was called and nothing is
// left.
func (r *Registry) notifyLoop() {
	defer r.wg.Done()
	for {
		stopping := false
		select {
		case <-r.after.notifKick:
		case <-r.stop:
			stopping = true
		}
		for r.notifyOnce(stopping) {
		}
		if stopping {
			return
		}
	}
}

// notifyOnce does one round of notifyLoop and reports whether it found
// anything to do. When stopping and nothing is left, it closes the queues.
func (r *Registry) notifyOnce(stopping bool) bool {
	a := &r.after
	a.endsMu.Lock()
	ends := a.ends
	a.ends = nil
	if stopping && len(ends) == 0 {
		a.endsClosed = true
	}
	a.endsMu.Unlock()

	r.mu.Lock()
	for _, d := range ends {
		if d.record {
			r.recordDurable(d.c, d.err)
		} else {
			r.endDurable(d.c, d.err)
		}
	}
	events, spans := a.events.take(), a.spanEnds
	a.spanEnds = nil
	if stopping && len(ends) == 0 && len(events) == 0 && len(spans) == 0 {
		a.evClosed = true
	}
	r.mu.Unlock()

	for _, chunk := range events {
		for i := range chunk {
			r.deliver(&chunk[i])
		}
	}
	a.events.release(events)
	for _, s := range spans {
		r.tel.endSpans(s.c, s.status, s.e, s.terminal)
	}
	// After the events: a caller that has its resolution finds the
	// command's duration counted and its spans ended; a sender told its
	// record is durable finds the command announced.
	for _, d := range ends {
		if d.record {
			r.recordTold(d.c, d.err)
		} else {
			r.resolve(d.c, d.err)
		}
	}
	return len(ends) > 0 || len(events) > 0 || len(spans) > 0
}

// endDurable completes a command's end once its write came back; r.mu is
// held. The lease it preserved is renewed (invariant 5), CommandEnded is
// emitted, and its spans end.
func (r *Registry) endDurable(c *command, werr error) {
	if !c.ending {
		return // Close finished it
	}
	c.ending = false
	delete(r.ending, c)
	r.unpreserve(c, true)
	if c.durable {
		// One whose record could not be written was never announced.
		r.emitEnded(c, werr == nil)
	}
	r.endSpansLater(c, c.res.Status, c.res.Error, c.terminal)
}

// emitEnded emits c's CommandEnded; r.mu is held.
func (r *Registry) emitEnded(c *command, durable bool) {
	ev := r.commandEvent(CommandEnded, c)
	ev.At = c.endedAt
	ev.Status, ev.Error, ev.Terminal, ev.Durable = c.res.Status, c.res.Error, c.terminal, durable
	r.emit(ev)
}

// commandEvent is an event of kind k about c.
func (r *Registry) commandEvent(k EventKind, c *command) Event {
	return Event{Kind: k, UserID: c.user, ClientID: c.client, ContextID: c.rec.ContextID,
		TaskID: c.rec.TaskID, Epoch: c.rec.Epoch, CommandID: c.rec.CommandID, CommandName: c.rec.Name,
		AdmittedAt: c.rec.CreatedAt, HasCallback: c.hasCallback, Status: c.rec.Status}
}

// leaseEvent is an event of kind k about l.
func leaseEvent(k EventKind, l *lease) Event {
	w := l.ctx
	return Event{Kind: k, UserID: w.client.pool.userID, ClientID: w.client.id, ClientType: w.client.typ,
		ContextID: w.id, TaskID: l.taskID, Epoch: l.epoch, ExpiresAt: l.expiresAt.UTC()}
}

// clientEvent is an event of kind k about c.
func clientEvent(k EventKind, c *client) Event {
	return Event{Kind: k, UserID: c.pool.userID, ClientID: c.id, ClientType: c.typ, SessionID: c.sessionID}
}

// deliver hands ev to the registry's telemetry, then to every subscriber.
func (r *Registry) deliver(ev *Event) {
	r.tel.observe(ev)
	r.after.subsMu.Lock()
	subs := r.after.subs
	r.after.subsMu.Unlock()
	for _, s := range subs {
		s.f(*ev)
	}
}

// Subscribe calls f with every event the registry emits from now on, in
// order, on one goroutine of the registry's that Close joins. f must be
// quick and must not block: it delays every later event and every waiting
// caller's resolution. It may call the registry. cancel stops the
// deliveries: after it returns, f is called at most for an event already
// being delivered.
func (r *Registry) Subscribe(f func(Event)) (cancel func()) {
	s := &subscriber{f: f}
	a := &r.after
	a.subsMu.Lock()
	a.subs = append(a.subs[:len(a.subs):len(a.subs)], s)
	a.subsMu.Unlock()
	return func() {
		a.subsMu.Lock()
		defer a.subsMu.Unlock()
		for i, x := range a.subs {
			if x == s {
				// A new slice: a delivery may be iterating over the old one.
				a.subs = append(append([]*subscriber(nil), a.subs[:i]...), a.subs[i+1:]...)
				return
			}
		}
	}
}
