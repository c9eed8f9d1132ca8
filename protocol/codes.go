package protocol

import "errors"

// CloseCode is a WebSocket close status the broker uses. It converts directly
// to the status type of a WebSocket library, e.g.
// websocket.StatusCode(protocol.CloseMalformed).
type CloseCode int

// Close codes of protocol v1. Before closing with a 44xx code the broker sends
// an error frame whose code is CloseCode.ErrorCode, so a client that only sees
// frames (a browser often does not see the close status) still learns why.
const (
	CloseGoingAway    CloseCode = 1001 // the broker is shutting down
	CloseMalformed    CloseCode = 4400 // bad JSON, or a missing or mistyped field of a known type
	CloseUnauthorized CloseCode = 4401 // bad or missing token, or a first frame that is not hello
	CloseForbidden    CloseCode = 4403 // disconnected by an admin, or the key was revoked
	CloseTimeout      CloseCode = 4408 // no hello in time, or a silent client
	CloseReplaced     CloseCode = 4409 // a newer connection with the same client_id took over
	CloseTooLarge     CloseCode = 4413 // a frame larger than max_message_bytes
	CloseRateLimited  CloseCode = 4429 // too many frames
)

// ErrorCode is the code of an error frame. The broker's own codes are below;
// a client's error frame may carry any code of its own, such as
// "navigation_failed".
type ErrorCode string

// Error codes the broker sends. The first group names the reason for each
// close code; the rest answer a single frame without closing.
const (
	CodeMalformed    ErrorCode = "malformed"
	CodeUnauthorized ErrorCode = "unauthorized"
	CodeForbidden    ErrorCode = "forbidden"
	CodeTimeout      ErrorCode = "timeout"
	CodeReplaced     ErrorCode = "replaced"
	CodeTooLarge     ErrorCode = "too_large"
	CodeRateLimited  ErrorCode = "rate_limited"
	CodeGoingAway    ErrorCode = "going_away"

	// CodeUnknownType answers a frame whose type this side does not know. The
	// connection stays open, so that newer clients can talk to older brokers.
	CodeUnknownType ErrorCode = "unknown_type"
	// CodeUnknownCommand answers a frame about a command_id that was not
	// dispatched to this client. Such frames are recorded nowhere.
	CodeUnknownCommand ErrorCode = "unknown_command"
	// CodeDuplicateTerminal answers a second result or error for a command:
	// the first terminal message wins.
	CodeDuplicateTerminal ErrorCode = "duplicate_terminal"
)

// closeInfo is the single table behind ErrorCode and Reason, so that the two
// cannot drift apart. Reasons stay well under the 123 bytes a WebSocket close
// frame allows.
var closeInfo = map[CloseCode]struct {
	code   ErrorCode
	reason string
}{
	CloseGoingAway:    {CodeGoingAway, "broker shutting down"},
	CloseMalformed:    {CodeMalformed, "malformed frame"},
	CloseUnauthorized: {CodeUnauthorized, "bad or missing token"},
	CloseForbidden:    {CodeForbidden, "disconnected by an admin or key revoked"},
	CloseTimeout:      {CodeTimeout, "no hello in time or client silent"},
	CloseReplaced:     {CodeReplaced, "replaced by a newer connection"},
	CloseTooLarge:     {CodeTooLarge, "frame larger than max_message_bytes"},
	CloseRateLimited:  {CodeRateLimited, "rate limited"},
}

// ErrorCode returns the error-frame code that explains c, or "" when c is
// not a close code of this protocol.
func (c CloseCode) ErrorCode() ErrorCode { return closeInfo[c].code }

// Reason returns a short human-readable reason for c, suitable as the reason
// of a WebSocket close frame, or "" when c is not a close code of this
// protocol.
func (c CloseCode) Reason() string { return closeInfo[c].reason }

// CloseCodeFor says how the broker reacts to an error returned by Decode. An
// unknown type does not close the connection (ok is false): the broker
// answers with an unknown_type error and carries on. A hello whose token is
// missing or mistyped is an authentication failure (4401), not a malformed
// frame, because DESIGN §4 promises 4401 for a missing token. Everything else
// is malformed (4400). A nil error gives ok false.
func CloseCodeFor(err error) (code CloseCode, ok bool) {
	if err == nil {
		return 0, false
	}
	if _, unknown := errors.AsType[*UnknownTypeError](err); unknown {
		return 0, false
	}
	if m, isMalformed := errors.AsType[*MalformedError](err); isMalformed &&
		m.FrameType == TypeHello && m.Field == "token" {
		return CloseUnauthorized, true
	}
	return CloseMalformed, true
}
