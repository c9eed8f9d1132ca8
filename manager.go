package cheetah

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"
)

// Backend is what a Manager runs on: the broker in this process, or the HTTP
// API of a remote one. Applications do not call it; they use Manager and
// Handle, which are the same whichever backend is behind them.
type Backend interface {
	Acquire(ctx context.Context, req AcquireRequest) (Lease, error)
	Send(ctx context.Context, lease Lease, cmd Command, opts SendOptions) (Sent, error)
	SendAndWait(ctx context.Context, lease Lease, cmd Command, opts SendOptions) (Resolution, error)
	// Renew extends the lease; ttl zero keeps the lease's own TTL.
	Renew(ctx context.Context, lease Lease, ttl time.Duration) (Lease, error)
	Release(ctx context.Context, lease Lease) (bool, error)
	ReleaseAll(ctx context.Context, tokens []string) (int, error)
	ListAvailable(ctx context.Context, userID string, clientType ClientType) ([]ContextSnapshot, error)
	TaskContexts(ctx context.Context, userID, taskID string) ([]Lease, error)
	ReadCommand(ctx context.Context, userID, commandID string) (CommandRecord, error)
	ListCommands(ctx context.Context, userID string, q ListQuery) (CommandPage, error)
}

// Manager borrows contexts for tasks. It is safe for concurrent use.
type Manager struct {
	b Backend
}

// NewManager returns a Manager over b. Applications get one from the
// broker (in process) or from the remote client package.
func NewManager(b Backend) *Manager { return &Manager{b: b} }

// Acquire assigns one idle context matching req to req.TaskID and returns
// its handle. It fails with a *NoContextError when nothing can be assigned.
func (m *Manager) Acquire(ctx context.Context, req AcquireRequest) (*Handle, error) {
	l, err := m.b.Acquire(ctx, req)
	if err != nil {
		return nil, err
	}
	return &Handle{b: m.b, lease: l}, nil
}

// Renew extends h's lease by its TTL from now.
func (m *Manager) Renew(ctx context.Context, h *Handle) error { return h.Renew(ctx) }

// Release gives h's lease back. It reports whether this call cleared the
// lease; releasing a lease that already ended is not an error.
func (m *Manager) Release(ctx context.Context, h *Handle) (bool, error) {
	return m.b.Release(ctx, h.Lease())
}

// ReleaseAll releases every handle and returns how many leases it cleared.
func (m *Manager) ReleaseAll(ctx context.Context, hs []*Handle) (int, error) {
	tokens := make([]string, 0, len(hs))
	for _, h := range hs {
		tokens = append(tokens, h.Lease().LeaseToken)
	}
	return m.b.ReleaseAll(ctx, tokens)
}

// ListAvailable returns the user's idle contexts of a client type, longest
// idle first. An empty clientType lists every type.
func (m *Manager) ListAvailable(ctx context.Context, userID string, clientType ClientType) ([]ContextSnapshot, error) {
	return m.b.ListAvailable(ctx, userID, clientType)
}

// TaskContexts returns the live leases that carry a task, without tokens.
func (m *Manager) TaskContexts(ctx context.Context, taskID, userID string) ([]Lease, error) {
	return m.b.TaskContexts(ctx, userID, taskID)
}

// History reads the durable command history.
func (m *Manager) History() *History { return &History{b: m.b} }

// History reads commands and every message that came back for them.
type History struct{ b Backend }

// Read returns one command of a user. A command of another user is not found.
func (h *History) Read(ctx context.Context, userID, commandID string) (CommandRecord, error) {
	return h.b.ReadCommand(ctx, userID, commandID)
}

// List returns a page of a user's commands, newest first.
func (h *History) List(ctx context.Context, userID string, q ListQuery) (CommandPage, error) {
	return h.b.ListCommands(ctx, userID, q)
}

// Handle is one acquired context. Every send, renew and release through it is
// checked against the context's current lease, so a stale handle can never
// act through a later assignment.
type Handle struct {
	b     Backend
	mu    sync.Mutex
	lease Lease
}

// Lease returns the handle's lease as last known, token included. ExpiresAt
// is as of the acquire or the last explicit renew: a send that renews on use
// moves the broker's deadline without telling the handle.
func (h *Handle) Lease() Lease {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lease
}

// The handle's identity, for logging and routing. None of them is secret.
func (h *Handle) UserID() string         { return h.Lease().UserID }
func (h *Handle) ClientID() string       { return h.Lease().ClientID }
func (h *Handle) ContextID() string      { return h.Lease().ContextID }
func (h *Handle) ClientType() ClientType { return h.Lease().ClientType }
func (h *Handle) TaskID() string         { return h.Lease().TaskID }
func (h *Handle) Epoch() int64           { return h.Lease().Epoch }
func (h *Handle) ExpiresAt() time.Time   { return h.Lease().ExpiresAt }

// String names the handle without its token.
func (h *Handle) String() string {
	l := h.Lease()
	return fmt.Sprintf("%s/%s/%s task=%s epoch=%d", l.UserID, l.ClientID, l.ContextID, l.TaskID, l.Epoch)
}

// Send dispatches cmd without waiting (response mode async unless an option
// says otherwise) and returns its command id once the record is durable.
func (h *Handle) Send(ctx context.Context, cmd Command, opts ...SendOption) (string, error) {
	s, err := h.b.Send(ctx, h.Lease(), cmd, buildSendOptions(ModeAsync, opts))
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
	return h.b.SendAndWait(ctx, h.Lease(), cmd, buildSendOptions(ModeRPC, opts))
}

// Renew extends the lease by its TTL from now.
func (h *Handle) Renew(ctx context.Context) error {
	return h.RenewFor(ctx, 0)
}

// RenewFor extends the lease by ttl from now; zero keeps its TTL.
func (h *Handle) RenewFor(ctx context.Context, ttl time.Duration) error {
	l, err := h.b.Renew(ctx, h.Lease(), ttl)
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.lease.ExpiresAt, h.lease.TTLSeconds = l.ExpiresAt, l.TTLSeconds
	h.mu.Unlock()
	return nil
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
