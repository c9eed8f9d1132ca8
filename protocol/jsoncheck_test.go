package protocol

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func nest(depth int, inner string) string {
	return strings.Repeat(`{"a":`, depth) + inner + strings.Repeat(`}`, depth)
}

// TestDecodeRefusesWhatTheStoreCannotHold: a frame with a NUL in a string
// the broker stores, a member named twice, or data nested deeper than
// MaxJSONDepth is malformed (4400), never accepted and failed later.
func TestDecodeRefusesWhatTheStoreCannotHold(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, frame, field string }{
		{"nul in event name", `{"type":"event","command_id":"c","name":"a\u0000b"}`, "name"},
		{"nul in error code", `{"type":"error","command_id":"c","code":"x\u0000"}`, "code"},
		{"nul in error message", `{"type":"error","command_id":"c","code":"x","message":"m\u0000"}`, "message"},
		{"nul in command id", `{"type":"ack","command_id":"c\u0000"}`, "command_id"},
		{"nul in capture mime", `{"type":"capture","command_id":"c","mime":"image/png\u0000","data":""}`, "mime"},
		{"nul in hello name", `{"type":"hello","protocol":1,"token":"k","client_id":"c","client_type":"console","name":"\u0000"}`, "name"},
		{"nul in label key", `{"type":"hello","protocol":1,"token":"k","client_id":"c","client_type":"console","labels":{"a\u0000":"b"}}`, "labels"},
		{"nul in label value", `{"type":"hello","protocol":1,"token":"k","client_id":"c","client_type":"console","labels":{"a":"\u0000"}}`, "labels"},
		{"nul in state url", `{"type":"state","contexts":[{"context_id":"x","owner":"worker","url":"http://a/\u0000"}]}`, "contexts[0].url"},
		{"duplicate top-level member", `{"type":"ack","command_id":"a","command_id":"b"}`, ""},
		{"duplicate member in data", `{"type":"result","command_id":"c","data":{"x":1,"x":2}}`, "data"},
		{"duplicate type", `{"type":"ping","type":"ack","command_id":"c"}`, ""},
		{"lone surrogate", `{"type":"result","command_id":"c","data":"\ud800"}`, "data"},
		{"data too deep", `{"type":"result","command_id":"c","data":` + nest(MaxJSONDepth+1, "1") + `}`, "data"},
		{"array data too deep", `{"type":"progress","command_id":"c","data":` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `}`, "data"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Decode([]byte(tc.frame))
			m, ok := err.(*MalformedError)
			require.True(t, ok, "want a malformed frame, got %v", err)
			require.Equal(t, tc.field, m.Field, m.Error())
		})
	}
}

// TestDecodeAcceptsAtTheLimits: data exactly MaxJSONDepth deep, and a
// \u0000 escape inside opaque data (stored as JSON text, escape and all).
func TestDecodeAcceptsAtTheLimits(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`{"type":"result","command_id":"c","data":` + nest(MaxJSONDepth, "1") + `}`,
		`{"type":"result","command_id":"c","data":` + strings.Repeat("[", MaxJSONDepth) + strings.Repeat("]", MaxJSONDepth) + `}`,
		`{"type":"result","command_id":"c","data":{"s":"a\u0000b"}}`,
		`{"type":"event","command_id":"c","name":"n","data":{"a":{"a":1},"b":{"a":1}}}`,
	} {
		_, err := Decode([]byte(in))
		require.NoError(t, err, in)
	}
}

func TestEncodeRefusesDeepOrDuplicatedData(t *testing.T) {
	t.Parallel()
	_, err := Encode(&Result{CommandID: "c", Data: []byte(nest(MaxJSONDepth+1, "1"))})
	requireMalformed(t, err, TypeResult, "data")
	_, err = Encode(&Command{CommandID: "c", ContextID: "x", TaskID: "t", Name: "n", ResponseMode: ResponseRPC,
		Params: []byte(`{"a":1,"a":2}`)})
	requireMalformed(t, err, TypeCommand, "params")
	_, err = Encode(&Command{CommandID: "c", ContextID: "x", TaskID: "t\x00", Name: "n", ResponseMode: ResponseRPC})
	requireMalformed(t, err, TypeCommand, "task_id")
}
