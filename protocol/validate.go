package protocol

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"unicode/utf8"
)

// IDPattern is the form of user, client and context ids. Ids appear in URLs,
// logs and metric labels, so they are kept short and free of characters that
// need escaping.
const IDPattern = `^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$`

// MaxIDLen is the longest id IDPattern admits, in bytes.
const MaxIDLen = 128

// Label limits. Labels are matched on every acquire and stored with every
// client and context, so they are bounded like everything else a client
// sends. Lengths count characters (Unicode code points), not bytes.
const (
	MaxLabels        = 32
	MaxLabelKeyLen   = 64
	MaxLabelValueLen = 256
)

// ValidID reports whether s matches IDPattern. It is used for client_id and
// context_id.
func ValidID(s string) bool {
	if len(s) == 0 || len(s) > MaxIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case i > 0 && (c == '_' || c == '.' || c == ':' || c == '-'):
		default:
			return false
		}
	}
	return true
}

// ValidUserID reports whether s is a well-formed user id. User ids follow the
// same pattern as every other id; the function exists so that callers say
// which id they mean, and so the rule can change for users alone.
func ValidUserID(s string) bool { return ValidID(s) }

// checker collects the first problem found in a frame. Checking stops
// mattering after the first failure, which keeps every check a plain
// statement instead of an if-return ladder.
type checker struct {
	frame Type
	err   *MalformedError
	// jsonChecked is set when the frame's JSON values were checked
	// already: the frame comes from Decode, which checked the whole frame's
	// JSON (syntax, UTF-8, names, depth), or it is a command whose values
	// the broker checked (Command.MarkJSONChecked).
	jsonChecked bool
}

func (c *checker) fail(field, format string, args ...any) {
	if c.err == nil {
		c.err = &MalformedError{FrameType: c.frame, Field: field, Msg: fmt.Sprintf(format, args...)}
	}
}

// result returns the problem as an error, avoiding the typed-nil trap of
// returning c.err directly.
func (c *checker) result() error {
	if c.err == nil {
		return nil
	}
	return c.err
}

func (c *checker) nonEmpty(field, v string) {
	if v == "" {
		c.fail(field, "must not be empty")
	}
}

func (c *checker) id(field, v string) {
	if !ValidID(v) {
		c.fail(field, "must match %s", IDPattern)
	}
}

func (c *checker) nonNegative(field string, v int64) {
	if v < 0 {
		c.fail(field, "must not be negative")
	}
}

func (c *checker) positive(field string, v int64) {
	if v <= 0 {
		c.fail(field, "must be positive")
	}
}

func (c *checker) labels(field string, m map[string]string) {
	if len(m) > MaxLabels {
		c.fail(field, "has %d labels, more than %d", len(m), MaxLabels)
		return
	}
	// Sorted, so that the same frame always gets the same error.
	for _, k := range slices.Sorted(maps.Keys(m)) {
		v := m[k]
		switch {
		case k == "":
			c.fail(field, "has an empty key")
		case !NoNUL(k) || !NoNUL(v):
			c.fail(field, "must not contain NUL (\\u0000)")
		case utf8.RuneCountInString(k) > MaxLabelKeyLen:
			c.fail(field, "has a key longer than %d characters", MaxLabelKeyLen)
		case utf8.RuneCountInString(v) > MaxLabelValueLen:
			c.fail(field, "has a value longer than %d characters at key %q", MaxLabelValueLen, k)
		}
	}
}

// effects checks hello.effects: command names as the broker bounds them,
// each mapped to a known effect.
func (c *checker) effects(field string, m map[string]string) {
	if len(m) > MaxEffects {
		c.fail(field, "has %d commands, more than %d", len(m), MaxEffects)
		return
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		switch v := m[k]; {
		case k == "":
			c.fail(field, "has an empty command name")
		case !NoNUL(k):
			c.fail(field, "must not contain NUL (\\u0000)")
		case len(k) > MaxCommandNameLen:
			c.fail(field, "has a command name longer than %d bytes", MaxCommandNameLen)
		case !ValidEffect(v):
			c.fail(field, "must map each command to %q or %q, not %q at %q", EffectObserve, EffectMutate, v, k)
		}
	}
}

// json checks opaque data, which may be any JSON value. Decode has already
// checked this for the whole frame; Encode needs it because it copies the
// bytes into the frame as they are.
func (c *checker) json(field string, v json.RawMessage) {
	if len(v) == 0 || c.jsonChecked || validValue(v, MaxJSONDepth) {
		return
	}
	// Something is wrong; say what, as the checks always have.
	if !json.Valid(v) || !utf8.Valid(v) {
		c.fail(field, "must be valid JSON in UTF-8")
		return
	}
	if je := CheckJSON(v, MaxJSONDepth); je != nil {
		c.fail(field, "%s", je.Msg)
	}
}

// text checks a string the broker may store: no NUL. (UTF-8 is checked for
// the whole frame.)
func (c *checker) text(field, v string) {
	if !NoNUL(v) {
		c.fail(field, "must not contain NUL (\\u0000)")
	}
}

// object checks opaque data that must be a JSON object or null.
func (c *checker) object(field string, v json.RawMessage) {
	c.json(field, v)
	if len(v) == 0 || c.err != nil {
		return
	}
	// The value is valid JSON, so its first byte gives its kind.
	if t := bytes.TrimLeft(v, " \t\r\n"); t[0] != '{' && t[0] != 'n' {
		c.fail(field, "must be an object")
	}
}

func (f *Hello) validate(decoded bool) error {
	c := &checker{frame: TypeHello, jsonChecked: decoded}
	if f.Protocol != ProtocolVersion {
		c.fail("protocol", "is %d, but only protocol version %d is supported", f.Protocol, ProtocolVersion)
	}
	c.nonEmpty("token", f.Token)
	c.text("token", f.Token)
	c.id("client_id", f.ClientID)
	c.text("name", f.Name)
	c.text("version", f.Version)
	if !f.ClientType.Valid() {
		c.fail("client_type", "must be %q or %q", ClientBrowser, ClientConsole)
	}
	c.labels("labels", f.Labels)
	if f.Capacity != nil {
		c.nonNegative("capacity.max_contexts", int64(f.Capacity.MaxContexts))
	}
	c.effects("effects", f.Effects)
	return c.result()
}

func (f *State) validate(decoded bool) error {
	c := &checker{frame: TypeState, jsonChecked: decoded}
	// Context ids are unique within a client; a report that repeats one
	// cannot say which of the two entries is the truth.
	seen := make(map[string]bool, len(f.Contexts))
	for i, ctx := range f.Contexts {
		path := fmt.Sprintf("contexts[%d].", i)
		c.id(path+"context_id", ctx.ContextID)
		if seen[ctx.ContextID] {
			c.fail(path+"context_id", "repeats an earlier context_id")
		}
		seen[ctx.ContextID] = true
		if !ctx.Owner.Valid() {
			c.fail(path+"owner", "must be %q or %q", OwnerWorker, OwnerHuman)
		}
		c.text(path+"tab_id", ctx.TabID)
		c.text(path+"url", ctx.URL)
		c.text(path+"title", ctx.Title)
		c.labels(path+"labels", ctx.Labels)
		if ctx.RequestID != "" {
			c.id(path+"request_id", ctx.RequestID)
		}
		if c.err != nil {
			break
		}
	}
	return c.result()
}

func (f *Ack) validate(decoded bool) error {
	c := &checker{frame: TypeAck, jsonChecked: decoded}
	c.nonEmpty("command_id", f.CommandID)
	return c.result()
}

func (f *Progress) validate(decoded bool) error {
	c := &checker{frame: TypeProgress, jsonChecked: decoded}
	c.nonEmpty("command_id", f.CommandID)
	c.json("data", f.Data)
	return c.result()
}

func (f *Event) validate(decoded bool) error {
	c := &checker{frame: TypeEvent, jsonChecked: decoded}
	c.nonEmpty("command_id", f.CommandID)
	c.nonEmpty("name", f.Name)
	c.text("name", f.Name)
	c.json("data", f.Data)
	return c.result()
}

func (f *Capture) validate(decoded bool) error {
	c := &checker{frame: TypeCapture, jsonChecked: decoded}
	c.nonEmpty("command_id", f.CommandID)
	c.nonEmpty("mime", f.MIME)
	c.text("mime", f.MIME)
	// Data may be empty: a capture of nothing is odd, but not malformed.
	if _, err := base64.StdEncoding.DecodeString(f.Data); err != nil {
		c.fail("data", "must be standard base64")
	}
	return c.result()
}

func (f *Result) validate(decoded bool) error {
	c := &checker{frame: TypeResult, jsonChecked: decoded}
	c.nonEmpty("command_id", f.CommandID)
	c.json("data", f.Data)
	return c.result()
}

func (f *Error) validate(decoded bool) error {
	c := &checker{frame: TypeError, jsonChecked: decoded}
	c.nonEmpty("code", string(f.Code))
	c.text("code", string(f.Code))
	c.json("data", f.Data)
	return c.result()
}

func (*Ping) validate(bool) error { return nil }

func (f *Welcome) validate(decoded bool) error {
	c := &checker{frame: TypeWelcome, jsonChecked: decoded}
	c.nonNegative("protocol", int64(f.Protocol))
	c.nonEmpty("session_id", f.SessionID)
	if !ValidUserID(f.UserID) {
		c.fail("user_id", "must match %s", IDPattern)
	}
	// A zero heartbeat would have a client ping in a busy loop, and a zero
	// size limit would refuse every frame.
	c.positive("heartbeat_s", int64(f.HeartbeatS))
	c.positive("max_message_bytes", f.MaxMessageBytes)
	return c.result()
}

func (f *Command) validate(decoded bool) error {
	c := &checker{frame: TypeCommand, jsonChecked: decoded || f.jsonChecked}
	c.nonEmpty("command_id", f.CommandID)
	c.id("context_id", f.ContextID)
	c.nonEmpty("task_id", f.TaskID)
	c.text("task_id", f.TaskID)
	c.nonNegative("epoch", f.Epoch)
	c.nonEmpty("name", f.Name)
	c.text("name", f.Name)
	c.json("params", f.Params)
	c.object("target", f.Target)
	if !f.ResponseMode.Valid() {
		c.fail("response_mode", "must be %q, %q or %q", ResponseRPC, ResponseAsync, ResponseNone)
	}
	c.nonNegative("timeout_ms", f.TimeoutMS)
	c.object("options", f.Options)
	return c.result()
}

func (f *Cancel) validate(decoded bool) error {
	c := &checker{frame: TypeCancel, jsonChecked: decoded}
	c.nonEmpty("command_id", f.CommandID)
	return c.result()
}

func (f *Assignment) validate(decoded bool) error {
	c := &checker{frame: TypeAssignment, jsonChecked: decoded}
	c.id("context_id", f.ContextID)
	c.nonEmpty("task_id", f.TaskID)
	c.nonNegative("epoch", f.Epoch)
	if !f.State.Valid() {
		c.fail("state", "must be one of %q, %q, %q, %q or %q", AssignmentAssigned,
			AssignmentReleased, AssignmentExpired, AssignmentRevoked, AssignmentContextGone)
	}
	return c.result()
}

func (*Pong) validate(bool) error { return nil }

func (f *CreateContext) validate(decoded bool) error {
	c := &checker{frame: TypeCreateContext, jsonChecked: decoded}
	c.id("request_id", f.RequestID)
	c.text("url", f.URL)
	return c.result()
}

func (f *CreateFailed) validate(decoded bool) error {
	c := &checker{frame: TypeCreateFailed, jsonChecked: decoded}
	c.id("request_id", f.RequestID)
	c.nonEmpty("code", string(f.Code))
	c.text("code", string(f.Code))
	return c.result()
}

func (f *Hold) validate(decoded bool) error {
	c := &checker{frame: TypeHold, jsonChecked: decoded}
	c.id("context_id", f.ContextID)
	if f.TTLSeconds < 0 || f.TTLSeconds > MaxHoldTTL {
		c.fail("ttl_s", "must be 0 to %d seconds", MaxHoldTTL)
	}
	return c.result()
}

func (f *Unhold) validate(decoded bool) error {
	c := &checker{frame: TypeUnhold, jsonChecked: decoded}
	c.id("context_id", f.ContextID)
	return c.result()
}

func (f *HoldStateFrame) validate(decoded bool) error {
	c := &checker{frame: TypeHoldState, jsonChecked: decoded}
	c.id("context_id", f.ContextID)
	if !f.State.Valid() {
		c.fail("state", "must be %q, %q or %q", HoldPending, HoldActive, HoldEnded)
	}
	return c.result()
}
