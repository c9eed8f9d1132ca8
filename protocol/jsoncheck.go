package protocol

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// MaxJSONDepth bounds the nesting of every JSON value the broker stores or
// forwards: a command's params, target and options, and the data of a
// client's progress, event, result and error frames. A value nested deeper
// (arrays and objects count alike; a scalar is depth 0, {} is depth 1) is
// refused: with 400 invalid_request over HTTP, as a malformed frame (4400)
// on the client WebSocket. Whole frames and HTTP bodies may nest one level
// more, for the object that holds the value.
const MaxJSONDepth = 64

// JSONError says what is wrong with a JSON text: where (Field, the first
// member of the outermost object it was found in, "" for the text as a
// whole) and what (Msg, completing the sentence "… ").
type JSONError struct {
	Field string
	Msg   string
}

func (e *JSONError) Error() string {
	if e.Field == "" {
		return e.Msg
	}
	return e.Field + " " + e.Msg
}

// CheckJSON reports whether b is one JSON value the broker accepts: valid
// UTF-8, valid JSON, no object with the same member name twice (a value
// whose meaning depends on which of two names a reader keeps is refused, not
// guessed at), nested at most maxDepth deep. A string may hold any
// character, \u0000 included: JSON is stored as text, escapes and all.
func CheckJSON(b []byte, maxDepth int) *JSONError {
	if !utf8.Valid(b) {
		return &JSONError{Msg: "is not valid UTF-8"}
	}
	jd := getDecoder(b)
	defer putDecoder(jd)
	d := jd.d
	for {
		_, err := d.ReadToken()
		if errors.Is(err, io.EOF) {
			if d.InputOffset() == 0 {
				return &JSONError{Msg: "is empty"}
			}
			return nil
		}
		if err != nil {
			var se *jsontext.SyntacticError
			if errors.As(err, &se) {
				field := topField(se.JSONPointer)
				if errors.Is(se.Err, jsontext.ErrDuplicateName) {
					// The pointer names the member; the object is its parent.
					return &JSONError{Field: topField(se.JSONPointer.Parent()),
						Msg: fmt.Sprintf("has the member %q twice", lastName(se.JSONPointer))}
				}
				if m := se.Err.Error(); strings.Contains(m, "UTF-8") || strings.Contains(m, "surrogate") {
					return &JSONError{Field: field, Msg: "is not valid UTF-8 (an escape names no character)"}
				}
				return &JSONError{Field: field, Msg: fmt.Sprintf("is not valid JSON (at byte %d)", se.ByteOffset)}
			}
			return &JSONError{Msg: "is not valid JSON"}
		}
		if d.StackDepth() > maxDepth {
			return &JSONError{Field: topField(d.StackPointer()),
				Msg: fmt.Sprintf("nests deeper than %d levels", MaxJSONDepth)}
		}
	}
}

// topField returns the first token of a JSON pointer: the member of the
// outermost object a problem is in.
func topField(p jsontext.Pointer) string {
	for t := range p.Tokens() {
		return clip(t)
	}
	return ""
}

func lastName(p jsontext.Pointer) string { return clip(p.LastToken()) }

// NoNUL reports whether s is free of NUL characters. PostgreSQL text holds
// no NUL, so an id, name, label or message with one would be refused by the
// store long after the edge accepted it.
func NoNUL(s string) bool { return strings.IndexByte(s, 0) < 0 }
