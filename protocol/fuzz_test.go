package protocol

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzDecode checks that Decode never panics, that it fails only with the
// two error types the broker knows how to answer, and that every frame it
// accepts survives Encode and Decode unchanged: whatever one side accepts,
// it can also send. More seeds live in testdata/fuzz/FuzzDecode.
func FuzzDecode(f *testing.F) {
	for _, tc := range frameCases {
		f.Add([]byte(tc.json))
	}
	for _, s := range []string{
		``,
		`null`,
		`{}`,
		`{"type":"future"}`,
		`{"type":7}`,
		`{"type":"ping"`,
		`{"type":"command","command_id":"c","context_id":"x","task_id":"t","epoch":"17","name":"n","response_mode":"rpc"}`,
		`{"type":"command","command_id":"c","context_id":"x","task_id":"t","epoch":1,"name":"n","response_mode":"none","options":{ "b" : [1, 2] ,"a":"<&>"},"target":null,"params":"\u00e9"}`,
		`{"type":"state","contexts":[{"context_id":"a","owner":"worker","labels":{"k":"v"}},{"context_id":"a","owner":"human"}]}`,
		`{"type":"state","contexts":[]}`,
		`{"type":"hello","protocol":1,"token":"k","client_id":"c","client_type":"console","labels":{},"capacity":{}}`,
		`{"type":"hello","protocol":2,"token":"k","client_id":"c","client_type":"console"}`,
		`{"type":"capture","command_id":"c","mime":"image/png","data":"AAEC\nAw=="}`,
		`{"type":"error","code":"unknown_type","data":null,"Code":5}`,
		`{"type":"assignment","context_id":"a","task_id":"t","epoch":-0,"state":"context_gone"}`,
		`{"type":"welcome","session_id":"s","user_id":"u","heartbeat_s":1,"max_message_bytes":9223372036854775807}`,
		`{"type":"event","command_id":"c","name":"a\u0000b","data":{"s":"\u0000"}}`,
		`{"type":"result","command_id":"c","data":{"a":1,"a":2}}`,
		`{"type":"ack","command_id":"c","command_id":"d"}`,
		`{"type":"result","command_id":"c","data":"\ud800"}`,
		`{"type":"progress","command_id":"c","data":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}`,
		`{"type":"hello","protocol":1,"token":"k","client_id":"c","client_type":"console","labels":{"a":"\u0000"}}`,
		`{"type":"error","command_id":"c","code":"x","message":"m\u0000"}`,
	} {
		f.Add([]byte(s))
	}

	f.Fuzz(func(t *testing.T, b []byte) {
		frame, err := Decode(b)
		if err != nil {
			require.Nil(t, frame)
			_, malformed := errors.AsType[*MalformedError](err)
			_, unknown := errors.AsType[*UnknownTypeError](err)
			require.True(t, malformed || unknown, "unexpected error type %T: %v", err, err)
			return
		}
		enc, err := Encode(frame)
		require.NoError(t, err, "Encode refused a frame Decode accepted")
		again, err := Decode(enc)
		require.NoError(t, err, "Decode refused what Encode wrote: %s", enc)
		require.Equal(t, frame, again)
		enc2, err := Encode(again)
		require.NoError(t, err)
		require.Equal(t, string(enc), string(enc2), "encoding is not stable")
	})
}
