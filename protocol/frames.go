package protocol

import (
	"encoding/base64"
	"encoding/json"
)

// ProtocolVersion is the wire protocol version this package speaks. A client
// states it in hello; the broker echoes it in welcome.
const ProtocolVersion = 1

// Type names a frame; it is the value of every frame's "type" field.
type Type string

// Frame types of protocol v1. Error travels in both directions.
const (
	// Client to broker.
	TypeHello    Type = "hello"
	TypeState    Type = "state"
	TypeAck      Type = "ack"
	TypeProgress Type = "progress"
	TypeEvent    Type = "event"
	TypeCapture  Type = "capture"
	TypeResult   Type = "result"
	TypePing     Type = "ping"
	// TypeCreateFailed answers a create_context the client could not
	// carry out (DESIGN §10).
	TypeCreateFailed Type = "create_failed"
	// TypeHold and TypeUnhold: a person takes over a context and gives it
	// back (DESIGN §10, human control).
	TypeHold   Type = "hold"
	TypeUnhold Type = "unhold"

	// Broker to client.
	TypeWelcome    Type = "welcome"
	TypeCommand    Type = "command"
	TypeCancel     Type = "cancel"
	TypeAssignment Type = "assignment"
	TypePong       Type = "pong"
	// TypeCreateContext asks a client to open a new worker context
	// (DESIGN §10).
	TypeCreateContext Type = "create_context"
	// TypeHoldState tells a client how its hold on a context stands.
	TypeHoldState Type = "hold_state"

	// Both directions.
	TypeError Type = "error"
)

// FromClient reports whether a client may send frames of type t. The broker
// answers any other type with an unknown_type error, as it would a type it
// has never heard of, so a confused client cannot impersonate the broker.
func (t Type) FromClient() bool {
	switch t {
	case TypeHello, TypeState, TypeAck, TypeProgress, TypeEvent, TypeCapture,
		TypeResult, TypePing, TypeError, TypeCreateFailed, TypeHold, TypeUnhold:
		return true
	}
	return false
}

// FromBroker reports whether the broker sends frames of type t.
func (t Type) FromBroker() bool {
	switch t {
	case TypeWelcome, TypeCommand, TypeCancel, TypeAssignment, TypePong, TypeError, TypeCreateContext, TypeHoldState:
		return true
	}
	return false
}

// ClientType is the kind of client, stated in hello.
type ClientType string

// Client types.
const (
	ClientBrowser ClientType = "browser"
	ClientConsole ClientType = "console"
)

// Valid reports whether c is a client type of protocol v1.
func (c ClientType) Valid() bool { return c == ClientBrowser || c == ClientConsole }

// Owner says who a context belongs to. Only worker contexts are ever assigned
// to a task; a human's tab is reported so the broker knows it exists, never
// so it can be driven.
type Owner string

// Context owners.
const (
	OwnerWorker Owner = "worker"
	OwnerHuman  Owner = "human"
)

// Valid reports whether o is an owner of protocol v1.
func (o Owner) Valid() bool { return o == OwnerWorker || o == OwnerHuman }

// The effects a command may declare in hello.effects: what it does to its
// context.
const (
	EffectObserve = "observe" // reads the context and changes nothing
	EffectMutate  = "mutate"  // changes the context or the world
)

// ValidEffect reports whether e is a known effect.
func ValidEffect(e string) bool { return e == EffectObserve || e == EffectMutate }

// Bounds of hello.effects: command names are bounded as the broker bounds
// a command's name.
const (
	MaxEffects        = 256
	MaxCommandNameLen = 128
)

// ResponseMode says what the client owes the broker once a command ends.
type ResponseMode string

// Response modes.
const (
	// ResponseRPC: a caller waits for the terminal message.
	ResponseRPC ResponseMode = "rpc"
	// ResponseAsync: the client still sends one terminal message, but nobody
	// waits for it. It is the default for a plain send.
	ResponseAsync ResponseMode = "async"
	// ResponseNone: the client sends no terminal message at all.
	ResponseNone ResponseMode = "none"
)

// Valid reports whether m is a response mode of protocol v1.
func (m ResponseMode) Valid() bool {
	return m == ResponseRPC || m == ResponseAsync || m == ResponseNone
}

// AssignmentState is the news an assignment frame carries about a context.
type AssignmentState string

// Assignment states.
const (
	AssignmentAssigned    AssignmentState = "assigned"
	AssignmentReleased    AssignmentState = "released"
	AssignmentExpired     AssignmentState = "expired"
	AssignmentRevoked     AssignmentState = "revoked"
	AssignmentContextGone AssignmentState = "context_gone"
)

// Valid reports whether s is an assignment state of protocol v1.
func (s AssignmentState) Valid() bool {
	switch s {
	case AssignmentAssigned, AssignmentReleased, AssignmentExpired,
		AssignmentRevoked, AssignmentContextGone:
		return true
	}
	return false
}

// Frame is one protocol message. Only the frame types of this package
// implement it, always as pointers (*Hello, *State, …), which is also what
// Decode returns; a type switch on a value type such as Hello does not
// compile, so it cannot silently never match.
//
// Frame structs carry no type field: the Go type is the frame type, and
// Encode writes "type" from FrameType, so the two can never disagree.
type Frame interface {
	FrameType() Type

	// validate checks what the JSON kinds alone cannot: required strings are
	// not empty, ids and enums are valid, limits hold, opaque data is JSON.
	validate(decoded bool) error
	// encode appends the frame's fields after the "type" member.
	encode(w *writer)
}

// Capacity is what a client can hold.
type Capacity struct {
	// MaxContexts is how many contexts the client can hold in all; 0 means
	// the client did not say. It never limits leases on reported contexts.
	MaxContexts int `json:"max_contexts"`
}

// Hello is the first frame of every connection. The token travels here, not
// in a header, because browsers cannot set headers on a WebSocket.
type Hello struct {
	Protocol   int               `json:"protocol"`
	Token      string            `json:"token"`
	ClientID   string            `json:"client_id"`
	ClientType ClientType        `json:"client_type"`
	Name       string            `json:"name,omitempty"`
	Version    string            `json:"version,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	Capacity   *Capacity         `json:"capacity,omitempty"`
	// Effects says, for each command the client offers, whether it only
	// reads (EffectObserve) or changes something (EffectMutate). A
	// command missing from it has no declared effect.
	Effects map[string]string `json:"effects,omitempty"`
}

// ContextReport describes one context in a state frame.
type ContextReport struct {
	ContextID string            `json:"context_id"`
	TabID     string            `json:"tab_id,omitempty"`
	Owner     Owner             `json:"owner"`
	URL       string            `json:"url,omitempty"`
	Title     string            `json:"title,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	// RequestID names the create_context this context was opened for, in
	// the report that first lists it (DESIGN §10).
	RequestID string `json:"request_id,omitempty"`
}

// State is the client's full list of contexts. It replaces the previous
// report: a context missing from it is gone.
type State struct {
	Contexts []ContextReport `json:"contexts"`
}

// Ack tells the broker that the client accepted a command.
type Ack struct {
	CommandID string `json:"command_id"`
}

// Progress is an intermediate message about a running command.
type Progress struct {
	CommandID string          `json:"command_id"`
	Data      json.RawMessage `json:"data,omitempty"`
}

// Event is a named occurrence during a command, such as a console line.
type Event struct {
	CommandID string          `json:"command_id"`
	Name      string          `json:"name"`
	Data      json.RawMessage `json:"data,omitempty"`
}

// Capture carries binary output of a command, such as a screenshot. JSON
// cannot hold bytes, so Data is standard base64 with padding.
type Capture struct {
	CommandID string `json:"command_id"`
	MIME      string `json:"mime"`
	Data      string `json:"data"`
}

// NewCapture returns a capture frame holding b.
func NewCapture(commandID, mime string, b []byte) *Capture {
	return &Capture{CommandID: commandID, MIME: mime, Data: base64.StdEncoding.EncodeToString(b)}
}

// Bytes decodes the capture's data. It cannot fail on a capture returned by
// Decode, which has already checked the encoding.
func (c *Capture) Bytes() ([]byte, error) {
	return base64.StdEncoding.DecodeString(c.Data)
}

// Result is the successful terminal message of a command.
type Result struct {
	CommandID string          `json:"command_id"`
	Data      json.RawMessage `json:"data,omitempty"`
}

// Error is a failure, in either direction. From a client with a CommandID it
// is the failed terminal message of that command; from the broker it says
// why a frame was refused or why the connection is about to close.
type Error struct {
	CommandID string          `json:"command_id,omitempty"`
	Code      ErrorCode       `json:"code"`
	Message   string          `json:"message,omitempty"`
	Data      json.RawMessage `json:"data,omitempty"`
}

// Ping asks the other side to answer with Pong. Extensions send it to keep
// their service worker alive as much as to test the connection.
type Ping struct{}

// Welcome answers a hello that the broker accepted.
type Welcome struct {
	Protocol        int    `json:"protocol"`
	SessionID       string `json:"session_id"`
	UserID          string `json:"user_id"`
	HeartbeatS      int    `json:"heartbeat_s"`
	MaxMessageBytes int64  `json:"max_message_bytes"`
}

// Command asks a client to run a named command on one of its contexts.
// Params, Target and Options belong to the caller and reach the client byte
// for byte as the caller wrote them.
type Command struct {
	CommandID    string          `json:"command_id"`
	ContextID    string          `json:"context_id"`
	TaskID       string          `json:"task_id"`
	Epoch        int64           `json:"epoch"`
	Name         string          `json:"name"`
	Params       json.RawMessage `json:"params,omitempty"`
	Target       json.RawMessage `json:"target,omitempty"`
	ResponseMode ResponseMode    `json:"response_mode"`
	TimeoutMS    int64           `json:"timeout_ms,omitempty"`
	Options      json.RawMessage `json:"options,omitempty"`
	Traceparent  string          `json:"traceparent,omitempty"`

	// jsonChecked is set by MarkJSONChecked.
	jsonChecked bool
}

// MarkJSONChecked records that f's Params, Target and Options have been
// checked as the broker checks what it stores (CheckJSON at MaxJSONDepth,
// Target and Options objects), so that encoding f does not check them
// again: the broker's admission checks a command's JSON once, and the
// command is then encoded twice (its size, then the frame sent), each of
// which would otherwise read every byte of it again. Whoever sets one of
// the three afterwards must check it again before sending f.
func (f *Command) MarkJSONChecked() { f.jsonChecked = true }

// Cancel asks a client to stop a command. It is advice: the client still
// owes the command's terminal message, if its response mode asks for one.
type Cancel struct {
	CommandID string `json:"command_id"`
	Reason    string `json:"reason,omitempty"`
}

// Assignment tells a client that one of its contexts was assigned to a task
// or stopped being so.
type Assignment struct {
	ContextID string          `json:"context_id"`
	TaskID    string          `json:"task_id"`
	Epoch     int64           `json:"epoch"`
	State     AssignmentState `json:"state"`
	// ClearState, on the assignment that begins a lease and on the one that
	// ends it, asks the client to clear the context's state (a tab's
	// cookies and storage for the sites it visited, its page) before it
	// runs anything after this frame. It is never set when an assignment is
	// only told again (a reconnect, a hand-over).
	ClearState bool `json:"clear_state,omitempty"`
}

// Pong answers Ping.
type Pong struct{}

// CreateContext asks a client to open a new worker context, at URL (its
// blank page when empty), and to list it in its next state report with
// RequestID on the context's object (DESIGN §10).
type CreateContext struct {
	RequestID string `json:"request_id"`
	URL       string `json:"url,omitempty"`
}

// CreateFailed tells the broker that the client could not open the context
// a create_context asked for.
type CreateFailed struct {
	RequestID string    `json:"request_id"`
	Code      ErrorCode `json:"code"`
	Message   string    `json:"message,omitempty"`
}

// HoldState is how a hold stands.
type HoldState string

// Hold states: pending while the context's admitted mutations drain,
// active once they ended, ended when the hold is over.
const (
	HoldPending HoldState = "pending"
	HoldActive  HoldState = "active"
	HoldEnded   HoldState = "ended"
)

// Valid reports whether s is a hold state.
func (s HoldState) Valid() bool { return s == HoldPending || s == HoldActive || s == HoldEnded }

// Bounds of a hold's TTL, in seconds (ttl_s; 0 or absent is the default).
const (
	DefaultHoldTTL = 300
	MaxHoldTTL     = 3600
)

// Hold asks the broker to stop new mutations on a context while a person
// drives it, for TTLSeconds at most (DefaultHoldTTL when zero).
type Hold struct {
	ContextID  string `json:"context_id"`
	TTLSeconds int64  `json:"ttl_s,omitempty"`
}

// Unhold gives a held context back.
type Unhold struct {
	ContextID string `json:"context_id"`
}

// HoldStateFrame answers hold and unhold, and tells of a hold's activation
// and end.
type HoldStateFrame struct {
	ContextID string    `json:"context_id"`
	State     HoldState `json:"state"`
}

// FrameType implements Frame.
func (*Hold) FrameType() Type { return TypeHold }

// FrameType implements Frame.
func (*Unhold) FrameType() Type { return TypeUnhold }

// FrameType implements Frame.
func (*HoldStateFrame) FrameType() Type { return TypeHoldState }

// FrameType implements Frame.
func (*CreateContext) FrameType() Type { return TypeCreateContext }

// FrameType implements Frame.
func (*CreateFailed) FrameType() Type { return TypeCreateFailed }

// FrameType implements Frame.
func (*Hello) FrameType() Type { return TypeHello }

// FrameType implements Frame.
func (*State) FrameType() Type { return TypeState }

// FrameType implements Frame.
func (*Ack) FrameType() Type { return TypeAck }

// FrameType implements Frame.
func (*Progress) FrameType() Type { return TypeProgress }

// FrameType implements Frame.
func (*Event) FrameType() Type { return TypeEvent }

// FrameType implements Frame.
func (*Capture) FrameType() Type { return TypeCapture }

// FrameType implements Frame.
func (*Result) FrameType() Type { return TypeResult }

// FrameType implements Frame.
func (*Error) FrameType() Type { return TypeError }

// FrameType implements Frame.
func (*Ping) FrameType() Type { return TypePing }

// FrameType implements Frame.
func (*Welcome) FrameType() Type { return TypeWelcome }

// FrameType implements Frame.
func (*Command) FrameType() Type { return TypeCommand }

// FrameType implements Frame.
func (*Cancel) FrameType() Type { return TypeCancel }

// FrameType implements Frame.
func (*Assignment) FrameType() Type { return TypeAssignment }

// FrameType implements Frame.
func (*Pong) FrameType() Type { return TypePong }
