package protocol

import (
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// Encode returns the JSON text of f, with its "type" first. It refuses, with
// the same *MalformedError Decode would return, a frame that Decode would
// refuse, so that neither side ever sends what the other must reject.
//
// Encode writes opaque fields (data, params, target, options) byte for byte.
// encoding/json would compact them and escape <, > and &, and the protocol
// promises to pass the caller's bytes through unchanged.
func Encode(f Frame) ([]byte, error) {
	if f == nil || reflect.ValueOf(f).IsNil() {
		return nil, errors.New("protocol: encode: nil frame")
	}
	b, err := Append(make([]byte, 0, sizeHint(f)), f)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// Append is Encode appending to dst, so that a writer can reuse one buffer
// for frame after frame. On error it returns dst unchanged.
func Append(dst []byte, f Frame) ([]byte, error) {
	// Every Frame is a pointer, so a nil one is the only way to get here
	// without a frame.
	if f == nil || reflect.ValueOf(f).IsNil() {
		return dst, errors.New("protocol: encode: nil frame")
	}
	if err := f.validate(false); err != nil {
		return dst, err
	}
	w := writers.Get().(*writer)
	w.buf = dst
	w.begin()
	w.str("type", string(f.FrameType()))
	f.encode(w)
	w.end()
	b := w.buf
	w.buf = nil
	writers.Put(w)
	return b, nil
}

// EncodedLen returns the length of Encode(f) without keeping the text: what
// a size check needs before the frame is sent (and encoded again) later.
func EncodedLen(f Frame) (int, error) {
	bp := scratch.Get().(*[]byte)
	b, err := Append((*bp)[:0], f)
	n := len(b)
	if *bp = KeepBuffer(b); *bp != nil {
		scratch.Put(bp)
	}
	return n, err
}

// scratch recycles EncodedLen's buffers (those KeepBuffer keeps).
var scratch = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// writers recycles writers: one would escape to the heap through the
// frame's encode method.
var writers = sync.Pool{New: func() any { return new(writer) }}

// sizeHint guesses the encoded size of f, so that Encode allocates once.
func sizeHint(f Frame) int {
	const names = 192 // type, member names, ids
	switch f := f.(type) {
	case *Command:
		return names + len(f.CommandID) + len(f.TaskID) + len(f.Name) + len(f.Params) +
			len(f.Target) + len(f.Options) + len(f.Traceparent)
	case *Result:
		return names + len(f.CommandID) + len(f.Data)
	case *Progress:
		return names + len(f.CommandID) + len(f.Data)
	case *Event:
		return names + len(f.CommandID) + len(f.Name) + len(f.Data)
	case *Error:
		return names + len(f.CommandID) + len(f.Message) + len(f.Data)
	case *Capture:
		return names + len(f.CommandID) + len(f.MIME) + len(f.Data)
	}
	return names
}

// writer appends the members of JSON objects. It knows nothing of frames;
// each frame's encode method lists its members, in the order of its struct.
type writer struct {
	buf   []byte
	comma bool // whether the next member needs a separating comma
}

func (w *writer) begin() { w.buf = append(w.buf, '{'); w.comma = false }
func (w *writer) end()   { w.buf = append(w.buf, '}'); w.comma = true }

// key writes a member name. Names are constants of this package, plain
// ASCII, so they need no escaping.
func (w *writer) key(name string) {
	if w.comma {
		w.buf = append(w.buf, ',')
	}
	w.buf = append(w.buf, '"')
	w.buf = append(w.buf, name...)
	w.buf = append(w.buf, '"', ':')
	w.comma = true
}

func (w *writer) str(name, v string) {
	w.key(name)
	w.buf = appendString(w.buf, v)
}

// optStr writes a string member that is omitted when empty.
func (w *writer) optStr(name, v string) {
	if v != "" {
		w.str(name, v)
	}
}

// optTrue writes a boolean member that is omitted when false.
func (w *writer) optTrue(name string, v bool) {
	if v {
		w.key(name)
		w.buf = append(w.buf, "true"...)
	}
}

func (w *writer) int(name string, v int64) {
	w.key(name)
	w.buf = strconv.AppendInt(w.buf, v, 10)
}

// optInt writes an integer member that is omitted when zero.
func (w *writer) optInt(name string, v int64) {
	if v != 0 {
		w.int(name, v)
	}
}

// raw writes opaque data as it is; nil or empty means absent.
func (w *writer) raw(name string, v json.RawMessage) {
	if len(v) > 0 {
		w.key(name)
		w.buf = append(w.buf, v...)
	}
}

// labels writes a label map, omitted only when nil: an empty map stays {},
// so that a decoded frame encodes to what it was decoded from.
func (w *writer) labels(name string, m map[string]string) {
	if m != nil {
		w.key(name)
		w.buf = append(w.buf, '{')
		for i, k := range slices.Sorted(maps.Keys(m)) { // as encoding/json does
			if i > 0 {
				w.buf = append(w.buf, ',')
			}
			w.buf = appendString(w.buf, k)
			w.buf = append(w.buf, ':')
			w.buf = appendString(w.buf, m[k])
		}
		w.buf = append(w.buf, '}')
	}
}

// appendString appends s as a JSON string with encoding/json's escaping,
// so that frames read the same as they always have: ", \ and control
// characters escaped (\b \f \n \r \t short, the others as \u00XX, NUL
// as \u0000), <, > and & as \u003c, \u003e and \u0026, U+2028 and U+2029
// as \u2028 and \u2029, and each byte of invalid UTF-8 as \ufffd.
func appendString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if plainASCII[b] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// plainASCII holds the ASCII bytes a JSON string holds as they are.
var plainASCII = func() (t [utf8.RuneSelf]bool) {
	for b := 0x20; b < utf8.RuneSelf; b++ {
		t[b] = true
	}
	for _, b := range `"\\<>&` {
		t[b] = false
	}
	return t
}()

func (f *Hello) encode(w *writer) {
	w.int("protocol", int64(f.Protocol))
	w.str("token", f.Token)
	w.str("client_id", f.ClientID)
	w.str("client_type", string(f.ClientType))
	w.optStr("name", f.Name)
	w.optStr("version", f.Version)
	w.labels("labels", f.Labels)
	if f.Capacity != nil {
		w.key("capacity")
		w.begin()
		w.int("max_contexts", int64(f.Capacity.MaxContexts))
		w.end()
	}
	w.labels("effects", f.Effects)
}

func (f *State) encode(w *writer) {
	w.key("contexts")
	w.buf = append(w.buf, '[')
	for i, c := range f.Contexts {
		if i > 0 {
			w.buf = append(w.buf, ',')
		}
		w.begin()
		w.str("context_id", c.ContextID)
		w.optStr("tab_id", c.TabID)
		w.str("owner", string(c.Owner))
		w.optStr("url", c.URL)
		w.optStr("title", c.Title)
		w.labels("labels", c.Labels)
		w.optStr("request_id", c.RequestID)
		w.end()
	}
	w.buf = append(w.buf, ']')
}

func (f *Ack) encode(w *writer) { w.str("command_id", f.CommandID) }

func (f *Progress) encode(w *writer) {
	w.str("command_id", f.CommandID)
	w.raw("data", f.Data)
}

func (f *Event) encode(w *writer) {
	w.str("command_id", f.CommandID)
	w.str("name", f.Name)
	w.raw("data", f.Data)
}

func (f *Capture) encode(w *writer) {
	w.str("command_id", f.CommandID)
	w.str("mime", f.MIME)
	w.str("data", f.Data)
}

func (f *Result) encode(w *writer) {
	w.str("command_id", f.CommandID)
	w.raw("data", f.Data)
}

func (f *Error) encode(w *writer) {
	w.optStr("command_id", f.CommandID)
	w.str("code", string(f.Code))
	w.message(f.Message)
	w.raw("data", f.Data)
}

// message writes an error's message. A message is text for people; it may
// quote what a peer sent, so a NUL in it is written as U+FFFD, as invalid
// UTF-8 is, and the frame stays one that Decode accepts.
func (w *writer) message(m string) {
	w.optStr("message", strings.ReplaceAll(m, "\x00", "\uFFFD"))
}

func (*Ping) encode(*writer) {}

func (f *Welcome) encode(w *writer) {
	w.int("protocol", int64(f.Protocol))
	w.str("session_id", f.SessionID)
	w.str("user_id", f.UserID)
	w.int("heartbeat_s", int64(f.HeartbeatS))
	w.int("max_message_bytes", f.MaxMessageBytes)
}

func (f *Command) encode(w *writer) {
	w.str("command_id", f.CommandID)
	w.str("context_id", f.ContextID)
	w.str("task_id", f.TaskID)
	w.int("epoch", f.Epoch)
	w.str("name", f.Name)
	w.raw("params", f.Params)
	w.raw("target", f.Target)
	w.str("response_mode", string(f.ResponseMode))
	w.optInt("timeout_ms", f.TimeoutMS)
	w.raw("options", f.Options)
	w.optStr("traceparent", f.Traceparent)
}

func (f *Cancel) encode(w *writer) {
	w.str("command_id", f.CommandID)
	w.optStr("reason", f.Reason)
}

func (f *Assignment) encode(w *writer) {
	w.str("context_id", f.ContextID)
	w.str("task_id", f.TaskID)
	w.int("epoch", f.Epoch)
	w.str("state", string(f.State))
	w.optTrue("clear_state", f.ClearState)
}

func (*Pong) encode(*writer) {}

func (f *CreateContext) encode(w *writer) {
	w.str("request_id", f.RequestID)
	w.optStr("url", f.URL)
}

func (f *CreateFailed) encode(w *writer) {
	w.str("request_id", f.RequestID)
	w.str("code", string(f.Code))
	w.message(f.Message)
}

func (f *Hold) encode(w *writer) {
	w.str("context_id", f.ContextID)
	if f.TTLSeconds != 0 {
		w.int("ttl_s", f.TTLSeconds)
	}
}

func (f *Unhold) encode(w *writer) { w.str("context_id", f.ContextID) }

func (f *HoldStateFrame) encode(w *writer) {
	w.str("context_id", f.ContextID)
	w.str("state", string(f.State))
}

// MarshalJSON makes encoding/json (and anything built on it, such as a
// WebSocket library's JSON helper) write the frame as Encode does, with its
// type. Prefer Encode: encoding/json compacts opaque fields afterwards.
func (f Hello) MarshalJSON() ([]byte, error) { return Encode(&f) }

// MarshalJSON is explained at Hello.MarshalJSON.
func (f State) MarshalJSON() ([]byte, error) { return Encode(&f) }

// MarshalJSON is explained at Hello.MarshalJSON.
func (f Ack) MarshalJSON() ([]byte, error) { return Encode(&f) }

// MarshalJSON is explained at Hello.MarshalJSON.
func (f Progress) MarshalJSON() ([]byte, error) { return Encode(&f) }

// MarshalJSON is explained at Hello.MarshalJSON.
func (f Event) MarshalJSON() ([]byte, error) { return Encode(&f) }

// MarshalJSON is explained at Hello.MarshalJSON.
func (f Capture) MarshalJSON() ([]byte, error) { return Encode(&f) }

// MarshalJSON is explained at Hello.MarshalJSON.
func (f Result) MarshalJSON() ([]byte, error) { return Encode(&f) }

// MarshalJSON is explained at Hello.MarshalJSON.
func (f Error) MarshalJSON() ([]byte, error) { return Encode(&f) }

// MarshalJSON is explained at Hello.MarshalJSON.
func (f Ping) MarshalJSON() ([]byte, error) { return Encode(&f) }

// MarshalJSON is explained at Hello.MarshalJSON.
func (f Welcome) MarshalJSON() ([]byte, error) { return Encode(&f) }

// MarshalJSON is explained at Hello.MarshalJSON.
func (f Command) MarshalJSON() ([]byte, error) { return Encode(&f) }

// MarshalJSON is explained at Hello.MarshalJSON.
func (f Cancel) MarshalJSON() ([]byte, error) { return Encode(&f) }

// MarshalJSON is explained at Hello.MarshalJSON.
func (f Assignment) MarshalJSON() ([]byte, error) { return Encode(&f) }

// MarshalJSON is explained at Hello.MarshalJSON.
func (f Pong) MarshalJSON() ([]byte, error) { return Encode(&f) }

// MarshalJSON is explained at Hello.MarshalJSON.
func (f CreateContext) MarshalJSON() ([]byte, error) { return Encode(&f) }

// MarshalJSON is explained at Hello.MarshalJSON.
func (f CreateFailed) MarshalJSON() ([]byte, error) { return Encode(&f) }

// MarshalJSON is explained at Hello.MarshalJSON.
func (f Hold) MarshalJSON() ([]byte, error) { return Encode(&f) }

// MarshalJSON is explained at Hello.MarshalJSON.
func (f Unhold) MarshalJSON() ([]byte, error) { return Encode(&f) }

// MarshalJSON is explained at Hello.MarshalJSON.
func (f HoldStateFrame) MarshalJSON() ([]byte, error) { return Encode(&f) }
