package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/cheetahbroker/cheetah/protocol"
)

// Error codes the agent puts in error frames. Handlers may use any code of
// their own through CommandError.
const (
	CodeUnknownContext     = "unknown_context"      // the command names a context the agent does not offer
	CodeUnknownCommandName = "unknown_command_name" // no handler is registered for the name
	CodeInvalidParams      = "invalid_params"       // the params do not fit the command
	CodeTimeout            = "timeout"              // the command's timeout_ms passed
	CodeCancelled          = "cancelled"            // the broker cancelled the command, or the agent stopped
	CodeFailed             = "failed"               // the handler returned an error that is not a *CommandError
	CodeInternal           = "internal"             // the handler panicked
	CodeResultTooLarge     = "result_too_large"     // the result does not fit in one frame
	CodeNotAllowed         = "not_allowed"          // Exec: the program is not on the allowlist
	CodeExecFailed         = "exec_failed"          // Exec: the program could not be started
	CodeNoRoom             = "no_room"              // create_failed: the agent holds MaxFlows flows already
)

// maxMessageLen caps the message of an error frame. Error texts can embed
// whatever a program printed; the broker stores them in history and shows
// them in resolutions, where a short text serves better.
const maxMessageLen = 4096

// Handler runs one command. The context ends when the command is cancelled,
// when its timeout_ms passes, or when the agent stops; a handler should then
// return promptly. The result is sent as the data of a result frame, encoded
// with encoding/json (a json.RawMessage is sent byte for byte). An error is
// sent as an error frame: return a *CommandError to choose its code.
//
// Handlers of one context run one at a time, so a handler may keep state
// about its context without locking; handlers of different contexts run
// concurrently.
type Handler func(ctx context.Context, cmd *protocol.Command, out Output) (result any, err error)

// Output sends a running command's intermediate messages. Its methods are
// safe for concurrent use. They return ErrNotConnected when the agent is
// between connections (the message is lost), an error wrapping ErrTooLarge
// when the frame would exceed the broker's max_message_bytes (nothing was
// sent; send less), and ErrCommandDone once the handler has returned.
type Output interface {
	// Progress sends a progress frame with data encoded as JSON.
	Progress(data any) error
	// Event sends a named event frame with data encoded as JSON.
	Event(name string, data any) error
	// Capture sends binary output, such as a screenshot, of the given MIME
	// type.
	Capture(mime string, b []byte) error
}

// CommandError is an error a handler returns to end its command with an
// error frame carrying Code, Message and Data (encoded as JSON).
type CommandError struct {
	Code    string
	Message string
	Data    any
}

func (e *CommandError) Error() string {
	if e.Message == "" {
		return e.Code
	}
	return e.Code + ": " + e.Message
}

// ParseParams decodes the command's params into v. It is strict, because a
// misspelt field silently ignored is a command that does something else
// than asked: an unknown field or a value of the wrong kind is an error.
// Absent params decode as an empty object. The error is a *CommandError
// with code invalid_params, which a handler can return as it is.
func ParseParams(cmd *protocol.Command, v any) error {
	params := []byte(cmd.Params)
	if len(params) == 0 {
		params = []byte("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(params))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &CommandError{Code: CodeInvalidParams, Message: "params: " + err.Error()}
	}
	return nil
}

// Job states. A job moves from queued to running when its flow's worker
// takes it, or from queued straight to done when it is cancelled first.
const (
	jobQueued int32 = iota
	jobRunning
	jobDone
)

// job is one accepted command.
type job struct {
	cmd     *protocol.Command
	handler Handler
	ctx     context.Context
	cancel  context.CancelCauseFunc
	stop    context.CancelFunc // ends the timeout's context, if the command has a timeout
	state   atomic.Int32
	span    trace.Span   // the client side of the command's trace
	log     *slog.Logger // the session's; logger names the command

	// sess is the connection the command came on, which its ack goes
	// out on: with the command's first message (sendFor), or alone once
	// the agent's ackWithin passed (ackTimer), whichever takes it first
	// (takeAck). ackMu guards acked and ackTimer, and is held by the one
	// who took the ack until it is sent.
	sess     *session
	ackMu    sync.Mutex
	acked    bool
	ackTimer *time.Timer
}

// defaultAckWithin is how long a command's ack waits to go out in one
// write with the command's first message, usually its result: a command
// that ends quickly costs the agent and the broker one write and one
// wake-up less. A command still running then is acknowledged on its own.
const defaultAckWithin = 10 * time.Millisecond

// timeoutError is the cause of a command context that hit timeout_ms.
type timeoutError struct{ after time.Duration }

func (e *timeoutError) Error() string { return fmt.Sprintf("command timed out after %s", e.after) }

// cancelError is the cause of a command context the broker cancelled.
type cancelError struct{ reason string }

func (e *cancelError) Error() string {
	if e.reason == "" {
		return "command cancelled by the broker"
	}
	return "command cancelled by the broker: " + e.reason
}

// panicError reports a handler that panicked.
type panicError struct{ value any }

func (e *panicError) Error() string { return fmt.Sprintf("handler panicked: %v", e.value) }

// flow is one console context and its FIFO of commands. One worker per flow
// runs its commands one at a time, which is what DESIGN §2.7 asks of a
// client; the queue is unbounded so that the reader, which must never block,
// can always hand a command over.
type flow struct {
	id, tabID string
	mu        sync.Mutex
	queue     []*job
	wake      chan struct{} // holds one token when the queue may be non-empty
}

func newFlow(id, tabID string) *flow {
	return &flow{id: id, tabID: tabID, wake: make(chan struct{}, 1)}
}

func (f *flow) push(j *job) {
	f.mu.Lock()
	f.queue = append(f.queue, j)
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default: // a wake-up is already pending
	}
}

func (f *flow) pop() *job {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.queue) == 0 {
		return nil
	}
	j := f.queue[0]
	f.queue[0] = nil
	f.queue = f.queue[1:]
	return j
}

// serve runs the flow's commands until quit is closed, which Run does once
// nothing can queue commands any more. The commands still queued then have
// contexts that ended with Run's, so running them only reports them
// cancelled and releases them.
func (f *flow) serve(quit <-chan struct{}, run func(*job)) {
	for {
		if j := f.pop(); j != nil {
			run(j)
			continue
		}
		select {
		case <-f.wake:
		case <-quit:
			for j := f.pop(); j != nil; j = f.pop() {
				run(j)
			}
			return
		}
	}
}

// onCommand accepts a command from the broker. It runs on the reading
// goroutine, so it only acknowledges, checks and queues; handlers run on the
// flows' workers.
func (a *Agent) onCommand(ctx context.Context, s *session, cmd *protocol.Command) {
	ctx, span := a.startSpan(ctx, cmd)
	j := &job{cmd: cmd, span: span, log: s.log, sess: s}
	a.acks.Add(1) // done by whoever takes the ack, once it is sent
	j.ackMu.Lock()
	j.ackTimer = time.AfterFunc(a.ackWithin, func() {
		if a.takeAck(j) {
			a.sendAck(j)
		}
	})
	j.ackMu.Unlock()
	f := a.flow(cmd.ContextID)
	if f == nil {
		a.reject(j, CodeUnknownContext, fmt.Sprintf("this agent has no context %q", cmd.ContextID))
		return
	}
	h := a.handler(cmd.Name)
	if h == nil {
		a.reject(j, CodeUnknownCommandName, fmt.Sprintf("this agent has no command %q", cmd.Name))
		return
	}
	j.start(ctx, h)
	a.mu.Lock()
	_, dup := a.jobs[cmd.CommandID]
	if !dup {
		a.jobs[cmd.CommandID] = j
	}
	a.mu.Unlock()
	if dup {
		// The broker dispatches a command once; a repeat is a broker bug, and
		// running the command twice would be worse than ignoring it.
		j.logger(a).Warn("agent: ignoring a repeated command id")
		span.SetStatus(codes.Error, "repeated command id")
		span.End()
		if a.takeAck(j) {
			a.sendAck(j)
		}
		j.release()
		return
	}
	if j.log.Enabled(ctx, slog.LevelDebug) {
		j.logger(a).Debug("agent: command queued")
	}
	f.push(j)
}

// start gives j its handler and its context, a child of ctx.
func (j *job) start(ctx context.Context, h Handler) {
	j.handler = h
	j.ctx, j.cancel = context.WithCancelCause(ctx)
	if j.cmd.TimeoutMS > 0 {
		// The deadline counts from arrival, not from the start of the
		// handler: the caller's wait began even earlier, and a command that
		// waited its whole timeout in the queue is no longer wanted.
		d := time.Duration(j.cmd.TimeoutMS) * time.Millisecond
		j.ctx, j.stop = context.WithTimeoutCause(j.ctx, d, &timeoutError{after: d})
	}
}

// release frees the resources of j's context once the command ended.
func (j *job) release() {
	if j.stop != nil {
		j.stop()
	}
	j.cancel(nil)
}

// startSpan starts the client side of the command's trace: a child of the
// broker's dispatch span that the frame's traceparent names. A frame without
// one (or with one that does not parse) starts a trace of its own.
func (a *Agent) startSpan(ctx context.Context, cmd *protocol.Command) (context.Context, trace.Span) {
	if cmd.Traceparent != "" {
		ctx = traceContext.Extract(ctx, traceparentCarrier(cmd.Traceparent))
	}
	ctx, span := a.tracer.Start(ctx, "cheetah.agent.command", consumerSpan)
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String("cheetah.command_id", cmd.CommandID),
			attribute.String("cheetah.command.name", cmd.Name),
			attribute.String("cheetah.context_id", cmd.ContextID),
			attribute.String("cheetah.task_id", cmd.TaskID),
			attribute.Int64("cheetah.epoch", cmd.Epoch),
			attribute.String("cheetah.response_mode", string(cmd.ResponseMode)),
		)
	}
	return ctx, span
}

// traceContext reads the W3C traceparent of command frames.
var traceContext = propagation.TraceContext{}

// consumerSpan is the kind of a command's span, made once rather than per
// command.
var consumerSpan = trace.WithSpanKind(trace.SpanKindConsumer)

// traceparentCarrier carries a command frame's traceparent to traceContext
// without a map per command.
type traceparentCarrier string

func (c traceparentCarrier) Get(key string) string {
	if key == "traceparent" {
		return string(c)
	}
	return ""
}

func (traceparentCarrier) Set(string, string) {}

func (traceparentCarrier) Keys() []string { return []string{"traceparent"} }

// endSpan ends a command's span with the frame that ends the command, about
// to be sent unless response mode none says otherwise. It is called before
// that frame is sent, so the client's span is complete by the time the
// broker learns the command ended.
func endSpan(span trace.Span, f protocol.Frame, sent bool) {
	if !span.IsRecording() {
		span.End()
		return
	}
	if e, ok := f.(*protocol.Error); ok {
		span.SetAttributes(attribute.String("cheetah.error.code", string(e.Code)))
		span.SetStatus(codes.Error, string(e.Code))
	}
	if sent {
		span.AddEvent("send " + string(f.FrameType()))
	}
	span.End()
}

// reject ends a command the agent cannot run.
func (a *Agent) reject(j *job, code, msg string) {
	cmd := j.cmd
	j.logger(a).Warn("agent: rejecting a command", "code", code)
	a.end(j, &protocol.Error{CommandID: cmd.CommandID, Code: protocol.ErrorCode(code), Message: msg})
}

// onCancel cancels a command's context. A command still queued is answered
// at once, without waiting for the commands ahead of it; a running one is
// answered when its handler returns.
func (a *Agent) onCancel(c *protocol.Cancel) {
	a.mu.Lock()
	j := a.jobs[c.CommandID]
	a.mu.Unlock()
	if j == nil {
		a.log.Debug("agent: cancel for a command that is not running", "command_id", c.CommandID)
		return
	}
	j.cancel(&cancelError{reason: c.Reason})
	if j.state.CompareAndSwap(jobQueued, jobDone) {
		a.finish(j, nil, context.Cause(j.ctx))
	}
}

// execute runs a job on its flow's worker.
func (a *Agent) execute(j *job) {
	if !j.state.CompareAndSwap(jobQueued, jobRunning) {
		return // cancelled while queued, and already answered
	}
	if err := j.ctx.Err(); err != nil {
		// Timed out in the queue, or the agent is stopping: do not start.
		a.finish(j, nil, err)
		return
	}
	result, err := a.call(j)
	a.finish(j, result, err)
}

// call runs the handler, turning a panic into an error so that one bad
// command cannot take the agent and every other command down with it.
func (a *Agent) call(j *job) (result any, err error) {
	out := &output{a: a, j: j}
	defer out.done.Store(true)
	defer func() {
		if v := recover(); v != nil {
			j.logger(a).Error("agent: handler panicked", "panic", v, "stack", string(debug.Stack()))
			result, err = nil, &panicError{value: v}
		}
	}()
	return j.handler(j.ctx, j.cmd, out)
}

// finish sends the command's terminal message, unless its response mode
// asks for none, and forgets the command.
func (a *Agent) finish(j *job, result any, err error) {
	a.mu.Lock()
	delete(a.jobs, j.cmd.CommandID)
	a.mu.Unlock()
	f := terminal(j, result, err)
	j.release()
	if e, ok := f.(*protocol.Error); ok {
		j.logger(a).Info("agent: command failed", "code", e.Code, "message", e.Message)
	}
	a.end(j, f)
}

// end ends j's span and sends f, j's terminal message, after j's ack when
// that has not gone out yet (a response mode none command sends only that).
func (a *Agent) end(j *job, f protocol.Frame) {
	ack := a.takeAck(j)
	if j.span != nil {
		if ack {
			j.span.AddEvent("send ack")
		}
		endSpan(j.span, f, j.cmd.ResponseMode != protocol.ResponseNone)
	}
	if j.cmd.ResponseMode == protocol.ResponseNone {
		if ack {
			a.sendAck(j)
		}
		return
	}
	a.sendTerminal(j, f, ack)
}

// takeAck reports whether the caller is to send j's ack (with sendAck or
// sendFor). When another took it, it returns once that one has sent it, so
// that nothing about the command goes out before its ack.
func (a *Agent) takeAck(j *job) bool {
	j.ackMu.Lock()
	if j.acked {
		j.ackMu.Unlock()
		return false
	}
	j.acked = true
	j.ackTimer.Stop() // from the timer itself, harmless
	return true
}

// ackSent ends what takeAck began.
func (a *Agent) ackSent(j *job) {
	j.ackMu.Unlock()
	a.acks.Done()
}

// sendAck sends j's ack, which the caller took, on its own.
func (a *Agent) sendAck(j *job) {
	defer a.ackSent(j)
	if err := j.sess.write(context.Background(), &protocol.Ack{CommandID: j.cmd.CommandID}); err != nil {
		j.logger(a).Warn("agent: ack failed", "err", err)
	} else if j.span != nil {
		j.span.AddEvent("ack sent")
	}
}

// sendFor sends f, a message about j's command, after j's ack if ack says
// the caller took it, in one write on the current connection (the broker
// knows a command by its client, not by the connection it came on).
func (a *Agent) sendFor(j *job, f protocol.Frame, ack bool) error {
	if !ack {
		return a.send(f)
	}
	a.mu.Lock()
	cur := a.sess
	a.mu.Unlock()
	if cur == nil {
		a.sendAck(j) // on the connection it came on, which says why not
		return ErrNotConnected
	}
	defer a.ackSent(j)
	err := cur.write(context.Background(), &protocol.Ack{CommandID: j.cmd.CommandID}, f)
	if err != nil && !errors.Is(err, ErrTooLarge) {
		j.logger(a).Warn("agent: ack failed", "err", err)
	}
	return err
}

// logger returns a logger naming the command: the session's, or the
// agent's for a job made without one. It is made only when something is
// logged: most commands log nothing.
func (j *job) logger(a *Agent) *slog.Logger {
	log := j.log
	if log == nil {
		log = a.log
	}
	return log.With("command_id", j.cmd.CommandID, "command", j.cmd.Name, "context_id", j.cmd.ContextID)
}

// sendTerminal sends a result or error frame. A result too large for the
// broker is replaced by an error saying so, and an error whose data is too
// large is sent without its data, so that the command still ends.
func (a *Agent) sendTerminal(j *job, f protocol.Frame, ack bool) {
	cmd := j.cmd
	err := a.sendFor(j, f, ack)
	if errors.Is(err, ErrTooLarge) {
		switch f := f.(type) {
		case *protocol.Result:
			err = a.send(&protocol.Error{CommandID: cmd.CommandID, Code: CodeResultTooLarge,
				Message: "the result exceeds the broker's max_message_bytes"})
		case *protocol.Error:
			err = a.send(&protocol.Error{CommandID: cmd.CommandID, Code: f.Code,
				Message: clip(f.Message, 1024)})
		}
	}
	if err != nil {
		j.logger(a).Warn("agent: terminal message not sent", "err", err)
	}
}

// terminal builds the frame that ends j.
func terminal(j *job, result any, err error) protocol.Frame {
	id := j.cmd.CommandID
	if err == nil {
		data, err := marshalData(result)
		if err != nil {
			return &protocol.Error{CommandID: id, Code: CodeFailed, Message: "encode result: " + err.Error()}
		}
		return &protocol.Result{CommandID: id, Data: data}
	}
	e := &protocol.Error{CommandID: id, Code: CodeFailed}
	pe, panicked := errors.AsType[*panicError](err)
	ce, isCommandError := errors.AsType[*CommandError](err)
	switch {
	case panicked:
		e.Code, e.Message = CodeInternal, pe.Error()
	case j.ctx.Err() != nil:
		// When the command's context ended, the handler's error is most
		// likely a consequence of that (a killed process, a cancelled
		// request), so the reason the context ended is the better answer.
		e.Code, e.Message = contextCode(j.ctx)
	case isCommandError:
		if ce.Code != "" {
			e.Code = protocol.ErrorCode(ce.Code)
		}
		e.Message = ce.Message
		data, err := marshalData(ce.Data)
		if err != nil {
			e.Message += " (error data not sent: " + err.Error() + ")"
		}
		e.Data = data
	default:
		e.Message = err.Error()
	}
	e.Message = clip(e.Message, maxMessageLen)
	return e
}

// contextCode says why a command's context ended.
func contextCode(ctx context.Context) (protocol.ErrorCode, string) {
	cause := context.Cause(ctx)
	if _, ok := errors.AsType[*timeoutError](cause); ok {
		return CodeTimeout, cause.Error()
	}
	if _, ok := errors.AsType[*cancelError](cause); ok {
		return CodeCancelled, cause.Error()
	}
	return CodeCancelled, "the agent is stopping"
}

// output is the Output of one command.
type output struct {
	a    *Agent
	j    *job
	done atomic.Bool
}

func (o *output) Progress(data any) error {
	raw, err := marshalData(data)
	if err != nil {
		return fmt.Errorf("agent: progress: %w", err)
	}
	return o.send(&protocol.Progress{CommandID: o.j.cmd.CommandID, Data: raw})
}

func (o *output) Event(name string, data any) error {
	raw, err := marshalData(data)
	if err != nil {
		return fmt.Errorf("agent: event %q: %w", name, err)
	}
	return o.send(&protocol.Event{CommandID: o.j.cmd.CommandID, Name: name, Data: raw})
}

func (o *output) Capture(mime string, b []byte) error {
	return o.send(protocol.NewCapture(o.j.cmd.CommandID, mime, b))
}

func (o *output) send(f protocol.Frame) error {
	if o.done.Load() {
		return ErrCommandDone
	}
	return o.a.sendFor(o.j, f, o.a.takeAck(o.j))
}

// marshalData encodes a value for a frame's data field. nil means no data,
// and a json.RawMessage is passed through byte for byte, as the protocol
// passes the broker's and the caller's bytes through.
func marshalData(v any) (json.RawMessage, error) {
	switch v := v.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		if len(v) > 0 && !json.Valid(v) {
			return nil, errors.New("json.RawMessage is not valid JSON")
		}
		return v, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode data: %w", err)
	}
	return b, nil
}

// clip shortens s to at most n bytes, on a character boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
