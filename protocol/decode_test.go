package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// requireMalformed asserts that err is a *MalformedError about field.
func requireMalformed(t *testing.T, err error, frame Type, field string) *MalformedError {
	t.Helper()
	require.Error(t, err)
	m, ok := errors.AsType[*MalformedError](err)
	require.True(t, ok, "want *MalformedError, got %T: %v", err, err)
	require.Equal(t, frame, m.FrameType, err.Error())
	require.Equal(t, field, m.Field, err.Error())
	if field != "" {
		require.Contains(t, err.Error(), fmt.Sprintf("field %q", field))
	}
	return m
}

func TestDecodeValid(t *testing.T) {
	t.Parallel()
	for _, tc := range frameCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, err := Decode([]byte(tc.json))
			require.NoError(t, err)
			require.Equal(t, tc.want, f)
		})
	}
}

func TestDecodeMissingField(t *testing.T) {
	t.Parallel()
	for _, tc := range frameCases {
		for _, field := range tc.required {
			t.Run(tc.name+"/"+field, func(t *testing.T) {
				t.Parallel()
				_, err := Decode(withField(t, tc.json, field, nil, true))
				requireMalformed(t, err, Type(tc.name), field)
				require.EqualError(t, err, fmt.Sprintf("protocol: %s: field %q is required", tc.name, field))

				// null means absent.
				_, err = Decode(withField(t, tc.json, field, nil, false))
				requireMalformed(t, err, Type(tc.name), field)
			})
		}
	}
}

func TestDecodeMistypedField(t *testing.T) {
	t.Parallel()
	for _, tc := range frameCases {
		for field, v := range tc.mistyped {
			t.Run(tc.name+"/"+field, func(t *testing.T) {
				t.Parallel()
				_, err := Decode(withField(t, tc.json, field, v, false))
				m := requireMalformed(t, err, Type(tc.name), field)
				require.True(t, strings.HasPrefix(m.Msg, "must be a"), m.Msg)
			})
		}
	}
}

func TestDecodeNestedFields(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, json, field, msg string
	}{
		{"context missing id", `{"type":"state","contexts":[{"owner":"worker"}]}`,
			"contexts[0].context_id", "is required"},
		{"context missing owner", `{"type":"state","contexts":[{"context_id":"a","owner":"worker"},{"context_id":"b"}]}`,
			"contexts[1].owner", "is required"},
		{"context not an object", `{"type":"state","contexts":["tab-12"]}`,
			"contexts[0]", "must be an object"},
		{"context null", `{"type":"state","contexts":[null]}`,
			"contexts[0]", "must be an object"},
		{"context tab_id number", `{"type":"state","contexts":[{"context_id":"a","owner":"worker","tab_id":12}]}`,
			"contexts[0].tab_id", "must be a string"},
		{"context url", `{"type":"state","contexts":[{"context_id":"a","owner":"worker","url":{}}]}`,
			"contexts[0].url", "must be a string"},
		{"context title", `{"type":"state","contexts":[{"context_id":"a","owner":"worker","title":[]}]}`,
			"contexts[0].title", "must be a string"},
		{"context labels", `{"type":"state","contexts":[{"context_id":"a","owner":"worker","labels":{"k":1}}]}`,
			"contexts[0].labels", "must be an object of strings"},
		{"context bad owner", `{"type":"state","contexts":[{"context_id":"a","owner":"robot"}]}`,
			"contexts[0].owner", `must be "worker" or "human"`},
		{"context bad id", `{"type":"state","contexts":[{"context_id":"-a","owner":"worker"}]}`,
			"contexts[0].context_id", "must match " + IDPattern},
		{"context duplicate id", `{"type":"state","contexts":[{"context_id":"a","owner":"worker"},{"context_id":"a","owner":"human"}]}`,
			"contexts[1].context_id", "repeats an earlier context_id"},
		{"capacity max_contexts", `{"type":"hello","protocol":1,"token":"k","client_id":"c","client_type":"console","capacity":{"max_contexts":"8"}}`,
			"capacity.max_contexts", "must be a number"},
		{"capacity negative", `{"type":"hello","protocol":1,"token":"k","client_id":"c","client_type":"console","capacity":{"max_contexts":-1}}`,
			"capacity.max_contexts", "must not be negative"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, err := Decode([]byte(tc.json))
			require.Nil(t, f)
			m := requireMalformed(t, err, Type(gjsonType(t, tc.json)), tc.field)
			require.Equal(t, tc.msg, m.Msg)
		})
	}
}

func gjsonType(t *testing.T, s string) string {
	t.Helper()
	var v struct{ Type string }
	require.NoError(t, json.Unmarshal([]byte(s), &v))
	return v.Type
}

func TestDecodeInvalidValues(t *testing.T) {
	t.Parallel()
	hello := caseJSON(t, "hello")
	command := caseJSON(t, "command")
	long := func(n int) string { return strings.Repeat("é", n) } // counts characters, not bytes
	tooMany := map[string]string{}
	for i := range MaxLabels + 1 {
		tooMany[fmt.Sprint("k", i)] = "v"
	}
	tooManyEffects := map[string]string{}
	for i := range MaxEffects + 1 {
		tooManyEffects[fmt.Sprint("c", i)] = "observe"
	}
	tests := []struct {
		name  string
		frame []byte
		field string
		msg   string
	}{
		{"protocol version", withField(t, hello, "protocol", 2, false), "protocol",
			"is 2, but only protocol version 1 is supported"},
		{"protocol fraction", []byte(`{"type":"hello","protocol":1.0,"token":"k","client_id":"c","client_type":"console"}`),
			"protocol", "must be an integer"},
		{"empty token", withField(t, hello, "token", "", false), "token", "must not be empty"},
		{"client_id pattern", withField(t, hello, "client_id", "ext 7f3a", false), "client_id",
			"must match " + IDPattern},
		{"client_id too long", withField(t, hello, "client_id", strings.Repeat("a", 129), false), "client_id",
			"must match " + IDPattern},
		{"client_type", withField(t, hello, "client_type", "tv", false), "client_type",
			`must be "browser" or "console"`},
		{"labels not strings", withField(t, hello, "labels", map[string]any{"a": 1}, false), "labels",
			"must be an object of strings"},
		{"too many labels", withField(t, hello, "labels", tooMany, false), "labels", "has 33 labels, more than 32"},
		{"empty label key", withField(t, hello, "labels", map[string]string{"": "v"}, false), "labels",
			"has an empty key"},
		{"label key too long", withField(t, hello, "labels", map[string]string{long(65): "v"}, false), "labels",
			"has a key longer than 64 characters"},
		{"label key at limit", withField(t, hello, "labels", map[string]string{long(64): long(256)}, false), "", ""},
		{"label value too long", withField(t, hello, "labels", map[string]string{"k": long(257)}, false), "labels",
			`has a value longer than 256 characters at key "k"`},
		{"effects not strings", withField(t, hello, "effects", map[string]any{"navigate": true}, false), "effects",
			"must be an object of strings"},
		{"effect unknown", withField(t, hello, "effects", map[string]string{"navigate": "write"}, false), "effects",
			`must map each command to "observe" or "mutate", not "write" at "navigate"`},
		{"effect empty name", withField(t, hello, "effects", map[string]string{"": "observe"}, false), "effects",
			"has an empty command name"},
		{"effect name too long", withField(t, hello, "effects", map[string]string{strings.Repeat("n", 129): "observe"}, false),
			"effects", "has a command name longer than 128 bytes"},
		{"effect name at limit", withField(t, hello, "effects", map[string]string{strings.Repeat("n", 128): "mutate"}, false), "", ""},
		{"too many effects", withField(t, hello, "effects", tooManyEffects, false), "effects", "has 257 commands, more than 256"},
		{"epoch string", withField(t, command, "epoch", "17", false), "epoch", "must be a number"},
		{"epoch fraction", []byte(strings.Replace(command, `"epoch":17`, `"epoch":17.5`, 1)), "epoch", "must be an integer"},
		{"epoch exponent", []byte(strings.Replace(command, `"epoch":17`, `"epoch":1e3`, 1)), "epoch", "must be an integer"},
		{"epoch overflow", []byte(strings.Replace(command, `"epoch":17`, `"epoch":9223372036854775808`, 1)), "epoch", "is out of range"},
		{"epoch negative", withField(t, command, "epoch", -1, false), "epoch", "must not be negative"},
		{"epoch bool", withField(t, command, "epoch", true, false), "epoch", "must be a number"},
		{"timeout negative", withField(t, command, "timeout_ms", -5, false), "timeout_ms", "must not be negative"},
		{"response_mode", withField(t, command, "response_mode", "sync", false), "response_mode",
			`must be "rpc", "async" or "none"`},
		{"target array", withField(t, command, "target", []string{"12"}, false), "target", "must be an object"},
		{"target null", withField(t, command, "target", nil, false), "", ""},
		{"options string", withField(t, command, "options", "x", false), "options", "must be an object"},
		{"empty command_id", withField(t, command, "command_id", "", false), "command_id", "must not be empty"},
		{"empty name", withField(t, command, "name", "", false), "name", "must not be empty"},
		{"context_id pattern", withField(t, command, "context_id", "tab/12", false), "context_id",
			"must match " + IDPattern},
		{"capture base64", []byte(`{"type":"capture","command_id":"c","mime":"image/png","data":"not base64!"}`),
			"data", "must be standard base64"},
		{"capture url base64", []byte(`{"type":"capture","command_id":"c","mime":"image/png","data":"__8="}`),
			"data", "must be standard base64"},
		{"capture empty data", []byte(`{"type":"capture","command_id":"c","mime":"text/plain","data":""}`), "", ""},
		{"assignment state", []byte(`{"type":"assignment","context_id":"a","task_id":"t","epoch":1,"state":"gone"}`),
			"state", `must be one of "assigned", "released", "expired", "revoked" or "context_gone"`},
		{"welcome user_id", []byte(`{"type":"welcome","protocol":1,"session_id":"s","user_id":"usr 1","heartbeat_s":20,"max_message_bytes":1}`),
			"user_id", "must match " + IDPattern},
		{"welcome heartbeat zero", []byte(`{"type":"welcome","protocol":1,"session_id":"s","user_id":"u","heartbeat_s":0,"max_message_bytes":1}`),
			"heartbeat_s", "must be positive"},
		{"welcome without protocol", []byte(`{"type":"welcome","session_id":"s","user_id":"u","heartbeat_s":20,"max_message_bytes":1}`), "", ""},
		{"error empty code", []byte(`{"type":"error","code":""}`), "code", "must not be empty"},
		{"error without command", []byte(`{"type":"error","code":"unknown_type"}`), "", ""},
		// Field names match exactly, unlike encoding/json's case-folding.
		{"case-folded name", []byte(`{"type":"ack","Command_ID":"c"}`), "command_id", "is required"},
		{"case-folded duplicate", []byte(`{"type":"ack","command_id":"c","COMMAND_ID":7}`), "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, err := Decode(tc.frame)
			if tc.msg == "" {
				require.NoError(t, err)
				require.NotNil(t, f)
				return
			}
			m := requireMalformed(t, err, Type(gjsonType(t, string(tc.frame))), tc.field)
			require.Equal(t, tc.msg, m.Msg)
		})
	}
}

func TestDecodeErrorMessages(t *testing.T) {
	t.Parallel()
	_, err := Decode([]byte(`{"type":"hello","protocol":1,"token":"k","client_type":"browser"}`))
	require.EqualError(t, err, `protocol: hello: field "client_id" is required`)
	_, err = Decode([]byte(`{"type":"assignment","context_id":"a","task_id":"t","epoch":"17","state":"assigned"}`))
	require.EqualError(t, err, `protocol: assignment: field "epoch" must be a number`)
	_, err = Decode([]byte(`{"type":"hello","protocol":3}`))
	require.EqualError(t, err, `protocol: hello: field "token" is required`, "kinds are checked before values")
}

func TestDecodeUnknownFieldsTolerated(t *testing.T) {
	t.Parallel()
	for _, tc := range frameCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := withField(t, tc.json, "future_field", map[string]any{"nested": []int{1, 2}}, false)
			f, err := Decode(b)
			require.NoError(t, err)
			require.Equal(t, tc.want, f)
		})
	}
	f, err := Decode([]byte(`{"type":"state","contexts":[{"context_id":"a","owner":"worker","pinned":true}]}`))
	require.NoError(t, err)
	require.Equal(t, &State{Contexts: []ContextReport{{ContextID: "a", Owner: OwnerWorker}}}, f)
}

func TestDecodeUnknownType(t *testing.T) {
	t.Parallel()
	for _, typ := range []string{"subscribe", "Hello", "HELLO", " ping"} {
		f, err := Decode([]byte(`{"type":` + fmt.Sprintf("%q", typ) + `,"anything":[1,2,3]}`))
		require.Nil(t, f)
		u, ok := errors.AsType[*UnknownTypeError](err)
		require.True(t, ok, "%T: %v", err, err)
		require.Equal(t, typ, u.Type)
		_, malformed := errors.AsType[*MalformedError](err)
		require.False(t, malformed)
	}
	// The message does not grow with a hostile type.
	_, err := Decode([]byte(`{"type":"` + strings.Repeat("x", 10000) + `"}`))
	require.Less(t, len(err.Error()), 200)
}

func TestDecodeMissingType(t *testing.T) {
	t.Parallel()
	tests := []struct{ json, msg string }{
		{`{"command_id":"c"}`, "is required"},
		{`{"type":null}`, "is required"},
		{`{"type":7}`, "must be a string"},
		{`{"type":["hello"]}`, "must be a string"},
		{`{"type":""}`, "must not be empty"},
		{`{"Type":"ping"}`, "is required"},
	}
	for _, tc := range tests {
		_, err := Decode([]byte(tc.json))
		m := requireMalformed(t, err, "", "type")
		require.Equal(t, tc.msg, m.Msg, tc.json)
	}
}

func TestDecodeBadJSON(t *testing.T) {
	t.Parallel()
	for _, in := range []string{``, ` `, `{`, `{"type":"ping"`, `{"type":"ping"} x`, `{"type":'ping'}`, `nul`, "{\"type\":\"ping\",}"} {
		_, err := Decode([]byte(in))
		m := requireMalformed(t, err, "", "")
		require.Equal(t, "invalid JSON", m.Msg, in)
		_, isSyntax := errors.AsType[*json.SyntaxError](err)
		require.True(t, isSyntax, "the JSON error is wrapped: %v", err)
	}
	_, err := Decode([]byte("{\"type\":\"result\",\"command_id\":\"c\",\"data\":\"\xff\"}"))
	m := requireMalformed(t, err, "", "")
	require.Equal(t, "frame is not valid UTF-8", m.Msg)

	for _, in := range []string{`null`, `[{"type":"ping"}]`, `"ping"`, `1`, `true`} {
		_, err := Decode([]byte(in))
		m := requireMalformed(t, err, "", "")
		require.Equal(t, "frame must be a JSON object", m.Msg, in)
	}
}

// TestDecodeDoesNotAlias guards the promise that a frame does not refer to
// the input buffer, which WebSocket libraries reuse.
func TestDecodeDoesNotAlias(t *testing.T) {
	t.Parallel()
	in := []byte(`{"type":"result","command_id":"c","data":{"a":1}}`)
	f, err := Decode(in)
	require.NoError(t, err)
	for i := range in {
		in[i] = ' '
	}
	require.Equal(t, json.RawMessage(`{"a":1}`), f.(*Result).Data)
	require.Equal(t, "c", f.(*Result).CommandID)
}

func TestValidID(t *testing.T) {
	t.Parallel()
	valid := []string{"a", "Z", "0", "ext-7f3a", "usr_1111", "a.b:c-d_e", strings.Repeat("a", 128), "9-"}
	invalid := []string{"", "-a", "_a", ".a", ":a", "a b", "a/b", "tab#1", "é", "a\n",
		strings.Repeat("a", 129), "a\x00"}
	for _, s := range valid {
		require.True(t, ValidID(s), s)
		require.True(t, ValidUserID(s), s)
	}
	for _, s := range invalid {
		require.False(t, ValidID(s), s)
		require.False(t, ValidUserID(s), s)
	}
}
