package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
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

	durable    bool
	dispatched bool
	acked      bool
	// ending is set from the command's end until its terminal status came
	// back from the store; res, terminal and endedAt describe that end.
	ending   bool
	res      cheetah.Resolution
	terminal cheetah.MessageKind
	endedAt  time.Time
	// preserving is set while a waiting caller holds the lease through this
	// command (invariant 5).
	preserving bool
	timer      clockwork.Timer
	// resolved receives the resolution once the terminal status is durable.
	resolved chan outcome
	// spans is the command's trace; traced says whether a tracer records
	// it, and the wall* stamps (unix ns, set only when traced) time its
	// span events: the registry's clock may be a test's fake one.
	spans                                commandSpans
	traced                               bool
	wallDispatched, wallAcked, wallEnded int64
	// notice, when set, makes this queue entry a frame about the context
	// (an assignment change) rather than a command. It waits its turn
	// behind commands not yet dispatched, so the client sees commands and
	// assignment changes in the order they happened.
	notice protocol.Frame
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
	return cheetah.Sent{CommandID: c.rec.CommandID, TraceID: c.rec.TraceID}, nil
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
	select {
	case o := <-c.resolved:
		return o.res, o.err
	case <-ctx.Done():
	}
	r.mu.Lock()
	r.unpreserve(c, false)
	if r.commands[c.rec.CommandID] == c {
		if c.dispatched {
			c.conn.Send(&protocol.Cancel{CommandID: c.rec.CommandID, Reason: "caller cancelled"})
		}
		r.endCommand(c, cheetah.StatusCancelled, &cheetah.ErrorInfo{Code: "cancelled", Message: "the caller went away"}, nil)
	}
	r.mu.Unlock()
	// The caller is gone; the resolution is still made durable and then
	// dropped. Report what the caller's context said.
	return cheetah.Resolution{CommandID: c.rec.CommandID, TraceID: c.rec.TraceID, Status: cheetah.StatusCancelled,
		Error: &cheetah.ErrorInfo{Code: "cancelled", Message: ctx.Err().Error()}}, ctx.Err()
}

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
	if params != nil && !json.Valid(params) {
		return nil, cheetah.Invalidf("params is not valid JSON")
	}
	// A JSON null is no target and no options, as in the HTTP API.
	so.Target, so.Options = nullIsAbsent(so.Target), nullIsAbsent(so.Options)
	// What the store keeps is checked as the HTTP API checks it (depth,
	// duplicate names, UTF-8), so an in-process sender is refused alike.
	for _, v := range []struct {
		field string
		b     json.RawMessage
	}{{"params", params}, {"target", so.Target}, {"options", so.Options}} {
		if len(v.b) == 0 {
			continue
		}
		if jerr := protocol.CheckJSON(v.b, cheetah.MaxJSONDepth); jerr != nil {
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
	// A frame the client would refuse as too large is refused here, before
	// anything is recorded. The context, task and epoch are not known yet,
	// so the check sizes them at their longest.
	probe := *f
	probe.ContextID, probe.TaskID, probe.Epoch = strings.Repeat("x", 128), strings.Repeat("x", MaxTaskIDLen), math.MaxInt64
	if b, err := protocol.Encode(&probe); err != nil {
		return nil, cheetah.Invalidf("command: %v", err)
	} else if len(b) > r.cfg.MaxMessageBytes {
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

// admit runs a send in three phases: admitCommand checks ownership and
// takes the command's place in its context's FIFO under the lock,
// recordCommand writes its record durably outside it, and dispatchCommand
// dispatches the durable prefix of the FIFO under the lock again.
//
// The command's trace starts here: a command span from admission to the
// terminal status, with an admission span (the ownership check and the
// FIFO), a span for the durable write, and a dispatch span that the
// command frame's traceparent names, so the client's own span is its child.
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
	if err := r.admitCommand(ctx, c, h, wait); err != nil {
		c.spans.failed(err)
		return nil, err
	}
	werr := r.recordCommand(ctx, c, so)
	if werr == nil && wait && so.OnAdmitted != nil {
		// Before dispatch, so that the caller hears of the command (the HTTP
		// API flushes its id in the answer's headers) before the client can.
		so.OnAdmitted(cheetah.Sent{CommandID: c.rec.CommandID, TraceID: c.rec.TraceID})
	}
	if err := r.dispatchCommand(ctx, c, werr); err != nil {
		return nil, err
	}
	return c, nil
}

// admitCommand is admission's first phase, in one step under the lock: the
// ownership check (invariant 2), the renewal on use, the lease's
// preservation for a waiting caller (invariant 5) and the command's place
// in its context's FIFO (invariant 7).
func (r *Registry) admitCommand(ctx context.Context, c *command, h cheetah.Lease, wait bool) error {
	_, span := r.tel.tracer.Start(ctx, "cheetah.admit")
	defer span.End()
	l, err := r.admitLocked(c, h, wait)
	if err != nil {
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
		// Off the lock: c.rec is read by nobody else until it is durable.
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

// admitLocked is admitCommand's critical section.
func (r *Registry) admitLocked(c *command, h cheetah.Lease, wait bool) (*lease, error) {
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
	now := r.clock.Now()
	c.ctx, c.lease, c.user, c.client = w, l, w.client.pool.userID, w.client.id
	c.frame.ContextID, c.frame.TaskID, c.frame.Epoch = w.id, l.taskID, l.epoch
	if len(c.frame.Target) == 0 {
		// The context's default tab, only when the sender named no target.
		c.frame.Target, _ = json.Marshal(map[string]string{"tab_id": w.tabID})
		c.rec.Target = c.frame.Target
	}
	c.rec.UserID, c.rec.ClientID, c.rec.ContextID = c.user, c.client, w.id
	c.rec.TaskID, c.rec.Epoch, c.rec.CreatedAt = l.taskID, l.epoch, now.UTC()
	if c.rec.ResponseMode != cheetah.ModeNone {
		c.resolved = make(chan outcome, 1)
	}
	if wait {
		c.preserving = true
		l.preserve++
		if l.heapIndex >= 0 {
			heapRemove(r, l)
		}
	}
	if l.renewOnUse {
		r.extend(l, now)
	}
	w.queue = append(w.queue, c)
	r.commands[c.rec.CommandID] = c
	w.inflight++
	return l, nil
}

// recordCommand is admission's second phase, outside the lock: the
// command's record is written whatever the caller does meanwhile, since
// once admitted a command is either durable and dispatched or fully undone.
// Nothing else reads c.rec until the command is marked durable.
func (r *Registry) recordCommand(ctx context.Context, c *command, so cheetah.SendOptions) error {
	writeCtx, span := r.tel.tracer.Start(context.WithoutCancel(ctx), "cheetah.history.write")
	defer span.End()
	err := r.store.Write(writeCtx, history.InsertCommand{Rec: c.rec, CallbackURL: so.CallbackURL, CallbackKeyID: so.CallbackKeyID})
	if err != nil && c.traced {
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}

// dispatchCommand is admission's last phase, under the lock: a command
// whose record is durable is dispatched with the durable prefix of its
// context's FIFO; one whose record could not be written is undone.
func (r *Registry) dispatchCommand(ctx context.Context, c *command, werr error) error {
	var dispatch trace.Span
	if werr == nil {
		// The frame is read by nobody until the command is marked durable
		// below, under the lock.
		_, dispatch = r.tel.tracer.Start(ctx, "cheetah.dispatch", trace.WithSpanKind(trace.SpanKindProducer))
		dsc := dispatch.SpanContext()
		if !dsc.IsValid() {
			dsc = c.spans.sc
		}
		c.frame.Traceparent = traceparent(dsc)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if werr != nil {
		r.unpreserve(c, false)
		r.removeQueued(c)
		if r.commands[c.rec.CommandID] == c {
			// Never announced: its id was revealed to nobody.
			r.untrack(c)
		}
		r.flushQueue(c.ctx)
		err := cheetah.StoreUnavailable("registry: record command", werr)
		c.spans.failed(err)
		return err
	}
	c.durable = true
	if r.commands[c.rec.CommandID] != c {
		// Ended meanwhile (Close): its spans are closed.
		dispatch.End()
		return nil
	}
	c.spans.dispatch = dispatch
	// Announced only now: anything that reveals a command id waits for its
	// record's commit (invariant 9).
	r.emit(r.commandEvent(CommandAdmitted, c))
	if r.interrupting {
		// Interrupt came while the record was being written: it ends now
		// that it is durable.
		r.interrupt(c)
		return nil
	}
	r.flushQueue(c.ctx)
	return nil
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
	if r.draining && len(r.commands) == 0 && r.idle != nil {
		close(r.idle)
		r.idle = nil
	}
}

func (r *Registry) removeQueued(c *command) {
	q := c.ctx.queue
	for i, x := range q {
		if x == c {
			c.ctx.queue = append(q[:i], q[i+1:]...)
			return
		}
	}
}

// flushQueue dispatches the durable prefix of w's FIFO; r.mu is held. A
// context that is not live any more ends its queued commands disconnected.
func (r *Registry) flushQueue(w *wctx) {
	for len(w.queue) > 0 && w.queue[0].durable {
		c := w.queue[0]
		w.queue[0] = nil
		w.queue = w.queue[1:]
		if c.notice != nil {
			r.sendQueuedNotice(w.client, c.notice)
			continue
		}
		if r.commands[c.rec.CommandID] != c {
			continue // ended while it waited for its record
		}
		conn := w.client.conn
		if !w.live || conn == nil || w.client.contexts[w.id] != w {
			r.endCommand(c, cheetah.StatusDisconnected, &cheetah.ErrorInfo{Code: "disconnected", Message: "the context was not live at dispatch"}, nil)
			continue
		}
		now := r.clock.Now()
		c.conn, c.dispatched = conn, true
		c.dispatchedTo = w.client
		w.client.dispatched[c] = struct{}{}
		if c.traced {
			c.wallDispatched = time.Now().UnixNano()
		}
		c.rec.Status = cheetah.StatusDispatched
		r.write(nil, history.SetStatus{CommandID: c.rec.CommandID, Status: cheetah.StatusDispatched, At: now})
		r.emit(r.commandEvent(CommandDispatched, c))
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
			continue
		}
		if c.rec.ResponseMode == cheetah.ModeNone {
			// Nothing more is expected; untrack it but remember where it went.
			r.untrackNone(c, now)
		}
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
	r.emitEnded(c, false)
	r.endSpansLater(c, c.rec.Status, nil, "")
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
	r.write(func(werr error) { r.endWritten(c, werr) }, ops...)
}

// unpreserve drops c's hold on its lease; r.mu is held. When the caller
// still wants the lease (renew), it is renewed for its TTL from now;
// otherwise its deadline stands and it may expire at once.
func (r *Registry) unpreserve(c *command, renew bool) {
	if !c.preserving {
		return
	}
	c.preserving = false
	l := c.lease
	l.preserve--
	if r.leases[l.key] != l || l.preserve > 0 {
		return
	}
	if renew {
		l.expiresAt = r.clock.Now().Add(l.ttl)
	}
	r.pushDeadline(l)
}

// heapRemove takes l out of the deadline heap; r.mu is held.
func heapRemove(r *Registry, l *lease) { heapRemoveAt(&r.heap, l.heapIndex) }
