package protocol

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEncodeRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range frameCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, err := Encode(tc.want)
			require.NoError(t, err)
			require.True(t, strings.HasPrefix(string(b), `{"type":"`+tc.name+`"`), string(b))
			f, err := Decode(b)
			require.NoError(t, err)
			require.Equal(t, tc.want, f)
		})
	}
}

func TestEncodeWritesType(t *testing.T) {
	t.Parallel()
	b, err := Encode(&Ping{})
	require.NoError(t, err)
	require.JSONEq(t, `{"type":"ping"}`, string(b))

	// encoding/json gets the type too, for values and pointers alike, so
	// a JSON helper of a WebSocket library writes a valid frame.
	for _, v := range []any{Pong{}, &Pong{}, []any{Ack{CommandID: "c"}}} {
		b, err := json.Marshal(v)
		require.NoError(t, err)
		require.Contains(t, string(b), `"type":"`)
	}
}

func TestEncodeOmitsEmptyOptionalFields(t *testing.T) {
	t.Parallel()
	b, err := Encode(&Command{CommandID: "c", ContextID: "x", TaskID: "t", Epoch: 1, Name: "echo",
		ResponseMode: ResponseAsync})
	require.NoError(t, err)
	require.Equal(t,
		`{"type":"command","command_id":"c","context_id":"x","task_id":"t","epoch":1,"name":"echo","response_mode":"async"}`,
		string(b))

	b, err = Encode(&State{})
	require.NoError(t, err)
	require.Equal(t, `{"type":"state","contexts":[]}`, string(b), "a nil list is still a full report")
}

// TestEncodeRawPassThrough checks that the caller's bytes reach the client
// exactly: spacing, key order and characters that encoding/json would
// escape all survive. (A member named twice is refused: TestDuplicateNames.)
func TestEncodeRawPassThrough(t *testing.T) {
	t.Parallel()
	options := `{ "z" : 1,"a":[ 2 ,3 ] ,	"html":"<b>&</b>", "y":2 }`
	params := "[1,\n  {\"y\":null}, \"\\u00e9\" ]"
	target := `{"tab_id" :"12"}`
	cmd := &Command{CommandID: "c", ContextID: "x", TaskID: "t", Epoch: 9, Name: "n",
		Params: json.RawMessage(params), Target: json.RawMessage(target),
		ResponseMode: ResponseRPC, Options: json.RawMessage(options)}

	b, err := Encode(cmd)
	require.NoError(t, err)
	require.Contains(t, string(b), `"options":`+options)
	require.Contains(t, string(b), `"params":`+params)
	require.Contains(t, string(b), `"target":`+target)

	f, err := Decode(b)
	require.NoError(t, err)
	got := f.(*Command)
	require.Equal(t, options, string(got.Options))
	require.Equal(t, params, string(got.Params))
	require.Equal(t, target, string(got.Target))

	// And in the other direction: what a client reports reaches history as
	// it was written.
	in := `{"type":"result","command_id":"c","data": {"b":1, "a" : "<&>"} }`
	f, err = Decode([]byte(in))
	require.NoError(t, err)
	require.Equal(t, `{"b":1, "a" : "<&>"}`, string(f.(*Result).Data))
	b, err = Encode(f)
	require.NoError(t, err)
	require.Equal(t, `{"type":"result","command_id":"c","data":{"b":1, "a" : "<&>"}}`, string(b))
}

func TestEncodeKeepsNull(t *testing.T) {
	t.Parallel()
	f, err := Decode([]byte(`{"type":"result","command_id":"c","data":null}`))
	require.NoError(t, err)
	require.Equal(t, json.RawMessage("null"), f.(*Result).Data)
	b, err := Encode(f)
	require.NoError(t, err)
	require.Equal(t, `{"type":"result","command_id":"c","data":null}`, string(b))
}

func TestEncodeRefusesInvalidFrames(t *testing.T) {
	t.Parallel()
	valid := func() *Command {
		return &Command{CommandID: "c", ContextID: "x", TaskID: "t", Epoch: 1, Name: "n",
			ResponseMode: ResponseRPC}
	}
	tests := []struct {
		name  string
		frame Frame
		field string
	}{
		{"empty hello", &Hello{}, "protocol"},
		{"hello without token", &Hello{Protocol: 1, ClientID: "c", ClientType: ClientConsole}, "token"},
		{"bad params", func() Frame { c := valid(); c.Params = json.RawMessage(`{`); return c }(), "params"},
		{"target not object", func() Frame { c := valid(); c.Target = json.RawMessage(` [1]`); return c }(), "target"},
		{"options not object", func() Frame { c := valid(); c.Options = json.RawMessage(`"x"`); return c }(), "options"},
		{"options not JSON", func() Frame { c := valid(); c.Options = json.RawMessage(`{}}`); return c }(), "options"},
		{"no response mode", func() Frame { c := valid(); c.ResponseMode = ""; return c }(), "response_mode"},
		{"bad data", &Result{CommandID: "c", Data: json.RawMessage(`nope`)}, "data"},
		{"data not UTF-8", &Progress{CommandID: "c", Data: json.RawMessage("\"\xff\"")}, "data"},
		{"bad capture", &Capture{CommandID: "c", MIME: "image/png", Data: "%%%"}, "data"},
		{"welcome without limit", &Welcome{Protocol: 1, SessionID: "s", UserID: "u", HeartbeatS: 20}, "max_message_bytes"},
		{"bad context", &State{Contexts: []ContextReport{{ContextID: "a", Owner: "robot"}}}, "contexts[0].owner"},
		{"error without code", &Error{CommandID: "c"}, "code"},
		{"assignment without state", &Assignment{ContextID: "a", TaskID: "t", Epoch: 1}, "state"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, err := Encode(tc.frame)
			require.Nil(t, b)
			requireMalformed(t, err, tc.frame.FrameType(), tc.field)
		})
	}

	_, err := Encode(nil)
	require.Error(t, err)
	_, err = Encode((*Ack)(nil))
	require.Error(t, err)
	_, err = json.Marshal(Ack{})
	require.Error(t, err, "encoding/json refuses what Encode refuses")
}

// A command marked checked is encoded without its JSON values read again
// (the broker checked them at admission), but its other fields still are.
func TestEncodeTrustsCheckedCommandJSON(t *testing.T) {
	t.Parallel()
	cmd := &Command{CommandID: "c", ContextID: "x", TaskID: "t", Epoch: 1, Name: "n", ResponseMode: ResponseRPC,
		Params: json.RawMessage(`{"a":1,"a":2}`)} // a duplicate name: refused unless checked
	_, err := Encode(cmd)
	requireMalformed(t, err, TypeCommand, "params")

	cmd.MarkJSONChecked()
	b, err := Encode(cmd)
	require.NoError(t, err)
	require.Contains(t, string(b), `"params":{"a":1,"a":2}`, "passed through as it is")
	probe := *cmd // a copy keeps the mark, as the broker's size check relies on
	n, err := EncodedLen(&probe)
	require.NoError(t, err)
	require.Equal(t, len(b), n)

	cmd.ContextID = "not an id!"
	_, err = Encode(cmd)
	requireMalformed(t, err, TypeCommand, "context_id")
	cmd.ContextID, cmd.Target = "x", json.RawMessage(`[1]`)
	_, err = Encode(cmd)
	requireMalformed(t, err, TypeCommand, "target") // still an object, or nothing
}

func TestEncodeEscapesStrings(t *testing.T) {
	t.Parallel()
	f := &Error{Code: "x", Message: "quote \" backslash \\ newline \n nul \x00 bad \xff"}
	b, err := Encode(f)
	require.NoError(t, err)
	require.True(t, json.Valid(b))
	got, err := Decode(b)
	require.NoError(t, err)
	require.Equal(t, "quote \" backslash \\ newline \n nul \ufffd bad \ufffd", got.(*Error).Message)
}
