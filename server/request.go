package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"

	"github.com/gin-gonic/gin"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/protocol"
)

// bind decodes a JSON body into v, the same way on every route: a body over
// the limit is payload_too_large; one that is not valid UTF-8, not one JSON
// object, names a member twice, nests deeper than MaxJSONDepth below the
// body, has an unknown member or a member of the wrong kind, or holds a NUL
// in any string it decodes to, is invalid_request with a message that names
// the member. An empty body is an empty object.
func (s *Server) bind(c *gin.Context, v any) bool {
	body, err := io.ReadAll(s.limitBody(c))
	if err != nil {
		s.fail(c, s.bodyError(err))
		return false
	}
	if err := decodeBody(body, v); err != nil {
		s.fail(c, err)
		return false
	}
	return true
}

// limitBody is c's body, bounded by MaxBodyBytes.
func (s *Server) limitBody(c *gin.Context) io.ReadCloser {
	return http.MaxBytesReader(c.Writer, c.Request.Body, s.cfg.MaxBodyBytes)
}

// bodyError is what a caller whose body could not be read is told: over
// the limit is payload_too_large.
func (s *Server) bodyError(err error) error {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return &cheetah.Error{Code: cheetah.CodePayloadTooLarge, Message: fmt.Sprintf("the body exceeds %d bytes", s.cfg.MaxBodyBytes)}
	}
	return cheetah.Invalidf("the body could not be read")
}

// decodeBody is bind's decoder, apart so that it can be tested alone.
func decodeBody(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	}
	// The body is an object holding the stored values, so it may nest one
	// level more than they may.
	if je := protocol.CheckJSON(body, cheetah.MaxJSONDepth+1); je != nil {
		if je.Field == "" {
			return cheetah.Invalidf("body %s", je.Msg)
		}
		return cheetah.Invalidf("%s %s", je.Field, je.Msg)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return bodyError(err, v)
	}
	if dec.More() {
		return cheetah.Invalidf("body must be one JSON object, with nothing after it")
	}
	return noNUL(reflect.ValueOf(v), "")
}

// bodyError words a decoding error for the caller: the member and what it
// must be, never a Go type.
func bodyError(err error, v any) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field == "" {
			return cheetah.Invalidf("body must be a JSON object")
		}
		top, _, _ := strings.Cut(te.Field, ".")
		return cheetah.Invalidf("%s must be %s", top, kindOf(v, top))
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return cheetah.Invalidf("body has an unknown member %s", name)
	}
	return cheetah.Invalidf("body is not valid JSON")
}

// kindOf says in JSON terms what the member named name of the struct v
// points to holds.
func kindOf(v any, name string) string {
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() == reflect.Struct {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if tag, _, _ := strings.Cut(f.Tag.Get("json"), ","); tag == name {
				return describe(f.Type)
			}
		}
	}
	return "of another kind"
}

func describe(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == reflect.TypeOf(json.RawMessage(nil)) {
		return "a JSON value"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Map:
		return "an object of " + plural(describe(t.Elem()))
	case reflect.Slice, reflect.Array:
		return "an array of " + plural(describe(t.Elem()))
	case reflect.Struct:
		return "an object"
	}
	return "of another kind"
}

func plural(s string) string {
	s = strings.TrimPrefix(strings.TrimPrefix(s, "an "), "a ")
	return s + "s"
}

// noNUL refuses a NUL in any string a body decoded to: PostgreSQL text holds
// none. Opaque JSON values (json.RawMessage) are byte slices and are not
// walked: they are stored as JSON text, escapes and all.
func noNUL(v reflect.Value, path string) error {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			return noNUL(v.Elem(), path)
		}
	case reflect.String:
		if !protocol.NoNUL(v.String()) {
			return cheetah.Invalidf("%s must not contain NUL (\\u0000)", path)
		}
	case reflect.Struct:
		t := v.Type()
		for i := 0; i < t.NumField(); i++ {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
			if err := noNUL(v.Field(i), name); err != nil {
				return err
			}
		}
	case reflect.Map:
		it := v.MapRange()
		for it.Next() {
			if err := noNUL(it.Key(), path); err != nil {
				return err
			}
			if err := noNUL(it.Value(), path); err != nil {
				return err
			}
		}
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return nil
		}
		for i := 0; i < v.Len(); i++ {
			if err := noNUL(v.Index(i), path); err != nil {
				return err
			}
		}
	}
	return nil
}

// idParams says how each path parameter is checked; every id in a path goes
// through checkParams before any handler sees it.
var idParams = map[string]func(field, v string) error{
	"user_id":    cheetah.CheckID,
	"client_id":  cheetah.CheckID,
	"context_id": cheetah.CheckID,
	"command_id": checkCommandID,
	"id":         cheetah.CheckID,
	"task_id":    cheetah.CheckTaskID,
}

// checkCommandID answers a command id that cannot be one the broker made
// (it makes them: UUIDv7) as not_found, as the in-process SDK does for any
// unknown id, without asking the store.
func checkCommandID(_, v string) error {
	if !protocol.ValidID(v) {
		return cheetah.NotFoundf("no command with that id")
	}
	return nil
}

// idQueries are the query parameters that filter by an id when given.
var idQueries = map[string]func(field, v string) error{
	"user_id": cheetah.CheckID,
	"task_id": cheetah.CheckTaskID,
}

// checkParams validates the path and query of every API request in one
// place: a malformed id is 400 invalid_request on every route, never an
// empty answer, a 404, or a store error; every other query value must be
// UTF-8 without NUL.
func (s *Server) checkParams(c *gin.Context) {
	for _, p := range c.Params {
		check := idParams[p.Key]
		if check == nil {
			check = cheetah.CheckText
		}
		if err := check(p.Key, p.Value); err != nil {
			s.fail(c, err)
			return
		}
	}
	for name, vals := range c.Request.URL.Query() {
		for _, v := range vals {
			check := cheetah.CheckText
			if f := idQueries[name]; f != nil && v != "" {
				check = f
			}
			if err := check(name, v); err != nil {
				s.fail(c, err)
				return
			}
		}
	}
}
