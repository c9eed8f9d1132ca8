package protocol

import (
	"bytes"
	"encoding/json"
	"io"
	"strconv"
	"sync"

	"github.com/go-json-experiment/json/jsontext"
)

// The frames of every command's round trip (command, ack, progress, event,
// result, error, cancel, assignment, ping, pong) are decoded in one pass
// with jsontext, without reflection: member values are located in the
// input and read from there. That pass accepts only what the general
// decoder (decodeSlow) accepts: valid JSON with no member named twice,
// nested no deeper than the limit, every field of the right kind, no NUL
// in a string. Anything else, and every other frame type, goes to the
// general decoder, which names the problem exactly as it always has. The
// values are then validated alike.

// Fields the fast pass knows, as indexes into fastFrame.at.
const (
	fType = iota
	fCommandID
	fContextID
	fTaskID
	fEpoch
	fName
	fParams
	fTarget
	fResponseMode
	fTimeoutMS
	fOptions
	fTraceparent
	fData
	fCode
	fMessage
	fState
	fReason
	fClearState
	nFields
)

func fieldIndex(name []byte) int {
	switch string(name) {
	case "type":
		return fType
	case "command_id":
		return fCommandID
	case "context_id":
		return fContextID
	case "task_id":
		return fTaskID
	case "epoch":
		return fEpoch
	case "name":
		return fName
	case "params":
		return fParams
	case "target":
		return fTarget
	case "response_mode":
		return fResponseMode
	case "timeout_ms":
		return fTimeoutMS
	case "options":
		return fOptions
	case "traceparent":
		return fTraceparent
	case "data":
		return fData
	case "code":
		return fCode
	case "message":
		return fMessage
	case "state":
		return fState
	case "reason":
		return fReason
	case "clear_state":
		return fClearState
	}
	return -1
}

// jsonDecoder is a pooled jsontext decoder over a byte slice.
type jsonDecoder struct {
	r bytes.Reader
	d *jsontext.Decoder
}

var jsonDecoders = sync.Pool{New: func() any {
	jd := &jsonDecoder{}
	jd.d = jsontext.NewDecoder(&jd.r)
	return jd
}}

func getDecoder(b []byte) *jsonDecoder {
	jd := jsonDecoders.Get().(*jsonDecoder)
	jd.r.Reset(b)
	jd.d.Reset(&jd.r)
	return jd
}

func putDecoder(jd *jsonDecoder) {
	jd.r.Reset(nil)
	jd.d.Reset(&jd.r)
	jsonDecoders.Put(jd)
}

// fastFrame holds where each known member's value is in the input.
type fastFrame struct {
	b  []byte
	at [nFields]struct{ start, end int } // end 0: absent
	ok bool                              // false once anything needs the general decoder
}

// decodeFast decodes b, or answers false when the general decoder must.
// b is valid UTF-8.
func decodeFast(b []byte) (Frame, bool) {
	jd := getDecoder(b)
	defer putDecoder(jd)
	d := jd.d
	if d.PeekKind() != '{' {
		return nil, false
	}
	if _, err := d.ReadToken(); err != nil {
		return nil, false
	}
	ff := fastFrame{b: b, ok: true}
	for {
		switch d.PeekKind() {
		case '}':
		case '"':
			name, err := d.ReadValue()
			if err != nil || bytes.IndexByte(name, '\\') >= 0 {
				return nil, false
			}
			idx := fieldIndex(name[1 : len(name)-1])
			v, err := d.ReadValue()
			if err != nil {
				return nil, false
			}
			// The frame object is one level; its values may nest the rest.
			if depthOf(v) > MaxJSONDepth {
				return nil, false
			}
			if idx >= 0 {
				end := int(d.InputOffset())
				ff.at[idx].start, ff.at[idx].end = end-len(v), end
			}
			continue
		default:
			return nil, false
		}
		break
	}
	if _, err := d.ReadToken(); err != nil { // the closing brace
		return nil, false
	}
	if _, err := d.ReadToken(); err != io.EOF {
		return nil, false
	}

	typ := ff.value(fType)
	if len(typ) < 2 || typ[0] != '"' || bytes.IndexByte(typ, '\\') >= 0 {
		return nil, false
	}
	var f Frame
	switch Type(typ[1 : len(typ)-1]) {
	case TypeAck:
		f = &Ack{CommandID: ff.str(fCommandID, true)}
	case TypeProgress:
		f = &Progress{CommandID: ff.str(fCommandID, true), Data: ff.raw(fData)}
	case TypeEvent:
		f = &Event{CommandID: ff.str(fCommandID, true), Name: ff.str(fName, true), Data: ff.raw(fData)}
	case TypeResult:
		f = &Result{CommandID: ff.str(fCommandID, true), Data: ff.raw(fData)}
	case TypeError:
		f = &Error{
			CommandID: ff.str(fCommandID, false),
			Code:      ErrorCode(ff.str(fCode, true)),
			Message:   ff.str(fMessage, false),
			Data:      ff.raw(fData),
		}
	case TypePing:
		f = &Ping{}
	case TypePong:
		f = &Pong{}
	case TypeCommand:
		f = &Command{
			CommandID:    ff.str(fCommandID, true),
			ContextID:    ff.str(fContextID, true),
			TaskID:       ff.str(fTaskID, true),
			Epoch:        ff.int(fEpoch, true, 64),
			Name:         ff.str(fName, true),
			Params:       ff.raw(fParams),
			Target:       ff.raw(fTarget),
			ResponseMode: ResponseMode(ff.str(fResponseMode, true)),
			TimeoutMS:    ff.int(fTimeoutMS, false, 64),
			Options:      ff.raw(fOptions),
			Traceparent:  ff.str(fTraceparent, false),
		}
	case TypeCancel:
		f = &Cancel{CommandID: ff.str(fCommandID, true), Reason: ff.str(fReason, false)}
	case TypeAssignment:
		f = &Assignment{
			ContextID:  ff.str(fContextID, true),
			TaskID:     ff.str(fTaskID, true),
			Epoch:      ff.int(fEpoch, true, 64),
			State:      AssignmentState(ff.str(fState, true)),
			ClearState: ff.flag(fClearState),
		}
	default:
		return nil, false
	}
	return f, ff.ok
}

// value is the raw value of a member, nil when absent.
func (ff *fastFrame) value(i int) []byte {
	a := ff.at[i]
	if a.end == 0 {
		return nil
	}
	return ff.b[a.start:a.end]
}

// present returns a member's value, or nil when it is absent or null; a
// missing required one ends the fast pass.
func (ff *fastFrame) present(i int, required bool) []byte {
	v := ff.value(i)
	if v == nil || string(v) == "null" {
		if required {
			ff.ok = false
		}
		return nil
	}
	return v
}

func (ff *fastFrame) str(i int, required bool) string {
	v := ff.present(i, required)
	if v == nil {
		return ""
	}
	if v[0] != '"' {
		ff.ok = false
		return ""
	}
	var s string
	if bytes.IndexByte(v, '\\') < 0 {
		s = string(v[1 : len(v)-1])
	} else {
		u, err := jsontext.AppendUnquote(nil, v)
		if err != nil {
			ff.ok = false
			return ""
		}
		s = string(u)
	}
	if !NoNUL(s) {
		ff.ok = false
		return ""
	}
	return s
}

// flag reads an optional boolean; anything but true, false or null is the
// general decoder's to refuse.
func (ff *fastFrame) flag(i int) bool {
	switch v := ff.present(i, false); string(v) {
	case "", "false":
		return false
	case "true":
		return true
	}
	ff.ok = false
	return false
}

func (ff *fastFrame) int(i int, required bool, bitSize int) int64 {
	v := ff.present(i, required)
	if v == nil {
		return 0
	}
	if v[0] != '-' && (v[0] < '0' || v[0] > '9') {
		ff.ok = false
		return 0
	}
	n, err := strconv.ParseInt(string(v), 10, bitSize)
	if err != nil {
		ff.ok = false
	}
	return n
}

// raw copies an opaque member as it was written, null included, so that
// the frame does not refer to the input.
func (ff *fastFrame) raw(i int) json.RawMessage {
	v := ff.value(i)
	if v == nil {
		return nil
	}
	return append(json.RawMessage(make([]byte, 0, len(v))), v...)
}

// depthOf returns how deep the valid JSON value v nests (a scalar is 0).
func depthOf(v []byte) int {
	if len(v) == 0 || (v[0] != '{' && v[0] != '[') {
		return 0
	}
	depth, deepest := 0, 0
	inString := false
	for i := 0; i < len(v); i++ {
		c := v[i]
		if inString {
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			depth++
			deepest = max(deepest, depth)
		case '}', ']':
			depth--
		}
	}
	return deepest
}

// validValue reports, in one pass, whether v is one JSON value that
// CheckJSON(v, maxDepth) accepts and encoding/json finds valid.
func validValue(v []byte, maxDepth int) bool {
	jd := getDecoder(v)
	defer putDecoder(jd)
	val, err := jd.d.ReadValue()
	if err != nil || depthOf(val) > maxDepth {
		return false
	}
	_, err = jd.d.ReadToken()
	return err == io.EOF
}
