package cheetah

import (
	"encoding/json"
	"time"
)

// The HTTP API's request bodies (DESIGN §5), declared once: the server
// decodes them and the remote SDK encodes them. Optional members are
// pointers or omitted when empty.

// AcquireBody is the body of POST /api/v1/acquire.
type AcquireBody struct {
	UserID     string            `json:"user_id"`
	TaskID     string            `json:"task_id"`
	ClientType ClientType        `json:"client_type,omitempty"`
	ClientID   string            `json:"client_id,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	TTLS       *int64            `json:"ttl_s,omitempty"`
	WaitMS     *int64            `json:"wait_ms,omitempty"`
	RenewOnUse *bool             `json:"renew_on_use,omitempty"`
	// DESIGN §10.
	Create      *CreateBody `json:"create,omitempty"`
	AffinityKey string      `json:"affinity_key,omitempty"`
	// LeaseWebhook receives lease.lost (AcquireRequest.LeaseWebhook).
	LeaseWebhook string `json:"lease_webhook,omitempty"`
	TenantID     string `json:"tenant_id,omitempty"`
	ClearState   bool   `json:"clear_state,omitempty"`
}

// CreateBody is the create member of an acquire body.
type CreateBody struct {
	URL       string `json:"url,omitempty"`
	TimeoutMS *int64 `json:"timeout_ms,omitempty"`
}

// CommandBody is the body of POST /api/v1/commands and /commands/wait.
type CommandBody struct {
	Name         string          `json:"name"`
	Params       json.RawMessage `json:"params,omitempty"`
	Target       json.RawMessage `json:"target,omitempty"`
	Options      json.RawMessage `json:"options,omitempty"`
	ResponseMode ResponseMode    `json:"response_mode,omitempty"`
	TimeoutMS    *int64          `json:"timeout_ms,omitempty"`
}

// RenewBody is the body of POST /api/v1/lease/renew.
type RenewBody struct {
	TTLS *int64 `json:"ttl_s,omitempty"`
}

// LeaseWaitBody is the body of POST /api/v1/lease/wait: how long the
// broker may hold the request while the lease lives (DefaultLeaseWait when
// absent, at most MaxLeaseWait).
type LeaseWaitBody struct {
	TimeoutMS *int64 `json:"timeout_ms,omitempty"`
}

// LeaseWaitAnswer is the 200 answer of POST /api/v1/lease/wait: the lease
// was alive all along. A lease that ended is answered 423 lease_lost with
// the reason.
type LeaseWaitAnswer struct {
	Alive bool `json:"alive"`
}

// Bounds of the long poll of POST /api/v1/lease/wait.
const (
	DefaultLeaseWait = 25 * time.Second
	MaxLeaseWait     = 60 * time.Second
)

// ReleaseAllBody is the body of POST /api/v1/lease/release-all.
type ReleaseAllBody struct {
	LeaseTokens []string `json:"lease_tokens"`
}

// CreateKeyBody is the body of POST /api/v1/admin/keys.
type CreateKeyBody struct {
	Kind   string `json:"kind"`
	UserID string `json:"user_id,omitempty"`
	Name   string `json:"name"`
	// TenantID binds an app key to one tenant (DESIGN §10).
	TenantID string `json:"tenant_id,omitempty"`
}
