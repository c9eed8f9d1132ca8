package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jonboulle/clockwork"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/protocol"
)

// command is a command admitted and not yet ended.
type command struct {
	rec    cheetah.CommandRecord
	frame  *protocol.Command
	ctx    *wctx
	lease  *lease
	conn   Conn // the connection it was dispatched to
	user   string
	client string

	// dispatchedTo is the client it was dispatched to, whose dispatched
	// set holds it until it ends.
	dispatchedTo *client
	hasCallback  bool // sent with a callback URL

	// durable is set once the record's commit came back (recordDurable):
	// only then is the command announced (CommandAdmitted) and its id
	// told to anyone (invariant 9). dispatched is set when the frame is
	// handed to the connection, which may be before the record is durable.
	durable    bool
	dispatched bool
	acked      bool
	// recorded receives how writing the record fared, once: the sender
	// waits for it before it tells its caller the id.
	recorded chan error
	// holding is set while the record's insert is held back (pending, with
	// the ops decided about the command since), for the terminal message
	// to share its commit; holdTimer ends the hold (Config.InsertDelay).
	holding   bool
	pending   []history.Op
	holdTimer *time.Timer
	// endedEarly is set when the command stopped being tracked (response
	// mode none) before its record was durable: its CommandEnded is
	// emitted after its CommandAdmitted.
	endedEarly bool
	// writeSpan times the record's write (traced commands only).
	writeSpan trace.Span
	// ending is set from the command's end until its terminal status came
	// back from the store; res, terminal and endedAt describe that end.
	ending   bool
	res      cheetah.Resolution
	terminal cheetah.MessageKind
	endedAt  time.Time
	// uncertain is set when the replica fenced (Forget) before the end was
	// durable: a mark of the replica's rows may commit first, and overrule
	// it. Its caller then hears what history holds (resolve). Atomic: a
	// write's callback reads it once the registry closed (endWritten).
	uncertain atomic.Bool
	// preserving is set while a waiting caller holds the lease through this
	// command (invariant 5).
	preserving bool
	// mutation says its context's client did not declare it an
	// observation: a hold on the context waits for it to end.
	mutation bool
	timer    clockwork.Timer
	// resolved receives the resolution once the terminal status is durable.
	resolved chan outcome
	// spans is the command's trace; traced says whether a tracer records
	// it, and the wall* stamps (unix ns, set only when traced) time its
	// span events: the registry's clock may be a test's fake one.
	spans                                commandSpans
	traced                               bool
	wallDispatched, wallAcked, wallEnded int64
}

// outcome is what a waiting send learns: the resolution, or an error when
// its end could not be made durable.
type outcome struct {
	res cheetah.Resolution
	err error
}

// endedCommand is what the registry remembers of a command that ended or
// that nobody tracks any more (response mode none), to place late messages.
type endedCommand struct {
	user, client string
	status       cheetah.Status
	mode         cheetah.ResponseMode
}

// Send admits cmd through handle h and returns once its record is durable.
// Nobody waits for the terminal message.
func (r *Registry) Send(ctx context.Context, h cheetah.Lease, cmd cheetah.Command, so cheetah.SendOptions) (cheetah.Sent, error) {
	if so.ResponseMode == "" || so.ResponseMode == cheetah.ModeRPC {
		// Nobody waits on a plain send, so rpc would promise a waiter that
		// does not exist.
		so.ResponseMode = cheetah.ModeAsync
	}
	c, err := r.admit(ctx, h, cmd, so, false)
	if err != nil {
		return cheetah.Sent{}, err
	}
	// The command may be running on the client already; its id is told
	// only once its record is durable (invariant 9).
	if err := recordErr(<-c.recorded); err != nil {
		return cheetah.Sent{}, err
	}
	return cheetah.Sent{CommandID: c.rec.CommandID, TraceID: c.rec.TraceID}, nil
}

// recordErr is what a sender is told when the record's write failed.
func recordErr(werr error) error {
	if werr == nil {
		return nil
	}
	return cheetah.StoreUnavailable("registry: record command", werr)
}

// SendAndWait admits cmd and waits for its resolution. While it waits, the
// lease cannot expire; when ctx ends first, the command ends cancelled, the
// client is told, and the lease keeps nothing of the wait.
func (r *Registry) SendAndWait(ctx context.Context, h cheetah.Lease, cmd cheetah.Command, so cheetah.SendOptions) (cheetah.Resolution, error) {
	if so.ResponseMode == "" {
		so.ResponseMode = cheetah.ModeRPC
	}
	if so.ResponseMode == cheetah.ModeNone {
		return cheetah.Resolution{}, cheetah.Invalidf("response_mode none has no terminal message to wait for")
	}
	c, err := r.admit(ctx, h, cmd, so, true)
	if err != nil {
		return cheetah.Resolution{}, err
	}
	// First the record: nothing reveals the id before it is durable
	// (invariant 9), and the resolution, durable after it, comes later.
	select {
	case werr := <-c.recorded:
		if err := recordErr(werr); err != nil {
			return cheetah.Resolution{}, err
		}
	case <-ctx.Done():
		r.callerGone(c)
		if err := recordErr(<-c.recorded); err != nil {
			return cheetah.Resolution{}, err
		}
		return cancelledBy(ctx, c), ctx.Err()
	}
	if so.OnAdmitted != nil {
		so.OnAdmitted(cheetah.Sent{CommandID: c.rec.CommandID, TraceID: c.rec.TraceID})
	}
	select {
	case o := <-c.resolved:
		return o.res, o.err
	case <-ctx.Done():
	}
	r.callerGone(c)
	return cancelledBy(ctx, c), ctx.Err()
}

// callerGone ends c cancelled because its waiting caller went away, and
// tells the client.
func (r *Registry) callerGone(c *command) {
	r.mu.Lock()
	r.unpreserve(c, false)
	if r.commands[c.rec.CommandID] == c {
		if c.dispatched {
			c.conn.Send(&protocol.Cancel{CommandID: c.rec.CommandID, Reason: "caller cancelled"})
		}
		r.endCommand(c, cheetah.StatusCancelled, &cheetah.ErrorInfo{Code: "cancelled", Message: "the caller went away"}, nil)
	}
	r.mu.Unlock()
}

// cancelledBy is what a caller that went away is answered: the resolution
// is still made durable and then dropped; this says what ctx said.
func cancelledBy(ctx context.Context, c *command) cheetah.Resolution {
	return cheetah.Resolution{CommandID: c.rec.CommandID, TraceID: c.rec.TraceID, Status: cheetah.StatusCancelled,
		Error: &cheetah.ErrorInfo{Code: "cancelled", Message: ctx.Err().Error()}}
}

// The longest context and task ids a command frame can carry, which its
// size check assumes.
var (
	longestContextID = strings.Repeat("x", protocol.MaxIDLen)
	longestTaskID    = strings.Repeat("x", MaxTaskIDLen)
)

// prepare validates cmd and builds its frame and record outside the lock.
func (r *Registry) prepare(cmd cheetah.Command, so cheetah.SendOptions, sc trace.SpanContext) (*command, error) {
	if cmd.Name == "" || len(cmd.Name) > MaxNameLen {
		return nil, cheetah.Invalidf("name must be 1 to %d bytes", MaxNameLen)
	}
	if err := cheetah.CheckText("name", cmd.Name); err != nil {
		return nil, err
	}
	if !so.ResponseMode.Valid() {
		return nil, cheetah.Invalidf("response_mode %q is not rpc, async or none", so.ResponseMode)
	}
	timeout := so.Timeout
	switch {
	case timeout == 0:
		timeout = r.cfg.DefaultCommandTimeout
	case timeout < time.Millisecond || timeout > MaxCommandTimeout:
		return nil, cheetah.Invalidf("%s", cheetah.MsgTimeout)
	}
	var params json.RawMessage
	switch p := cmd.Params.(type) {
	case nil:
	case json.RawMessage:
		params = p
	default:
		b, err := json.Marshal(p)
		if err != nil {
			return nil, cheetah.Invalidf("params: %v", err)
		}
		params = b
	}
	// A JSON null is no target and no options, as in the HTTP API.
	so.Target, so.Options = nullIsAbsent(so.Target), nullIsAbsent(so.Options)
	// What the store keeps is checked as the HTTP API checks it (depth,
	// duplicate names, UTF-8), so an in-process sender is refused alike.
	// This is the one pass over the command's JSON: the frame is marked
	// checked below, and its encodings do not read it again.
	for _, v := range []struct {
		field string
		b     json.RawMessage
	}{{"params", params}, {"target", so.Target}, {"options", so.Options}} {
		if len(v.b) == 0 {
			continue
		}
		if jerr := protocol.CheckJSON(v.b, cheetah.MaxJSONDepth); jerr != nil {
			if v.field == "params" && !json.Valid(params) {
				return nil, cheetah.Invalidf("params is not valid JSON")
			}
			return nil, cheetah.Invalidf("%s %s", v.field, jerr.Error())
		}
	}
	if err := objectOrNull("target", so.Target); err != nil {
		return nil, err
	}
	if err := objectOrNull("options", so.Options); err != nil {
		return nil, err
	}
	id, err := uuid.NewV7()
	if err != nil {
		return nil, fmt.Errorf("registry: command id: %w", err)
	}
	// The command span's context for now; once the record is durable the
	// dispatch span's takes its place (same length, so the size check
	// below holds).
	traceID := sc.TraceID().String()
	f := &protocol.Command{
		CommandID: id.String(), Name: cmd.Name, Params: params, Target: so.Target,
		ResponseMode: so.ResponseMode, TimeoutMS: timeout.Milliseconds(),
		Options: so.Options, Traceparent: traceparent(sc),
	}
	f.MarkJSONChecked() // params, target and options, above
	// A frame the client would refuse as too large is refused here, before
	// anything is recorded. The context, task and epoch are not known yet,
	// so the check sizes them at their longest, set for it and cleared.
	f.ContextID, f.TaskID, f.Epoch = longestContextID, longestTaskID, math.MaxInt64
	n, err := protocol.EncodedLen(f)
	f.ContextID, f.TaskID, f.Epoch = "", "", 0
	if err != nil {
		return nil, cheetah.Invalidf("command: %v", err)
	}
	if n > r.cfg.MaxMessageBytes {
		return nil, &cheetah.Error{Code: cheetah.CodePayloadTooLarge, Message: fmt.Sprintf("the command frame would exceed %d bytes", r.cfg.MaxMessageBytes)}
	}
	return &command{
		frame: f,
		rec: cheetah.CommandRecord{
			CommandID: f.CommandID, Name: cmd.Name, Params: params, Target: so.Target,
			Options: so.Options, ResponseMode: so.ResponseMode, Status: cheetah.StatusAdmitted,
			TraceID: traceID,
		},
	}, nil
}

func nullIsAbsent(m json.RawMessage) json.RawMessage {
	if t := strings.TrimSpace(string(m)); t == "" || t == "null" {
		return nil
	}
	return m
}

func objectOrNull(field string, v json.RawMessage) error {
	if len(v) == 0 {
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(v, &m); err != nil {
		return cheetah.Invalidf("%s must be a JSON object", field)
	}
	return nil
}

// admit checks ownership, takes the command's place in its context's
// order, enqueues its record and dispatches it, all in one step under the
// lock (admitLocked). Dispatch overlaps the record's commit (invariant 9):
// the insert is handed to the store through the ordered outbox, before
// anything else about the command, and the frame goes to the client at
// once. What the caller is told waits for the record (c.recorded).
//
// The command's trace starts here: a command span from admission to the
// terminal status, with an admission span (the ownership check), a span
// for the record's write, and a dispatch span that the command frame's
// traceparent names, so the client's own span is its child.
func (r *Registry) admit(ctx context.Context, h cheetah.Lease, cmd cheetah.Command, so cheetah.SendOptions, wait bool) (*command, error) {
	ctx, spans := r.tel.startCommand(ctx, cmd, so.ResponseMode)
	c, err := r.prepare(cmd, so, spans.sc)
	if err != nil {
		spans.failed(err)
		return nil, err
	}
	c.spans, c.traced = spans, spans.cmd.IsRecording()
	c.hasCallback = so.CallbackURL != ""
	if c.traced {
		c.spans.cmd.SetAttributes(spanCommandID.String(c.rec.CommandID))
	}
	if err := r.admitCommand(ctx, c, h, so, wait); err != nil {
		c.spans.failed(err)
		return nil, err
	}
	return c, nil
}

// admitCommand runs admitLocked in the admission span. The spans that
// outlive it (the record's write, the dispatch) start before, off the lock:
// the frame names the dispatch span, and the lock hands the frame over.
func (r *Registry) admitCommand(ctx context.Context, c *command, h cheetah.Lease, so cheetah.SendOptions, wait bool) error {
	_, span := r.tel.tracer.Start(ctx, "cheetah.admit")
	defer span.End()
	if c.traced {
		_, c.writeSpan = r.tel.tracer.Start(context.WithoutCancel(ctx), "cheetah.history.write")
	}
	_, dispatch := r.tel.tracer.Start(ctx, "cheetah.dispatch", trace.WithSpanKind(trace.SpanKindProducer))
	dsc := dispatch.SpanContext()
	if !dsc.IsValid() {
		dsc = c.spans.sc
	}
	c.frame.Traceparent = traceparent(dsc)
	c.spans.dispatch = dispatch
	l, err := r.admitLocked(c, h, so, wait, r.insertHold())
	if _, lost := err.(*cheetah.LeaseLostError); lost {
		err = r.showing(ctx, err)
	}
	if err != nil {
		if c.writeSpan != nil {
			c.writeSpan.End()
		}
		if c.traced {
			why := "refused"
			if errors.Is(err, cheetah.ErrOverloaded) && err != errShuttingDown {
				why = "overloaded"
			}
			span.SetStatus(codes.Error, why)
		}
		return err
	}
	if c.traced {
		// c.rec's identity fields are set once, by admitLocked.
		span.SetAttributes(spanUserID.String(c.rec.UserID), spanClientID.String(c.rec.ClientID),
			spanContextID.String(c.rec.ContextID), spanTaskID.String(c.rec.TaskID), spanEpoch.Int64(c.rec.Epoch))
		if l.acquired.IsValid() {
			// The lease's acquire is another trace (or another part of the
			// caller's): the command links to it.
			c.spans.cmd.AddLink(trace.Link{SpanContext: l.acquired})
		}
	}
	return nil
}

// admitLocked is admission, in one step under the lock: the ownership
// check (invariant 2), the renewal on use, the lease's preservation for a
// waiting caller (invariant 5), the record's insert handed to the outbox
// (or held back, see Config.InsertDelay) and the dispatch, in admission
// order per context (invariant 7).
func (r *Registry) admitLocked(c *command, h cheetah.Lease, so cheetah.SendOptions, wait bool, hold time.Duration) (*lease, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l, err := r.check(h)
	if err == nil && r.draining {
		err = errShuttingDown
	}
	if err != nil {
		return nil, err
	}
	w := l.ctx
	if r.cfg.MaxInFlightPerContext > 0 && w.inflight >= r.cfg.MaxInFlightPerContext {
		return nil, &cheetah.Error{Code: cheetah.CodeOverloaded, Message: fmt.Sprintf("the context already has %d commands in flight", w.inflight)}
	}
	c.mutation = w.isMutation(c.rec.Name)
	if c.mutation && w.hold != nil {
		// A person holds the context: mutations are fenced, pending or
		// active (DESIGN §10); nothing is recorded or dispatched.
		return nil, fenced(w)
	}
	now := r.clock.Now()
	c.ctx, c.lease, c.user, c.client = w, l, w.client.pool.userID, w.client.id
	c.frame.ContextID, c.frame.TaskID, c.frame.Epoch = w.id, l.taskID, l.epoch
	if len(c.frame.Target) == 0 {
		// The context's default tab, only when the sender named no
		// target. It needs no check before it is sent (the frame is
		// marked checked): the registry encoded it itself.
		c.frame.Target = w.defaultTarget()
		c.rec.Target = c.frame.Target
	}
	c.rec.UserID, c.rec.ClientID, c.rec.ContextID = c.user, c.client, w.id
	c.rec.TaskID, c.rec.Epoch, c.rec.CreatedAt = l.taskID, l.epoch, now.UTC()
	if c.rec.ResponseMode != cheetah.ModeNone {
		c.resolved = make(chan outcome, 1)
	}
	c.recorded = make(chan error, 1)
	if wait {
		c.preserving = true
		r.preserveLease(l)
	}
	if l.renewOnUse {
		r.extend(l, now)
	}
	r.commands[c.rec.CommandID] = c
	w.inflight++
	if c.mutation {
		w.mutating++
	}

	conn := w.client.conn
	live := w.live && conn != nil && w.client.contexts[w.id] == w
	if live {
		// Dispatched now, so inserted dispatched: no status change of its
		// own to commit.
		at := now.UTC()
		c.rec.Status, c.rec.DispatchedAt = cheetah.StatusDispatched, &at
	}
	insert := history.InsertCommand{Rec: c.rec, CallbackURL: so.CallbackURL, CallbackKeyID: so.CallbackKeyID}
	if wait && live && hold > 0 {
		// Someone waits for the record and the terminal message: a client
		// that answers within the hold makes them one commit.
		c.holding, c.pending = true, []history.Op{insert}
		c.holdTimer = time.AfterFunc(hold, func() { r.endHold(c) })
	} else {
		r.write(func(err error) { r.recordWritten(c, err) }, insert)
	}
	if !live {
		// Not reachable through check, which confirms liveness; kept so
		// that a command is never left without an end.
		r.endCommand(c, cheetah.StatusDisconnected, &cheetah.ErrorInfo{Code: "disconnected", Message: "the context was not live at dispatch"}, nil)
		return l, nil
	}
	r.dispatch(c, conn, now)
	return l, nil
}

// insertHold is how long a waited command's record is held back for its
// terminal message (Config.InsertDelay): the store's recent commit time,
// within InsertDelay and MaxInsertDelay; zero or less holds nothing. A record
// handed to a store that takes that long per commit would, as a rule, wait
// for the commit in flight and then its own; held instead, it shares its
// terminal's commit when the answer comes within one commit's time, and is
// handed over at most one commit's time later when it does not.
func (r *Registry) insertHold() time.Duration {
	floor := r.cfg.InsertDelay
	if floor <= 0 {
		return floor
	}
	return min(max(floor, r.store.CommitTime()), max(floor, r.cfg.MaxInsertDelay))
}

// endHold ends c's hold when Config.InsertDelay passed first: its insert,
// and what was decided about it since, go to the outbox.
func (r *Registry) endHold(c *command) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.releaseHeld(c, nil)
}

// releaseHeld hands c's held ops to the outbox as one write, followed by
// ops (its end, when one is decided), with done learning how they fared
// after the record's callback; r.mu is held. It does nothing when c holds
// nothing and there are no ops.
func (r *Registry) releaseHeld(c *command, done func(error), ops ...history.Op) {
	if !c.holding {
		if len(ops) > 0 {
			r.write(done, ops...)
		}
		return
	}
	c.holding = false
	if c.holdTimer != nil {
		c.holdTimer.Stop()
		c.holdTimer = nil
	}
	all := append(c.pending, ops...)
	c.pending = nil
	r.write(func(err error) {
		r.recordWritten(c, err)
		if done != nil {
			done(err)
		}
	}, all...)
}

// writeFor writes ops about command c after its record: held with it while
// the record is held, or to the outbox; r.mu is held.
func (r *Registry) writeFor(c *command, ops ...history.Op) {
	if c.holding {
		c.pending = append(c.pending, ops...)
		return
	}
	r.write(nil, ops...)
}

// recordWritten is the store's callback for a command's record: err is how
// writing it fared. Like endWritten, it only queues it for notifyLoop.
func (r *Registry) recordWritten(c *command, err error) {
	r.after.endsMu.Lock()
	if !r.after.endsClosed {
		r.after.ends = append(r.after.ends, durableEnd{c: c, err: err, record: true})
		r.after.endsMu.Unlock()
		kick(r.after.notifKick)
		return
	}
	r.after.endsMu.Unlock()
	// Close ended the write span.
	select {
	case c.recorded <- err:
	default:
	}
}

// recordTold ends the record's write span and tells the sender how the
// write fared. It never blocks.
func (r *Registry) recordTold(c *command, err error) {
	if c.writeSpan != nil {
		if err != nil {
			c.writeSpan.SetStatus(codes.Error, err.Error())
		}
		c.writeSpan.End()
	}
	select {
	case c.recorded <- err:
	default:
	}
}

// recordDurable acts on the record's write once it came back; r.mu is
// held. A durable record announces the command: CommandAdmitted, then
// CommandDispatched (and CommandEnded when it ended untracked meanwhile).
// A record that could not be written leaves a command the client was
// already sent, whose id nobody will be told: the client is sent a cancel
// and the command ends cancelled (store_unavailable). Its insert and end
// are held by the store while the database does not answer and written
// once it does, so history may show it later, cancelled (docs/behaviour.md).
func (r *Registry) recordDurable(c *command, werr error) {
	if werr == nil {
		c.durable = true
		if r.closed {
			return // Close ended it unannounced
		}
		ev := r.commandEvent(CommandAdmitted, c)
		ev.Status = cheetah.StatusAdmitted
		r.emit(ev)
		if c.dispatched {
			ev = r.commandEvent(CommandDispatched, c)
			ev.Status = cheetah.StatusDispatched
			if c.rec.DispatchedAt != nil {
				ev.At = *c.rec.DispatchedAt
			}
			r.emit(ev)
		}
		if c.endedEarly {
			r.emitEnded(c, false)
		}
		return
	}
	if r.closed {
		return
	}
	id := c.rec.CommandID
	if c.dispatched && (r.commands[id] == c || c.endedEarly) {
		// Sent, and not ended by the client nor by the broker (response
		// mode none has no end): the client stops it.
		c.conn.Send(&protocol.Cancel{CommandID: id, Reason: "the broker could not record the command"})
	}
	if r.commands[id] == c {
		r.unpreserve(c, false)
		r.endCommand(c, cheetah.StatusCancelled, &cheetah.ErrorInfo{Code: cheetah.CodeStoreUnavailable,
			Message: "the command's record could not be written; its sender was told store_unavailable"}, nil)
	}
}

// errShuttingDown refuses new work once Drain was called.
var errShuttingDown = &cheetah.Error{Code: cheetah.CodeOverloaded, Message: "the broker is shutting down"}

// untrack drops c from the commands in flight and from its client's
// dispatched commands; r.mu is held. It is the bookkeeping half of a
// command's end: endCommand calls it, and so does a command of response
// mode none once dispatched, which has no end to wait for.
func (r *Registry) untrack(c *command) {
	delete(r.commands, c.rec.CommandID)
	if c.dispatchedTo != nil {
		delete(c.dispatchedTo.dispatched, c)
		c.dispatchedTo = nil
	}
	c.ctx.inflight--
	if c.mutation {
		r.mutationEnded(c.ctx)
	}
	if r.draining && len(r.commands) == 0 && r.idle != nil {
		close(r.idle)
		r.idle = nil
	}
}

// dispatch hands c's frame to conn, its context's live connection; r.mu
// is held. It runs at admission, in admission order per context
// (invariant 7), before the record is durable; CommandDispatched is
// emitted once it is.
func (r *Registry) dispatch(c *command, conn Conn, now time.Time) {
	w := c.ctx
	c.conn, c.dispatched = conn, true
	c.dispatchedTo = w.client
	w.client.dispatched[c] = struct{}{}
	if c.traced {
		c.wallDispatched = time.Now().UnixNano()
	}
	if c.rec.ResponseMode != cheetah.ModeNone {
		// The timeout runs from dispatch; it is armed before the frame
		// leaves so that no answer can beat it.
		c.timer = r.afterFunc(time.Duration(c.frame.TimeoutMS)*time.Millisecond, func() {
			r.endCommand(c, cheetah.StatusTimedOut, &cheetah.ErrorInfo{Code: "timed_out", Message: fmt.Sprintf("no terminal message within %d ms", c.frame.TimeoutMS)}, nil)
		})
	}
	sealNotices(w.client) // later notices follow the command
	if !conn.Send(c.frame) {
		// The connection's queue is full: it is closing itself, and the
		// command ends with it.
		r.endCommand(c, cheetah.StatusDisconnected, &cheetah.ErrorInfo{Code: "disconnected", Message: "the client does not read"}, nil)
		return
	}
	if c.rec.ResponseMode == cheetah.ModeNone {
		// Nothing more is expected; untrack it but remember where it went.
		r.untrackNone(c, now)
	}
}

// untrackNone drops a command of response mode none, which has no end to
// wait for, once dispatched (or interrupted); r.mu is held. Its status stays
// what it is in history.
func (r *Registry) untrackNone(c *command, now time.Time) {
	r.untrack(c)
	r.endedCommands.put(c.rec.CommandID, endedCommand{user: c.user, client: c.client, status: c.rec.Status, mode: cheetah.ModeNone}, now)
	c.res = cheetah.Resolution{CommandID: c.rec.CommandID, TraceID: c.rec.TraceID, Status: c.rec.Status}
	c.endedAt = now
	if c.traced {
		c.wallEnded = c.wallDispatched
	}
	r.emitEndedUntracked(c)
	r.endSpansLater(c, c.rec.Status, nil, "")
}

// emitEndedUntracked emits the CommandEnded of a command that stopped being
// tracked without an end of its own (response mode none): now when it is
// announced, else after its CommandAdmitted; r.mu is held.
func (r *Registry) emitEndedUntracked(c *command) {
	if c.durable {
		r.emitEnded(c, false)
	} else {
		c.endedEarly = true
	}
}

// endCommand ends c with status: the broker's own decision (a timeout, a
// disconnect, a cancel, an interrupt), or the client's terminal message msg.
// r.mu is held. The command is untracked at once and its terminal status
// (after msg, when there is one) is queued for the store; once that is
// durable, the waiting caller (if any) learns the resolution, so that a
// history read then already shows it (invariant 8), and CommandEnded is
// emitted. Ending a command that already ended does nothing.
func (r *Registry) endCommand(c *command, status cheetah.Status, e *cheetah.ErrorInfo, msg *history.AppendMessage) {
	id := c.rec.CommandID
	if r.commands[id] != c {
		return
	}
	r.untrack(c)
	if c.timer != nil {
		c.timer.Stop()
	}
	if c.traced {
		c.wallEnded = time.Now().UnixNano()
	}
	now := r.clock.Now()
	r.endedCommands.put(id, endedCommand{user: c.user, client: c.client, status: status, mode: c.rec.ResponseMode}, now)
	ops := make([]history.Op, 0, 2)
	if msg != nil {
		ops = append(ops, *msg)
		c.terminal = msg.Msg.Kind
	}
	ops = append(ops, history.SetStatus{CommandID: id, Status: status, Error: e, At: now})
	c.res = cheetah.Resolution{CommandID: id, TraceID: c.rec.TraceID, Status: status, Error: e}
	c.endedAt = now
	c.ending = true
	r.ending[c] = struct{}{}
	// With the record when it is still held: one commit for both.
	r.releaseHeld(c, func(werr error) { r.endWritten(c, werr) }, ops...)
}

// unpreserve drops c's hold on its lease; r.mu is held. When the caller
// still wants the lease (renew), it is renewed for its TTL from now;
// otherwise its deadline stands and it may expire at once.
func (r *Registry) unpreserve(c *command, renew bool) {
	if !c.preserving {
		return
	}
	c.preserving = false
	r.unpreserveLease(c.lease, renew)
}

// heapRemove takes l out of the deadline heap; r.mu is held.
func heapRemove(r *Registry, l *lease) { heapRemoveAt(&r.heap, l.heapIndex) }
