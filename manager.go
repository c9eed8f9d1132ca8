package cheetah

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Backend is what a Manager runs on: the broker in this process, or the HTTP
// API of a remote one. Applications do not call it; they use Manager and
// Handle, which are the same whichever backend is behind them.
type Backend interface {
	// Acquire assigns an idle context matching req (user, client type,
	// optional client id and labels) to req.TaskID, the one idle the
	// longest, and returns its handle with a new epoch and lease token.
	// With req.Wait it waits, first come first served, for a context to
	// become idle. When nothing can be assigned it fails with a
	// *NoContextError (no_context_available and its reason); while the
	// history store does not answer, with store_unavailable.
	Acquire(ctx context.Context, req AcquireRequest) (Lease, error)
	// Send checks that lease still holds its context (lease_lost and a
	// reason otherwise), renews it on use, admits cmd in the context's
	// order and returns once the command's record is durable. Nobody waits
	// for the command's end; its messages are read from history.
	Send(ctx context.Context, lease Lease, cmd Command, opts SendOptions) (Sent, error)
	// SendAndWait admits cmd as Send does and waits for its resolution,
	// which it returns once the terminal status is durable. While it waits
	// the lease cannot expire; when ctx ends first, the command ends
	// cancelled and ctx's error is returned.
	SendAndWait(ctx context.Context, lease Lease, cmd Command, opts SendOptions) (Resolution, error)
	// Renew extends the lease from now, after the same ownership check as
	// a send; ttl zero keeps the lease's own TTL.
	Renew(ctx context.Context, lease Lease, ttl time.Duration) (Lease, error)
	// Release clears the lease when its context still carries it, live or
	// not, and reports whether it did. It never fails with lease_lost, and
	// releasing twice is not an error.
	Release(ctx context.Context, lease Lease) (bool, error)
	// ReleaseAll releases every lease named by its token and returns how
	// many it cleared.
	ReleaseAll(ctx context.Context, tokens []string) (int, error)
	// ListAvailable returns the user's idle contexts of clientType (both
	// types when empty), in selection order: the one idle the longest
	// first.
	ListAvailable(ctx context.Context, userID string, clientType ClientType) ([]ContextSnapshot, error)
	// TaskContexts returns the active leases of a task, without their
	// tokens, ordered by epoch.
	TaskContexts(ctx context.Context, userID, taskID string) ([]Lease, error)
	// ReadCommand reads one command of the user from history, with every
	// message that came back for it; another user's command is not found.
	ReadCommand(ctx context.Context, userID, commandID string) (CommandRecord, error)
	// ListCommands pages through the user's commands, newest first,
	// without their messages.
	ListCommands(ctx context.Context, userID string, q ListQuery) (CommandPage, error)
}

// Manager borrows contexts for tasks. It is safe for concurrent use.
//
// Each call is one span (cheetah.Acquire, cheetah.SendAndWait, …) of the
// tracer provider given with WithTracerProvider, and the parent of what the
// broker does for it: a command's whole trace, down to the client's own
// span, starts at the SDK call that sent it.
type Manager struct {
	b      Backend
	tracer trace.Tracer
}

// NewManager returns a Manager over b. Applications get one from the
// broker (in process) or from the remote client package.
func NewManager(b Backend, opts ...ManagerOption) *Manager {
	m := &Manager{b: b}
	for _, o := range opts {
		o(m)
	}
	if m.tracer == nil {
		m.tracer = defaultTracer()
	}
	return m
}

// Acquire assigns one idle context matching req to req.TaskID and returns
// its handle. It fails with a *NoContextError when nothing can be assigned.
func (m *Manager) Acquire(ctx context.Context, req AcquireRequest) (*Handle, error) {
	ctx, span := start(ctx, m.tracer, "cheetah.Acquire", func() []attribute.KeyValue {
		return []attribute.KeyValue{attrUserID.String(req.UserID), attrTaskID.String(req.TaskID), attrClientType.String(string(req.ClientType))}
	})
	l, err := m.b.Acquire(ctx, req)
	if err == nil && span.IsRecording() {
		span.SetAttributes(leaseAttrs(l)...)
	}
	finish(span, err)
	if err != nil {
		return nil, err
	}
	return &Handle{b: m.b, tracer: m.tracer, lease: l}, nil
}

// Renew extends h's lease by its TTL from now.
func (m *Manager) Renew(ctx context.Context, h *Handle) error { return h.Renew(ctx) }

// Release gives h's lease back. It reports whether this call cleared the
// lease; releasing a lease that already ended is not an error.
func (m *Manager) Release(ctx context.Context, h *Handle) (bool, error) {
	l := h.Lease()
	ctx, span := start(ctx, m.tracer, "cheetah.Release", func() []attribute.KeyValue { return leaseAttrs(l) })
	ok, err := m.b.Release(ctx, l)
	finish(span, err)
	if err == nil && ok {
		h.released()
		h.Close()
	}
	return ok, err
}

// ReleaseAll releases every handle and returns how many leases it cleared.
func (m *Manager) ReleaseAll(ctx context.Context, hs []*Handle) (int, error) {
	tokens := make([]string, 0, len(hs))
	for _, h := range hs {
		tokens = append(tokens, h.Lease().LeaseToken)
	}
	ctx, span := start(ctx, m.tracer, "cheetah.ReleaseAll", nil)
	n, err := m.b.ReleaseAll(ctx, tokens)
	finish(span, err)
	return n, err
}

// ListAvailable returns the user's idle contexts of a client type, longest
// idle first. An empty clientType lists every type.
func (m *Manager) ListAvailable(ctx context.Context, userID string, clientType ClientType) ([]ContextSnapshot, error) {
	ctx, span := start(ctx, m.tracer, "cheetah.ListAvailable", func() []attribute.KeyValue {
		return []attribute.KeyValue{attrUserID.String(userID)}
	})
	out, err := m.b.ListAvailable(ctx, userID, clientType)
	finish(span, err)
	return out, err
}

// TaskContexts returns the user's live leases that carry taskID, without
// tokens, oldest epoch first. Like every other call, it takes the user first.
func (m *Manager) TaskContexts(ctx context.Context, userID, taskID string) ([]Lease, error) {
	ctx, span := start(ctx, m.tracer, "cheetah.TaskContexts", func() []attribute.KeyValue {
		return []attribute.KeyValue{attrUserID.String(userID), attrTaskID.String(taskID)}
	})
	out, err := m.b.TaskContexts(ctx, userID, taskID)
	finish(span, err)
	return out, err
}

// History reads the durable command history.
func (m *Manager) History() *History { return &History{b: m.b, tracer: m.tracer} }

// History reads commands and every message that came back for them.
type History struct {
	b      Backend
	tracer trace.Tracer
}

// Read returns one command of a user. A command of another user is not found.
func (h *History) Read(ctx context.Context, userID, commandID string) (CommandRecord, error) {
	ctx, span := start(ctx, h.tracer, "cheetah.History.Read", func() []attribute.KeyValue {
		return []attribute.KeyValue{attrUserID.String(userID), attrCommandID.String(commandID)}
	})
	rec, err := h.b.ReadCommand(ctx, userID, commandID)
	finish(span, err)
	return rec, err
}

// List returns a page of a user's commands, newest first.
func (h *History) List(ctx context.Context, userID string, q ListQuery) (CommandPage, error) {
	ctx, span := start(ctx, h.tracer, "cheetah.History.List", func() []attribute.KeyValue {
		return []attribute.KeyValue{attrUserID.String(userID)}
	})
	page, err := h.b.ListCommands(ctx, userID, q)
	finish(span, err)
	return page, err
}

// Handle is one acquired context. Every send, renew and release through it is
// checked against the context's current lease, so a stale handle can never
// act through a later assignment.
type Handle struct {
	b      Backend
	tracer trace.Tracer
	mu     sync.Mutex
	lease  Lease
	// The lease-loss notice (Done, Err): done closes once, with err set,
	// when the lease ends; stop ends the backend's watch.
	watchOnce sync.Once
	done      chan struct{}
	err       error
	stop      func()
	closed    bool // Close was called: no watch starts any more
}

// LeaseWatcher is implemented by a backend that can tell a holder at once
// that its lease ended (DESIGN §10, "Knowing a lease ended"): the registry
// in process, from its event stream; the remote backend, from the broker's
// long poll (POST /api/v1/lease/wait).
type LeaseWatcher interface {
	// WatchLease calls lost, once, with the reason lease ended, as soon as
	// the backend learns it (at once when it already ended). stop ends the
	// watch; lost is not called after stop returned.
	WatchLease(lease Lease, lost func(LostReason)) (stop func())
}

// Done returns a channel closed when the handle's lease ends, however it
// ends: expired, revoked, context_gone (a closed tab, a client whose
// reconnect grace ran out), or released (through this handle or another).
// Err then says why. Over a backend that cannot watch leases, the channel
// never closes.
func (h *Handle) Done() <-chan struct{} {
	h.watchOnce.Do(func() {
		h.done = make(chan struct{})
		w, ok := h.b.(LeaseWatcher)
		h.mu.Lock()
		closed := h.closed
		h.mu.Unlock()
		if !ok || closed {
			return
		}
		stop := w.WatchLease(h.Lease(), h.lost)
		h.mu.Lock()
		closed = h.closed
		if !closed {
			h.stop = stop
		}
		h.mu.Unlock()
		if closed {
			stop() // Close came first
		}
	})
	return h.done
}

// Err returns nil while Done is open, and then a *LeaseLostError whose
// Reason says how the lease ended.
func (h *Handle) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// lost closes Done with reason, once.
func (h *Handle) lost(reason LostReason) { h.end(&LeaseLostError{Reason: reason}) }

// end closes Done with err as Err, unless it ended already.
func (h *Handle) end(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err != nil {
		return
	}
	h.err = err
	if h.done != closedDone {
		close(h.done)
	}
}

// errReleased is Err's answer for a handle released through the Manager,
// made once: a release is as hot as an acquire.
var errReleased = &LeaseLostError{Reason: LostReleased}

// closedDone is Done's channel for a handle released before anyone asked
// for it: closed already, and shared, so that a release allocates none.
var closedDone = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// released ends the handle because it released its lease. If Done was
// never asked for, it is born closed with Err already set, and no watch
// ever starts.
func (h *Handle) released() {
	h.watchOnce.Do(func() {
		h.mu.Lock()
		h.err, h.done = errReleased, closedDone
		h.mu.Unlock()
	})
	h.end(errReleased)
}

// Close stops watching the lease (see Done) without releasing it: Done
// then closes only if it already did. Release through the Manager does it
// too.
func (h *Handle) Close() {
	h.mu.Lock()
	stop := h.stop
	h.stop, h.closed = nil, true
	h.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// Lease returns the handle's lease as last known, token included. ExpiresAt
// is as of the acquire or the last explicit renew: a send that renews on use
// moves the broker's deadline without telling the handle.
func (h *Handle) Lease() Lease {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lease
}

// The handle's identity, for logging and routing. None of it is secret.

// UserID returns the user whose context the handle holds.
func (h *Handle) UserID() string { return h.Lease().UserID }

// ClientID returns the client (extension or agent) the context belongs to.
func (h *Handle) ClientID() string { return h.Lease().ClientID }

// ContextID returns the context's id, unique within its client.
func (h *Handle) ContextID() string { return h.Lease().ContextID }

// ClientType returns the type of the context's client.
func (h *Handle) ClientType() ClientType { return h.Lease().ClientType }

// TaskID returns the task the context was acquired for.
func (h *Handle) TaskID() string { return h.Lease().TaskID }

// Epoch returns the lease's epoch: it grows with every assignment of the
// context, and fences a stale handle off a later one.
func (h *Handle) Epoch() int64 { return h.Lease().Epoch }

// ExpiresAt returns when the lease ends unless renewed, as Lease says it.
func (h *Handle) ExpiresAt() time.Time { return h.Lease().ExpiresAt }

// String names the handle without its token.
func (h *Handle) String() string {
	l := h.Lease()
	return fmt.Sprintf("%s/%s/%s task=%s epoch=%d", l.UserID, l.ClientID, l.ContextID, l.TaskID, l.Epoch)
}

// Send dispatches cmd without waiting (response mode async unless an option
// says otherwise) and returns its command id once the record is durable.
func (h *Handle) Send(ctx context.Context, cmd Command, opts ...SendOption) (string, error) {
	l := h.Lease()
	ctx, span := start(ctx, h.tr(), "cheetah.Send", func() []attribute.KeyValue {
		return append(leaseAttrs(l), attrCommandName.String(cmd.Name))
	})
	s, err := h.b.Send(ctx, l, cmd, buildSendOptions(ModeAsync, opts))
	if err == nil && span.IsRecording() {
		span.SetAttributes(attrCommandID.String(s.CommandID))
	}
	finish(span, err)
	if err != nil {
		return "", err
	}
	return s.CommandID, nil
}

// SendAndWait dispatches cmd and waits for its resolution: the client's
// terminal message, the timeout, a lost connection or ctx's end. When it
// returns completed or failed, History().Read already has the terminal
// message.
func (h *Handle) SendAndWait(ctx context.Context, cmd Command, opts ...SendOption) (Resolution, error) {
	l := h.Lease()
	ctx, span := start(ctx, h.tr(), "cheetah.SendAndWait", func() []attribute.KeyValue {
		return append(leaseAttrs(l), attrCommandName.String(cmd.Name))
	})
	res, err := h.b.SendAndWait(ctx, l, cmd, buildSendOptions(ModeRPC, opts))
	if res.CommandID != "" && span.IsRecording() {
		span.SetAttributes(attrCommandID.String(res.CommandID), attrStatus.String(string(res.Status)))
		if err == nil && res.Status != StatusCompleted {
			// The call worked; the command did not.
			span.SetStatus(codes.Error, string(res.Status))
		}
	}
	finish(span, err)
	return res, err
}

// Renew extends the lease by its TTL from now.
func (h *Handle) Renew(ctx context.Context) error {
	return h.RenewFor(ctx, 0)
}

// RenewFor extends the lease by ttl from now; zero keeps its TTL.
func (h *Handle) RenewFor(ctx context.Context, ttl time.Duration) error {
	cur := h.Lease()
	ctx, span := start(ctx, h.tr(), "cheetah.Renew", func() []attribute.KeyValue { return leaseAttrs(cur) })
	l, err := h.b.Renew(ctx, cur, ttl)
	finish(span, err)
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.lease.ExpiresAt, h.lease.TTLSeconds = l.ExpiresAt, l.TTLSeconds
	h.mu.Unlock()
	return nil
}

// tr is the handle's tracer; a Handle made outside a Manager has the
// global one.
func (h *Handle) tr() trace.Tracer {
	if h.tracer == nil {
		return defaultTracer()
	}
	return h.tracer
}

// SendOption adjusts one send.
type SendOption func(*SendOptions)

// WithTimeout bounds how long the client may take; the command then ends
// timed_out. It is sent to the client as timeout_ms.
func WithTimeout(d time.Duration) SendOption { return func(o *SendOptions) { o.Timeout = d } }

// WithTarget sends the command to a tab other than the context's default.
func WithTarget(tabID string) SendOption {
	return func(o *SendOptions) {
		o.Target, _ = json.Marshal(map[string]string{"tab_id": tabID})
	}
}

// WithOptions passes an options object to the client unchanged.
func WithOptions(opts map[string]any) SendOption {
	return func(o *SendOptions) { o.Options, _ = json.Marshal(opts) }
}

// WithResponseMode overrides the response mode: Send defaults to async and
// SendAndWait to rpc.
func WithResponseMode(m ResponseMode) SendOption {
	return func(o *SendOptions) { o.ResponseMode = m }
}

// WithCallback asks for the command record to be delivered to url by webhook
// once the command ends.
func WithCallback(url string) SendOption { return func(o *SendOptions) { o.CallbackURL = url } }

func buildSendOptions(mode ResponseMode, opts []SendOption) SendOptions {
	so := SendOptions{ResponseMode: mode}
	for _, o := range opts {
		o(&so)
	}
	return so
}
