package protocol

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// fastCases are frames of the fast pass's types, good and bad in the ways
// the general decoder words exactly.
var fastCases = []string{
	`{"type":"ack","command_id":"c"}`,
	` { "type" : "ack" , "command_id" : "c" } `,
	`{"command_id":"c","type":"ack"}`,
	`{"type":"ack","command_id":"c","command_id":"d"}`,
	`{"type":"ack","command_id":"c","comm\u0061nd_id":"d"}`,
	`{"type":"ack","comm\u0061nd_id":"c"}`,
	`{"type":"\u0061ck","command_id":"c"}`,
	`{"type":"ack","command_id":"c\u0000"}`,
	`{"type":"ack","command_id":"c\n\u00e9\"\\"}`,
	`{"type":"ack","command_id":null}`,
	`{"type":"ack","command_id":7}`,
	`{"type":"ack","command_id":""}`,
	`{"type":"ack","command_id":"c"} x`,
	`{"type":"ack","command_id":"c"`,
	`{"type":"ack","command_id":"c","x":{"a":1,"a":2}}`,
	`{"type":"ack","command_id":"c","x":"\ud800"}`,
	`{"type":"result","command_id":"c","data":null}`,
	`{"type":"result","command_id":"c","data": {"a" : [1, 2.5, "<&>"]} }`,
	`{"type":"result","command_id":"c","data":` + strings.Repeat("[", 64) + strings.Repeat("]", 64) + `}`,
	`{"type":"result","command_id":"c","data":` + strings.Repeat("[", 65) + strings.Repeat("]", 65) + `}`,
	`{"type":"result","command_id":"c","x":` + strings.Repeat("{\"a\":", 65) + "1" + strings.Repeat("}", 65) + `}`,
	`{"type":"result","command_id":"c","data":"[[[[\"]]]"}`,
	`{"type":"progress","command_id":"c","data":1}`,
	`{"type":"event","command_id":"c","name":"log","data":"x"}`,
	`{"type":"event","command_id":"c"}`,
	`{"type":"error","code":"boom","message":"m","data":{}}`,
	`{"type":"error","command_id":"c","code":"","message":"m"}`,
	`{"type":"ping"}`, `{"type":"pong","x":[1]}`,
	`{"type":"cancel","command_id":"c","reason":"r"}`,
	`{"type":"assignment","context_id":"w1","task_id":"t","epoch":17,"state":"assigned"}`,
	`{"type":"assignment","context_id":"w1","task_id":"t","epoch":"17","state":"assigned"}`,
	`{"type":"assignment","context_id":"w1","task_id":"t","epoch":1.0,"state":"assigned"}`,
	`{"type":"assignment","context_id":"w1","task_id":"t","epoch":-0,"state":"assigned"}`,
	`{"type":"assignment","context_id":"w1","task_id":"t","epoch":9223372036854775808,"state":"assigned"}`,
	`{"type":"command","command_id":"c","context_id":"x","task_id":"t","epoch":1,"name":"n","response_mode":"none","options":{ "b" : [1, 2] ,"a":"<&>"},"target":null,"params":"\u00e9","timeout_ms":5,"traceparent":"tp"}`,
	`{"type":"command","command_id":"c","context_id":"x","task_id":"t","epoch":1,"name":"n","response_mode":"rpc","target":[1]}`,
	`{"type":"command","command_id":"c","context_id":"x y","task_id":"t","epoch":1,"name":"n","response_mode":"rpc"}`,
	`{"type":"hello"}`, `{"type":"future"}`, `[]`, `null`, `{}`, `{"type":7}`,
}

// TestDecodeFastMatchesSlow holds the fast pass to the general decoder:
// whatever it decodes, the general decoder decodes to the same frame, or
// refuses with the same error.
func TestDecodeFastMatchesSlow(t *testing.T) {
	t.Parallel()
	for _, in := range fastCases {
		checkFastMatchesSlow(t, []byte(in))
	}
	for _, in := range []string{`{"type":"ack","command_id":"c"}`, `{"type":"result","command_id":"c","data":{"a":1}}`} {
		_, ok := decodeFast([]byte(in))
		require.True(t, ok, "the fast pass takes %s", in)
	}
}

func checkFastMatchesSlow(t *testing.T, b []byte) {
	t.Helper()
	if !utf8.Valid(b) {
		return
	}
	fast, ok := decodeFast(b)
	if !ok {
		return
	}
	slow, err := decodeSlow(b)
	if verr := fast.validate(true); verr != nil {
		require.Equal(t, err, verr, "the same values refused alike: %s", b)
		return
	}
	require.NoError(t, err, "the fast pass took what the general decoder refuses: %s", b)
	require.Equal(t, slow, fast, "%s", b)
}

func FuzzDecodeFastMatchesSlow(f *testing.F) {
	for _, in := range fastCases {
		f.Add([]byte(in))
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkFastMatchesSlow(t, b) })
}

var valueCases = []string{
	``, ` `, `1`, ` 1 `, `1 2`, `{}`, `{} {}`, `[1,`, `"\ud800"`, `"\ud83d\ude42"`, "\"\xff\"", `{"a":1,"a":2}`,
	`{"a":{"b":1,"b":2}}`, `{"a":1,"\u0061":2}`, `nul`, `null`, `"a\u0000b"`, `[1,2,3]`, `{"a":[{"b":"<&>"}]}`,
	strings.Repeat("[", 64) + strings.Repeat("]", 64), strings.Repeat("[", 65) + strings.Repeat("]", 65),
	`["]]]]"]`, `"\\"`,
}

// TestValidValueMatchesChecks holds the one-pass check of opaque data to
// the checks it stands in front of: encoding/json's validity, UTF-8 and
// CheckJSON.
func TestValidValueMatchesChecks(t *testing.T) {
	t.Parallel()
	for _, in := range valueCases {
		checkValidValue(t, []byte(in))
	}
}

func checkValidValue(t *testing.T, v []byte) {
	t.Helper()
	want := json.Valid(v) && utf8.Valid(v) && CheckJSON(v, MaxJSONDepth) == nil
	require.Equal(t, want, validValue(v, MaxJSONDepth), "%q", v)
}

func FuzzValidValue(f *testing.F) {
	for _, in := range valueCases {
		f.Add([]byte(in))
	}
	f.Fuzz(func(t *testing.T, v []byte) { checkValidValue(t, v) })
}
