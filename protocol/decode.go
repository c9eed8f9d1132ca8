package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MalformedError reports a frame that breaks the protocol: bad JSON, no type,
// or a missing, mistyped or invalid field of a known type. The broker closes
// the connection with CloseMalformed (see CloseCodeFor).
type MalformedError struct {
	// FrameType is the frame's type, or "" when it is not known (bad JSON,
	// missing type).
	FrameType Type
	// Field is the JSON path of the offending field, such as "client_id" or
	// "contexts[2].owner", or "" when the frame as a whole is at fault.
	Field string
	// Msg says what is wrong, completing the sentence "field … ".
	Msg string
	// Err is the underlying error, such as a *json.SyntaxError, if any.
	Err error
}

func (e *MalformedError) Error() string {
	var b strings.Builder
	b.WriteString("protocol: ")
	if e.FrameType != "" {
		b.WriteString(string(e.FrameType))
		b.WriteString(": ")
	}
	if e.Field != "" {
		fmt.Fprintf(&b, "field %q ", e.Field)
	}
	b.WriteString(e.Msg)
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

func (e *MalformedError) Unwrap() error { return e.Err }

// UnknownTypeError reports a well-formed frame whose type this package does
// not know. It is not malformed: the protocol answers it with an unknown_type
// error and keeps the connection, so that a newer peer can probe for
// features.
type UnknownTypeError struct {
	Type string
}

func (e *UnknownTypeError) Error() string {
	return fmt.Sprintf("protocol: unknown frame type %q", clip(e.Type))
}

// clip shortens peer-supplied text before it goes into an error message, so
// that a hostile frame cannot make log lines as large as itself.
func clip(s string) string {
	const limit = 64
	if len(s) <= limit {
		return s
	}
	return s[:limit] + "…"
}

// Decode parses and validates one frame. It returns a pointer to one of the
// frame structs of this package, an *UnknownTypeError for a well-formed
// frame of a type it does not know, or a *MalformedError naming the field at
// fault. A frame must be valid UTF-8, as every WebSocket text frame is.
//
// Decoding is strict about JSON kinds ("epoch":"17" is an error, not 17) and
// matches field names exactly, unlike encoding/json, which would also accept
// "Client_ID". Unknown fields are ignored, for forward compatibility. A null
// value counts as absent, except in the opaque fields (data, params, target,
// options), which keep it. Opaque fields are copied byte for byte, and no
// frame refers to b after Decode returns.
func Decode(b []byte) (Frame, error) {
	// A WebSocket text frame must be UTF-8, and a store of JSON text would
	// refuse anything else later, far from the client that sent it.
	if !utf8.Valid(b) {
		return nil, &MalformedError{Msg: "frame is not valid UTF-8"}
	}
	if f, ok := decodeFast(b); ok {
		if err := f.validate(true); err != nil {
			return nil, err
		}
		return f, nil
	}
	return decodeSlow(b)
}

// decodeSlow decodes any frame, and names exactly what is wrong with a bad
// one. b is valid UTF-8.
func decodeSlow(b []byte) (Frame, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		// encoding/json checks the syntax of the whole input before it
		// decodes anything, so a type error means valid JSON of another kind.
		if _, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
			return nil, &MalformedError{Msg: "frame must be a JSON object"}
		}
		return nil, &MalformedError{Msg: "invalid JSON", Err: err}
	}
	if m == nil { // the input was null
		return nil, &MalformedError{Msg: "frame must be a JSON object"}
	}
	// One pass over the whole frame for what encoding/json lets by: a
	// member named twice (it keeps the last), escapes that name no
	// character, and nesting deeper than any stored value may be.
	if je := CheckJSON(b, MaxJSONDepth+1); je != nil {
		return nil, &MalformedError{Field: je.Field, Msg: frameMsg(je)}
	}
	c := &checker{}
	top := &fields{c: c, m: m}
	typ := Type(top.str("type", true))
	if c.err != nil {
		return nil, c.err
	}
	if typ == "" {
		return nil, &MalformedError{Field: "type", Msg: "must not be empty"}
	}
	c.frame = typ

	var f Frame
	switch typ {
	case TypeHello:
		f = decodeHello(top)
	case TypeState:
		f = decodeState(top)
	case TypeAck:
		f = &Ack{CommandID: top.str("command_id", true)}
	case TypeProgress:
		f = &Progress{CommandID: top.str("command_id", true), Data: top.raw("data")}
	case TypeEvent:
		f = &Event{
			CommandID: top.str("command_id", true),
			Name:      top.str("name", true),
			Data:      top.raw("data"),
		}
	case TypeCapture:
		f = &Capture{
			CommandID: top.str("command_id", true),
			MIME:      top.str("mime", true),
			Data:      top.str("data", true),
		}
	case TypeResult:
		f = &Result{CommandID: top.str("command_id", true), Data: top.raw("data")}
	case TypeError:
		f = &Error{
			CommandID: top.str("command_id", false),
			Code:      ErrorCode(top.str("code", true)),
			Message:   top.str("message", false),
			Data:      top.raw("data"),
		}
	case TypePing:
		f = &Ping{}
	case TypeWelcome:
		f = &Welcome{
			Protocol:        int(top.int("protocol", false, strconv.IntSize)),
			SessionID:       top.str("session_id", true),
			UserID:          top.str("user_id", true),
			HeartbeatS:      int(top.int("heartbeat_s", true, strconv.IntSize)),
			MaxMessageBytes: top.int("max_message_bytes", true, 64),
		}
	case TypeCommand:
		f = &Command{
			CommandID:    top.str("command_id", true),
			ContextID:    top.str("context_id", true),
			TaskID:       top.str("task_id", true),
			Epoch:        top.int("epoch", true, 64),
			Name:         top.str("name", true),
			Params:       top.raw("params"),
			Target:       top.raw("target"),
			ResponseMode: ResponseMode(top.str("response_mode", true)),
			TimeoutMS:    top.int("timeout_ms", false, 64),
			Options:      top.raw("options"),
			Traceparent:  top.str("traceparent", false),
		}
	case TypeCancel:
		f = &Cancel{CommandID: top.str("command_id", true), Reason: top.str("reason", false)}
	case TypeAssignment:
		f = &Assignment{
			ContextID:  top.str("context_id", true),
			TaskID:     top.str("task_id", true),
			Epoch:      top.int("epoch", true, 64),
			State:      AssignmentState(top.str("state", true)),
			ClearState: top.flag("clear_state"),
		}
	case TypePong:
		f = &Pong{}
	case TypeCreateContext:
		f = &CreateContext{RequestID: top.str("request_id", true), URL: top.str("url", false)}
	case TypeCreateFailed:
		f = &CreateFailed{
			RequestID: top.str("request_id", true),
			Code:      ErrorCode(top.str("code", true)),
			Message:   top.str("message", false),
		}
	case TypeHold:
		f = &Hold{ContextID: top.str("context_id", true), TTLSeconds: top.int("ttl_s", false, 64)}
	case TypeUnhold:
		f = &Unhold{ContextID: top.str("context_id", true)}
	case TypeHoldState:
		f = &HoldStateFrame{ContextID: top.str("context_id", true), State: HoldState(top.str("state", true))}
	default:
		return nil, &UnknownTypeError{Type: string(typ)}
	}
	if c.err != nil {
		return nil, c.err
	}
	// The kinds are right; now the values. Encode runs the same checks, so
	// whatever one side sends, the other side accepts.
	if err := f.validate(true); err != nil {
		return nil, err
	}
	return f, nil
}

// frameMsg words a JSON problem of a whole frame.
func frameMsg(je *JSONError) string {
	if je.Field == "" {
		return "frame " + je.Msg
	}
	return je.Msg
}

func decodeHello(r *fields) *Hello {
	h := &Hello{
		Protocol:   int(r.int("protocol", true, strconv.IntSize)),
		Token:      r.str("token", true),
		ClientID:   r.str("client_id", true),
		ClientType: ClientType(r.str("client_type", true)),
		Name:       r.str("name", false),
		Version:    r.str("version", false),
		Labels:     r.labels("labels"),
	}
	if c := r.object("capacity"); c != nil {
		h.Capacity = &Capacity{MaxContexts: int(c.int("max_contexts", false, strconv.IntSize))}
	}
	h.Effects = r.labels("effects")
	return h
}

func decodeState(r *fields) *State {
	elems := r.array("contexts", true)
	// An empty list is a valid report (the client holds no contexts), and
	// it stays a non-nil slice so that it encodes as [] again.
	s := &State{Contexts: make([]ContextReport, 0, len(elems))}
	for i, v := range elems {
		if r.c.err != nil {
			break
		}
		c := r.element("contexts", i, v)
		if c == nil {
			break
		}
		s.Contexts = append(s.Contexts, ContextReport{
			ContextID: c.str("context_id", true),
			TabID:     c.str("tab_id", false),
			Owner:     Owner(c.str("owner", true)),
			URL:       c.str("url", false),
			Title:     c.str("title", false),
			Labels:    c.labels("labels"),
			RequestID: c.str("request_id", false),
		})
	}
	return s
}

// fields reads the members of one JSON object, checking each one's kind.
// The first problem is kept in the shared checker, and every later read is
// a no-op, so the error names the first bad field in reading order.
type fields struct {
	c      *checker
	prefix string // path of this object inside the frame, such as "capacity."
	m      map[string]json.RawMessage
}

func (r *fields) fail(name, msg string) { r.c.fail(r.prefix+name, "%s", msg) }

// lookup returns the raw value of a member, or nil when it is absent or null
// (or an earlier read failed).
func (r *fields) lookup(name string, required bool) json.RawMessage {
	if r.c.err != nil {
		return nil
	}
	v, ok := r.m[name]
	if !ok || string(v) == "null" {
		if required {
			r.fail(name, "is required")
		}
		return nil
	}
	return v
}

func (r *fields) str(name string, required bool) string {
	v := r.lookup(name, required)
	if v == nil {
		return ""
	}
	var s string
	if v[0] != '"' || json.Unmarshal(v, &s) != nil {
		r.fail(name, "must be a string")
		return ""
	}
	if !NoNUL(s) {
		r.fail(name, "must not contain NUL (\\u0000)")
		return ""
	}
	return s
}

// flag reads an optional boolean: absent or null is false.
func (r *fields) flag(name string) bool {
	v := r.lookup(name, false)
	switch string(v) {
	case "", "false":
		return false
	case "true":
		return true
	}
	r.fail(name, "must be true or false")
	return false
}

// int reads an integer that fits in bitSize bits. JSON has a single number
// kind, so an integer field also refuses 17.0 and 1e3: no client has a
// reason to write an integer that way, and refusing keeps Encode's output
// identical to what was decoded.
func (r *fields) int(name string, required bool, bitSize int) int64 {
	v := r.lookup(name, required)
	if v == nil {
		return 0
	}
	if v[0] != '-' && (v[0] < '0' || v[0] > '9') {
		r.fail(name, "must be a number")
		return 0
	}
	n, err := strconv.ParseInt(string(v), 10, bitSize)
	switch {
	case errors.Is(err, strconv.ErrRange):
		r.fail(name, "is out of range")
	case err != nil:
		r.fail(name, "must be an integer")
	}
	return n
}

// raw returns an opaque member exactly as it was written, null included.
// The map it comes from holds copies, so the frame does not alias the input.
func (r *fields) raw(name string) json.RawMessage {
	if r.c.err != nil {
		return nil
	}
	return r.m[name]
}

func (r *fields) labels(name string) map[string]string {
	v := r.lookup(name, false)
	if v == nil {
		return nil
	}
	var m map[string]string
	if v[0] != '{' || json.Unmarshal(v, &m) != nil {
		r.fail(name, "must be an object of strings")
		return nil
	}
	for k, x := range m {
		if !NoNUL(k) || !NoNUL(x) {
			r.fail(name, "must not contain NUL (\\u0000)")
			return nil
		}
	}
	return m
}

// object returns a reader for a nested object member, or nil when it is
// absent, null or not an object.
func (r *fields) object(name string) *fields {
	v := r.lookup(name, false)
	if v == nil {
		return nil
	}
	return r.nested(name, v)
}

func (r *fields) array(name string, required bool) []json.RawMessage {
	v := r.lookup(name, required)
	if v == nil {
		return nil
	}
	var a []json.RawMessage
	if v[0] != '[' || json.Unmarshal(v, &a) != nil {
		r.fail(name, "must be an array")
		return nil
	}
	return a
}

// element returns a reader for the i-th object of an array member.
func (r *fields) element(name string, i int, v json.RawMessage) *fields {
	return r.nested(fmt.Sprintf("%s[%d]", name, i), v)
}

func (r *fields) nested(path string, v json.RawMessage) *fields {
	var m map[string]json.RawMessage
	if v[0] != '{' || json.Unmarshal(v, &m) != nil {
		r.c.fail(r.prefix+path, "must be an object")
		return nil
	}
	return &fields{c: r.c, prefix: r.prefix + path + ".", m: m}
}
