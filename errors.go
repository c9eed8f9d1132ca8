package cheetah

import (
	"errors"
	"fmt"
	"time"
)

// Error codes of the HTTP API. The same codes classify SDK errors, so an
// in-process caller and a remote one see the same thing.
const (
	CodeInvalidRequest     = "invalid_request"
	CodeUnauthorized       = "unauthorized"
	CodeForbidden          = "forbidden"
	CodeNotFound           = "not_found"
	CodeNoContextAvailable = "no_context_available"
	CodePayloadTooLarge    = "payload_too_large"
	CodeLeaseLost          = "lease_lost"
	CodeRateLimited        = "rate_limited"
	CodeStoreUnavailable   = "store_unavailable"
	CodeOverloaded         = "overloaded"
	// CodeQuotaUnavailable refuses an acquire that a quota would govern
	// while the quota file last loaded was broken (DESIGN §10).
	CodeQuotaUnavailable = "quota_unavailable"
	// CodeMethodNotAllowed answers a known path asked with a method it
	// does not serve (405, with an Allow header).
	CodeMethodNotAllowed = "method_not_allowed"
	// CodeHeld refuses a mutation on a context a person holds (HTTP 423,
	// details {state, since}; DESIGN §10, human control).
	CodeHeld = "held"
)

// Error is an API error with a code from the design's table. Sentinel values
// below match any *Error with the same code under errors.Is.
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return e.Code
	}
	return e.Code + ": " + e.Message
}

// Is makes errors.Is(err, ErrNotFound) true for every *Error with that code.
func (e *Error) Is(target error) bool {
	var t *Error
	return errors.As(target, &t) && t.Code == e.Code
}

// Sentinels for errors.Is. ErrNoContextAvailable and ErrLeaseLost also match
// *NoContextError and *LeaseLostError, which carry the reason.
var (
	ErrInvalidRequest     = &Error{Code: CodeInvalidRequest}
	ErrUnauthorized       = &Error{Code: CodeUnauthorized}
	ErrForbidden          = &Error{Code: CodeForbidden}
	ErrNotFound           = &Error{Code: CodeNotFound}
	ErrNoContextAvailable = &Error{Code: CodeNoContextAvailable}
	ErrPayloadTooLarge    = &Error{Code: CodePayloadTooLarge}
	ErrLeaseLost          = &Error{Code: CodeLeaseLost}
	ErrRateLimited        = &Error{Code: CodeRateLimited}
	ErrStoreUnavailable   = &Error{Code: CodeStoreUnavailable}
	ErrOverloaded         = &Error{Code: CodeOverloaded}
	ErrQuotaUnavailable   = &Error{Code: CodeQuotaUnavailable}
	// ErrHeld also matches *HeldError.
	ErrHeld = &Error{Code: CodeHeld}
)

// Hold states, in HoldInfo.State: pending while the context's admitted
// mutations drain, active once they ended.
const (
	HoldPending = "pending"
	HoldActive  = "active"
)

// HoldInfo is a person's hold on a context, as the lease views and the
// held error show it: its state and since when it is in that state.
type HoldInfo struct {
	State string    `json:"state"`
	Since time.Time `json:"since"`
}

// HeldError refuses a mutation sent while a person holds the context.
// Nothing was dispatched; observations still pass.
type HeldError struct {
	Hold HoldInfo
}

func (e *HeldError) Error() string {
	return CodeHeld + ": the context is held by a person (" + e.Hold.State + ")"
}

// Is makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Is(target error) bool { return isCode(target, CodeHeld) }

// Invalidf returns an invalid_request error with a message saying what is wrong.
func Invalidf(format string, args ...any) error {
	return &Error{Code: CodeInvalidRequest, Message: fmt.Sprintf(format, args...)}
}

// NotFoundf returns a not_found error.
func NotFoundf(format string, args ...any) error {
	return &Error{Code: CodeNotFound, Message: fmt.Sprintf(format, args...)}
}

// StoreUnavailable wraps a store failure so callers can tell it from bad
// input: the broker fails closed when its store does not answer.
func StoreUnavailable(op string, err error) error {
	return fmt.Errorf("%s: %w: %w", op, ErrStoreUnavailable, err)
}

// NoContextReason says why acquire found nothing to assign.
type NoContextReason string

// Reasons for no_context_available.
const (
	ReasonNoEligibleClient  NoContextReason = "no_eligible_client"
	ReasonNoIdleWorker      NoContextReason = "no_idle_worker"
	ReasonPlacementMiss     NoContextReason = "placement_miss"
	ReasonCapacityExhausted NoContextReason = "capacity_exhausted"
	// DESIGN §10.
	ReasonQuotaExceeded   NoContextReason = "quota_exceeded"
	ReasonCreationFailed  NoContextReason = "creation_failed"
	ReasonCreationTimeout NoContextReason = "creation_timeout"
)

// NoContextError is returned by Acquire when nothing can be assigned.
type NoContextError struct {
	Reason NoContextReason
	// Quota says which cap was full, for reason quota_exceeded.
	Quota *QuotaFull
}

// QuotaFull is the details of a quota_exceeded error: the quota, the level
// (global, tenant or user) that was full, its slots in use and its cap.
type QuotaFull struct {
	Quota string `json:"quota"`
	Level string `json:"level"`
	Used  int    `json:"used"`
	Cap   int    `json:"cap"`
}

// Details returns the envelope's details of err: a full quota's, or nil.
func Details(err error) map[string]any {
	var he *HeldError
	if errors.As(err, &he) {
		return map[string]any{"state": he.Hold.State, "since": he.Hold.Since.UTC().Format(time.RFC3339Nano)}
	}
	var nc *NoContextError
	if errors.As(err, &nc) && nc.Quota != nil {
		q := nc.Quota
		return map[string]any{"quota": q.Quota, "level": q.Level, "used": q.Used, "cap": q.Cap}
	}
	return nil
}

func (e *NoContextError) Error() string {
	return CodeNoContextAvailable + ": " + string(e.Reason)
}

// Is makes errors.Is(err, ErrNoContextAvailable) true.
func (e *NoContextError) Is(target error) bool { return isCode(target, CodeNoContextAvailable) }

// LostReason says why a handle no longer owns its context. It describes the
// context as it is now, first match wins, in the order of the constants.
type LostReason string

// Reasons for lease_lost.
const (
	LostUnknownLease LostReason = "unknown_lease"
	LostContextGone  LostReason = "context_gone"
	LostNotLive      LostReason = "not_live"
	LostNotWorker    LostReason = "not_worker"
	LostReassigned   LostReason = "reassigned"
	LostReleased     LostReason = "released"
	LostExpired      LostReason = "expired"
	LostRevoked      LostReason = "revoked"
)

// LeaseLostError is returned by a send or renew through a handle that no
// longer owns its context. Nothing was dispatched.
type LeaseLostError struct {
	Reason LostReason
}

func (e *LeaseLostError) Error() string { return CodeLeaseLost + ": " + string(e.Reason) }

// Is makes errors.Is(err, ErrLeaseLost) true.
func (e *LeaseLostError) Is(target error) bool { return isCode(target, CodeLeaseLost) }

func isCode(target error, code string) bool {
	t, ok := target.(*Error)
	return ok && t.Code == code
}

// Classify returns the API code and reason of err: what the HTTP layer puts
// in its error envelope. An error of no known kind is "" (an internal error).
func Classify(err error) (code, reason, message string) {
	var (
		nc *NoContextError
		ll *LeaseLostError
		he *HeldError
		e  *Error
	)
	switch {
	case errors.As(err, &he):
		return CodeHeld, "", he.Error()
	case errors.As(err, &nc):
		return CodeNoContextAvailable, string(nc.Reason), nc.Error()
	case errors.As(err, &ll):
		return CodeLeaseLost, string(ll.Reason), ll.Error()
	case errors.As(err, &e):
		if e.Message == "" {
			// A bare sentinel wraps a cause whose text may name internals
			// (a database address), so the code alone is the message.
			return e.Code, "", e.Code
		}
		return e.Code, "", e.Message
	}
	return "", "", ""
}

// Envelope is the HTTP API's one error shape,
// {"error":{"code":…,"message":…,"reason":…,"details":{}}} (DESIGN §5).
// The server writes it; the remote SDK reads it back with Err.
type Envelope struct {
	Error *EnvelopeError `json:"error,omitempty"`
}

// EnvelopeError is the inside of an Envelope.
type EnvelopeError struct {
	Code    string         `json:"code"`
	Message string         `json:"message"`
	Reason  string         `json:"reason,omitempty"`
	Details map[string]any `json:"details,omitempty"`
}

// Err is the error the envelope describes, of the type an in-process
// caller would get (see FromCode); nil when it holds none.
func (e Envelope) Err() error {
	if e.Error == nil || e.Error.Code == "" {
		return nil
	}
	err := FromCode(e.Error.Code, e.Error.Reason, e.Error.Message)
	if nc, ok := err.(*NoContextError); ok && e.Error.Details != nil {
		d := e.Error.Details
		str := func(k string) string { v, _ := d[k].(string); return v }
		num := func(k string) int { v, _ := d[k].(float64); return int(v) }
		nc.Quota = &QuotaFull{Quota: str("quota"), Level: str("level"), Used: num("used"), Cap: num("cap")}
	}
	if he, ok := err.(*HeldError); ok && e.Error.Details != nil {
		he.Hold.State, _ = e.Error.Details["state"].(string)
		if s, ok := e.Error.Details["since"].(string); ok {
			he.Hold.Since, _ = time.Parse(time.RFC3339Nano, s)
		}
	}
	return err
}

// FromCode rebuilds the error that Classify took apart, so that a remote
// caller gets the same types as an in-process one.
func FromCode(code, reason, message string) error {
	switch code {
	case CodeNoContextAvailable:
		return &NoContextError{Reason: NoContextReason(reason)}
	case CodeLeaseLost:
		return &LeaseLostError{Reason: LostReason(reason)}
	case CodeHeld:
		return &HeldError{}
	}
	return &Error{Code: code, Message: message}
}
