package cheetah

import (
	"encoding/json"
	"time"

	"github.com/cheetahbroker/cheetah/protocol"
)

// ClientType says what kind of client owns a context. The SDK's wire
// vocabulary is the protocol's own: these are aliases, not copies.
type ClientType = protocol.ClientType

// The client types of protocol v1.
const (
	Browser = protocol.ClientBrowser
	Console = protocol.ClientConsole
)

// Owner says who a context belongs to. Only worker-owned contexts are ever
// assigned; a person's own tab is reported as human and never leased.
type Owner = protocol.Owner

// The context owners of protocol v1.
const (
	OwnerWorker = protocol.OwnerWorker
	OwnerHuman  = protocol.OwnerHuman
)

// ResponseMode says whether the client sends a terminal message for a
// command and whether anyone waits for it.
type ResponseMode = protocol.ResponseMode

// The response modes of protocol v1.
const (
	// ModeRPC: the caller waits for the terminal message.
	ModeRPC = protocol.ResponseRPC
	// ModeAsync: the client sends one terminal message, nobody waits. This is
	// the default for a plain Send.
	ModeAsync = protocol.ResponseAsync
	// ModeNone: the client sends no terminal message; the command ends at
	// dispatched or acknowledged.
	ModeNone = protocol.ResponseNone
)

// Status is a command's status. The first three are progress states; the rest
// are terminal and also appear in a Resolution.
type Status string

// Command statuses.
const (
	StatusAdmitted     Status = "admitted"
	StatusDispatched   Status = "dispatched"
	StatusAcknowledged Status = "acknowledged"
	StatusCompleted    Status = "completed"
	StatusFailed       Status = "failed"
	StatusTimedOut     Status = "timed_out"
	StatusDisconnected Status = "disconnected"
	StatusCancelled    Status = "cancelled"
	StatusInterrupted  Status = "interrupted"
)

// Terminal reports whether s ends a command.
func (s Status) Terminal() bool { return s.Rank() == 3 }

// Rank orders statuses so that a store can refuse to move a command
// backwards: admitted < dispatched < acknowledged < every terminal status.
func (s Status) Rank() int {
	switch s {
	case StatusAdmitted:
		return 0
	case StatusDispatched:
		return 1
	case StatusAcknowledged:
		return 2
	case StatusCompleted, StatusFailed, StatusTimedOut, StatusDisconnected, StatusCancelled, StatusInterrupted:
		return 3
	}
	return -1
}

// MessageKind names what a client sent back about a command.
type MessageKind string

// Message kinds recorded in history.
const (
	KindAck      MessageKind = "ack"
	KindProgress MessageKind = "progress"
	KindEvent    MessageKind = "event"
	KindCapture  MessageKind = "capture"
	KindResult   MessageKind = "result"
	KindError    MessageKind = "error"
)

// Lease is one context assigned to one task. LeaseToken is set only where the
// caller holds it (the acquire answer, a renew); views for others leave it
// empty.
type Lease struct {
	UserID     string     `json:"user_id"`
	ClientID   string     `json:"client_id"`
	ContextID  string     `json:"context_id"`
	ClientType ClientType `json:"client_type"`
	TaskID     string     `json:"task_id"`
	Epoch      int64      `json:"epoch"`
	LeaseToken string     `json:"lease_token,omitempty"`
	TTLSeconds int        `json:"ttl_s"`
	ExpiresAt  time.Time  `json:"expires_at"`
	// TenantID is the tenant the lease counts for under the quota funnel.
	TenantID string `json:"tenant_id,omitempty"`
	// AffinityHit is set when the acquire carried an affinity_key: whether
	// the context's last lease carried the same key.
	AffinityHit *bool `json:"affinity_hit,omitempty"`
	// Created is true when the context was opened for this acquire.
	Created bool `json:"created,omitempty"`
	// Held is set while a person holds the context (DESIGN §10): the
	// lease does not expire meanwhile, and mutations fail held.
	Held *HoldInfo `json:"held,omitempty"`
	// RenewOnUse says whether each send renews the lease (the acquire's
	// renew_on_use, true unless it said false).
	RenewOnUse bool `json:"renew_on_use"`
	// ClearState says the context is cleared when the lease begins and
	// ends (the acquire's clear_state).
	ClearState bool `json:"clear_state,omitempty"`
}

// ContextSnapshot describes one context as the registry sees it now.
type ContextSnapshot struct {
	UserID     string            `json:"user_id"`
	ClientID   string            `json:"client_id"`
	ContextID  string            `json:"context_id"`
	ClientType ClientType        `json:"client_type"`
	TabID      string            `json:"tab_id"`
	Owner      Owner             `json:"owner"`
	URL        string            `json:"url"`
	Title      string            `json:"title"`
	Labels     map[string]string `json:"labels"`
	// State is one of "idle", "leased", "not_live" or "human".
	State     string     `json:"state"`
	IdleSince *time.Time `json:"idle_since,omitempty"`
	// Held is set while a person holds the context.
	Held *HoldInfo `json:"held,omitempty"`
}

// Context states reported in a ContextSnapshot.
const (
	StateIdle    = "idle"
	StateLeased  = "leased"
	StateNotLive = "not_live"
	StateHuman   = "human"
)

// AcquireRequest asks for one idle context for a task.
type AcquireRequest struct {
	UserID string `json:"user_id"`
	TaskID string `json:"task_id"`
	// ClientType defaults to Browser when empty.
	ClientType ClientType `json:"client_type,omitempty"`
	// ClientID, when set, requires a context of that client.
	ClientID string `json:"client_id,omitempty"`
	// Labels must all match: the context's own label, or where the context
	// lacks the key, the client's.
	Labels map[string]string `json:"labels,omitempty"`
	// TTL is the lease's time to live, 1 s to 1 h; zero means the default.
	TTL time.Duration `json:"-"`
	// Wait, up to one minute, makes acquire wait first come first served for
	// a context to become idle. Zero fails at once.
	Wait time.Duration `json:"-"`
	// RenewOnUse, when false, makes only an explicit renew extend the lease.
	// Nil means true.
	RenewOnUse *bool `json:"renew_on_use,omitempty"`
	// TenantID is the tenant the acquire counts for under the quota funnel
	// (DESIGN §10); empty is "default". The HTTP API fills it from a
	// tenant-bound app key.
	TenantID string `json:"tenant_id,omitempty"`
	// AffinityKey, at most MaxAffinityKeyLen characters, prefers the idle
	// context whose last lease carried the same key.
	AffinityKey string `json:"affinity_key,omitempty"`
	// Create, when set, asks an eligible client to open a new context when
	// no idle one matches (DESIGN §10).
	Create *CreateSpec `json:"create,omitempty"`
	// LeaseWebhook, an https URL, receives a signed Standard Webhooks
	// lease.lost delivery when the lease ends other than by its holder's
	// release (DESIGN §10). LeaseWebhookKeyID names the API key whose
	// webhook secret signs it; empty is the broker's own secret (in
	// process). The HTTP API fills it from the requesting key.
	LeaseWebhook      string `json:"lease_webhook,omitempty"`
	LeaseWebhookKeyID string `json:"-"`
	// ClearState asks for a clean slate: the client clears the context's
	// state (a browser tab's cookies and storage for the sites it visited,
	// its page) before the lease's first command and again when the lease
	// ends, however it ends. A console flow holds no such state.
	ClearState bool `json:"clear_state,omitempty"`
}

// CreateSpec is an acquire's request to open a context on demand.
type CreateSpec struct {
	// URL is where the new context opens; empty is the client's blank page.
	URL string `json:"url,omitempty"`
	// Timeout bounds the wait for the client to report the new context;
	// zero is DefaultCreateTimeout, at most MaxCreateTimeout.
	Timeout time.Duration `json:"-"`
}

// Command is a named request with JSON params sent through a handle.
type Command struct {
	Name string `json:"name"`
	// Params is marshalled to JSON; a json.RawMessage passes through as is.
	Params any `json:"params,omitempty"`
}

// SendOptions carries what the With… options set. Backends read it; callers
// use the options.
type SendOptions struct {
	Timeout      time.Duration
	Target       json.RawMessage
	Options      json.RawMessage
	ResponseMode ResponseMode
	CallbackURL  string
	// CallbackKeyID names the API key whose webhook secret signs the
	// delivery to CallbackURL. The HTTP API sets it to the requesting key;
	// in-process sends leave it empty and are signed with the broker's own
	// secret (server.Options.WebhookSecret).
	CallbackKeyID string
	// OnAdmitted, when set, is called once the command's record is durable,
	// before the wait for its resolution (the command may be running on the
	// client already: dispatch overlaps the record's commit): the HTTP API
	// uses it to name the command to a caller that may go away before the
	// resolution.
	OnAdmitted func(Sent) `json:"-"`
}

// Sent identifies an admitted command. It is returned only once the
// command's record is durable.
type Sent struct {
	CommandID string `json:"command_id"`
	TraceID   string `json:"trace_id"`
}

// ErrorInfo is a command's error: the client's error frame, or the broker's
// own code (timed_out, disconnected, cancelled, interrupted).
type ErrorInfo struct {
	Code    string          `json:"code"`
	Message string          `json:"message,omitempty"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// Resolution is the terminal correlation of one command. It never carries
// the result payload: read it from history.
type Resolution struct {
	CommandID string     `json:"command_id"`
	TraceID   string     `json:"trace_id"`
	Status    Status     `json:"status"`
	Error     *ErrorInfo `json:"error,omitempty"`
}

// Message is one thing a client sent back about a command.
type Message struct {
	Seq     int64           `json:"seq"`
	Kind    MessageKind     `json:"kind"`
	Name    string          `json:"name,omitempty"`
	Data    json.RawMessage `json:"data,omitempty"`
	Code    string          `json:"code,omitempty"`
	Message string          `json:"message,omitempty"`
	Mime    string          `json:"mime,omitempty"`
	Late    bool            `json:"late"`
	At      time.Time       `json:"at"`
}

// CommandRecord is a command with everything that came back for it.
type CommandRecord struct {
	CommandID    string          `json:"command_id"`
	UserID       string          `json:"user_id"`
	ClientID     string          `json:"client_id"`
	ContextID    string          `json:"context_id"`
	TaskID       string          `json:"task_id"`
	Epoch        int64           `json:"epoch"`
	Name         string          `json:"name"`
	Params       json.RawMessage `json:"params,omitempty"`
	Target       json.RawMessage `json:"target,omitempty"`
	Options      json.RawMessage `json:"options,omitempty"`
	ResponseMode ResponseMode    `json:"response_mode"`
	Status       Status          `json:"status"`
	Error        *ErrorInfo      `json:"error,omitempty"`
	TraceID      string          `json:"trace_id"`
	CreatedAt    time.Time       `json:"created_at"`
	DispatchedAt *time.Time      `json:"dispatched_at,omitempty"`
	AckedAt      *time.Time      `json:"acked_at,omitempty"`
	FinishedAt   *time.Time      `json:"finished_at,omitempty"`
	Delivery     *Delivery       `json:"delivery,omitempty"`
	Messages     []Message       `json:"messages"`
}

// Resolution is the command's end as a wait answers it: what a caller
// whose wait was cut short reads from history instead.
func (r *CommandRecord) Resolution() Resolution {
	return Resolution{CommandID: r.CommandID, TraceID: r.TraceID, Status: r.Status, Error: r.Error}
}

// Delivery is the state of a command's webhook delivery.
type Delivery struct {
	URL       string `json:"url"`
	Attempts  int    `json:"attempts"`
	Delivered bool   `json:"delivered"`
	LastError string `json:"last_error,omitempty"`
}

// ListQuery pages through a user's commands, newest first.
type ListQuery struct {
	TaskID string
	Limit  int
	Cursor string
}

// CommandPage is one page of a command list. NextCursor is empty on the last
// page.
type CommandPage struct {
	Commands   []CommandRecord `json:"commands"`
	NextCursor string          `json:"next_cursor"`
}
