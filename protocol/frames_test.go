package protocol

import (
	"encoding/json"
	"reflect"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// frameCase is one valid frame of each type, as JSON and as the struct it
// decodes to, with the fields that must be present and a value of the wrong
// kind for each field that has a kind to get wrong.
type frameCase struct {
	name     string
	json     string
	want     Frame
	required []string
	mistyped map[string]any
}

var frameCases = []frameCase{
	{
		name: "hello",
		json: `{"type":"hello","protocol":1,"token":"ck_secret","client_id":"ext-7f3a",
			"client_type":"browser","name":"Chromium on build-7","version":"0.3.0",
			"labels":{"region":"eu"},"capacity":{"max_contexts":8},
			"effects":{"navigate":"mutate","extract":"observe"}}`,
		want: &Hello{
			Protocol: 1, Token: "ck_secret", ClientID: "ext-7f3a", ClientType: ClientBrowser,
			Name: "Chromium on build-7", Version: "0.3.0",
			Labels: map[string]string{"region": "eu"}, Capacity: &Capacity{MaxContexts: 8},
			Effects: map[string]string{"navigate": EffectMutate, "extract": EffectObserve},
		},
		required: []string{"protocol", "token", "client_id", "client_type"},
		mistyped: map[string]any{
			"protocol": "1", "token": 1, "client_id": true, "client_type": []int{},
			"name": 1, "version": 1, "labels": "eu", "capacity": 8, "effects": []string{"navigate"},
		},
	},
	{
		name: "state",
		json: `{"type":"state","contexts":[{"context_id":"tab-12","tab_id":"12",
			"owner":"worker","url":"https://example.com/","title":"Example","labels":{}},
			{"context_id":"tab-13","owner":"human"}]}`,
		want: &State{Contexts: []ContextReport{
			{
				ContextID: "tab-12", TabID: "12", Owner: OwnerWorker, URL: "https://example.com/",
				Title: "Example", Labels: map[string]string{},
			},
			{ContextID: "tab-13", Owner: OwnerHuman},
		}},
		required: []string{"contexts"},
		mistyped: map[string]any{"contexts": map[string]any{}},
	},
	{
		name:     "ack",
		json:     `{"type":"ack","command_id":"0193a"}`,
		want:     &Ack{CommandID: "0193a"},
		required: []string{"command_id"},
		mistyped: map[string]any{"command_id": 1},
	},
	{
		name:     "progress",
		json:     `{"type":"progress","command_id":"0193a","data":{"loaded":0.5}}`,
		want:     &Progress{CommandID: "0193a", Data: json.RawMessage(`{"loaded":0.5}`)},
		required: []string{"command_id"},
		mistyped: map[string]any{"command_id": 1},
	},
	{
		name:     "event",
		json:     `{"type":"event","command_id":"0193a","name":"console","data":{"text":"hi"}}`,
		want:     &Event{CommandID: "0193a", Name: "console", Data: json.RawMessage(`{"text":"hi"}`)},
		required: []string{"command_id", "name"},
		mistyped: map[string]any{"command_id": 1, "name": 1},
	},
	{
		name:     "capture",
		json:     `{"type":"capture","command_id":"0193a","mime":"image/png","data":"iVBORw0KGgo="}`,
		want:     &Capture{CommandID: "0193a", MIME: "image/png", Data: "iVBORw0KGgo="},
		required: []string{"command_id", "mime", "data"},
		mistyped: map[string]any{"command_id": 1, "mime": 1, "data": 5},
	},
	{
		name:     "result",
		json:     `{"type":"result","command_id":"0193a","data":{"url":"https://example.com/catalog/42"}}`,
		want:     &Result{CommandID: "0193a", Data: json.RawMessage(`{"url":"https://example.com/catalog/42"}`)},
		required: []string{"command_id"},
		mistyped: map[string]any{"command_id": 1},
	},
	{
		name: "error",
		json: `{"type":"error","command_id":"0193a","code":"navigation_failed","message":"net::ERR","data":{}}`,
		want: &Error{
			CommandID: "0193a", Code: "navigation_failed", Message: "net::ERR",
			Data: json.RawMessage(`{}`),
		},
		required: []string{"code"},
		mistyped: map[string]any{"command_id": 1, "code": 1, "message": 1},
	},
	{
		name: "ping",
		json: `{"type":"ping"}`,
		want: &Ping{},
	},
	{
		name: "welcome",
		json: `{"type":"welcome","protocol":1,"session_id":"ses_1","user_id":"usr_1111",
			"heartbeat_s":20,"max_message_bytes":4194304}`,
		want: &Welcome{
			Protocol: 1, SessionID: "ses_1", UserID: "usr_1111", HeartbeatS: 20,
			MaxMessageBytes: 4194304,
		},
		required: []string{"session_id", "user_id", "heartbeat_s", "max_message_bytes"},
		mistyped: map[string]any{
			"protocol": "1", "session_id": 1, "user_id": 1, "heartbeat_s": "20",
			"max_message_bytes": true,
		},
	},
	{
		name: "command",
		json: `{"type":"command","command_id":"0193a","context_id":"tab-12","task_id":"t-42",
			"epoch":17,"name":"navigate","params":{"url":"https://example.com/catalog/42"},
			"target":{"tab_id":"12"},"response_mode":"rpc","timeout_ms":20000,
			"options":{},"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`,
		want: &Command{
			CommandID: "0193a", ContextID: "tab-12", TaskID: "t-42", Epoch: 17, Name: "navigate",
			Params:       json.RawMessage(`{"url":"https://example.com/catalog/42"}`),
			Target:       json.RawMessage(`{"tab_id":"12"}`),
			ResponseMode: ResponseRPC, TimeoutMS: 20000, Options: json.RawMessage(`{}`),
			Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		},
		required: []string{"command_id", "context_id", "task_id", "epoch", "name", "response_mode"},
		mistyped: map[string]any{
			"command_id": 1, "context_id": 1, "task_id": 1, "epoch": "17", "name": 1,
			"target": "12", "response_mode": 1, "timeout_ms": "20000", "options": []int{},
			"traceparent": 1,
		},
	},
	{
		name:     "cancel",
		json:     `{"type":"cancel","command_id":"0193a","reason":"caller cancelled"}`,
		want:     &Cancel{CommandID: "0193a", Reason: "caller cancelled"},
		required: []string{"command_id"},
		mistyped: map[string]any{"command_id": 1, "reason": 1},
	},
	{
		name:     "assignment",
		json:     `{"type":"assignment","context_id":"tab-12","task_id":"t-42","epoch":17,"state":"assigned"}`,
		want:     &Assignment{ContextID: "tab-12", TaskID: "t-42", Epoch: 17, State: AssignmentAssigned},
		required: []string{"context_id", "task_id", "epoch", "state"},
		mistyped: map[string]any{"context_id": 1, "task_id": 1, "epoch": "17", "state": 1},
	},
	{
		name: "pong",
		json: `{"type":"pong"}`,
		want: &Pong{},
	},
	{
		name:     "create_context",
		json:     `{"type":"create_context","request_id":"cr_0193a","url":"https://example.com/"}`,
		want:     &CreateContext{RequestID: "cr_0193a", URL: "https://example.com/"},
		required: []string{"request_id"},
		mistyped: map[string]any{"request_id": 1, "url": 1},
	},
	{
		name:     "create_failed",
		json:     `{"type":"create_failed","request_id":"cr_0193a","code":"tab_limit","message":"no room"}`,
		want:     &CreateFailed{RequestID: "cr_0193a", Code: "tab_limit", Message: "no room"},
		required: []string{"request_id", "code"},
		mistyped: map[string]any{"request_id": 1, "code": 1, "message": 1},
	},
	{
		name:     "hold",
		json:     `{"type":"hold","context_id":"tab-12","ttl_s":300}`,
		want:     &Hold{ContextID: "tab-12", TTLSeconds: 300},
		required: []string{"context_id"},
		mistyped: map[string]any{"context_id": 1, "ttl_s": "300"},
	},
	{
		name:     "unhold",
		json:     `{"type":"unhold","context_id":"tab-12"}`,
		want:     &Unhold{ContextID: "tab-12"},
		required: []string{"context_id"},
		mistyped: map[string]any{"context_id": 1},
	},
	{
		name:     "hold_state",
		json:     `{"type":"hold_state","context_id":"tab-12","state":"pending"}`,
		want:     &HoldStateFrame{ContextID: "tab-12", State: HoldPending},
		required: []string{"context_id", "state"},
		mistyped: map[string]any{"context_id": 1, "state": 1},
	},
}

// A context opened for a create_context carries its request_id.
func TestStateRequestID(t *testing.T) {
	t.Parallel()
	want := &State{Contexts: []ContextReport{{ContextID: "tab-13", Owner: OwnerWorker, RequestID: "cr_0193a"}}}
	f, err := Decode([]byte(`{"type":"state","contexts":[{"context_id":"tab-13","owner":"worker","request_id":"cr_0193a"}]}`))
	require.NoError(t, err)
	require.Equal(t, want, f)
	b, err := Encode(want)
	require.NoError(t, err)
	require.Contains(t, string(b), `"request_id":"cr_0193a"`)
	_, err = Decode([]byte(`{"type":"state","contexts":[{"context_id":"tab-13","owner":"worker","request_id":"no spaces"}]}`))
	require.Error(t, err)
}

// withField returns the case's JSON with one member replaced (or removed,
// when remove is set).
func withField(t *testing.T, frame, field string, v any, remove bool) []byte {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(frame), &m))
	if remove {
		delete(m, field)
	} else {
		m[field] = v
	}
	b, err := json.Marshal(m)
	require.NoError(t, err)
	return b
}

// caseJSON returns the JSON of the frame case with the given name.
func caseJSON(t *testing.T, name string) string {
	t.Helper()
	for _, tc := range frameCases {
		if tc.name == name {
			return tc.json
		}
	}
	t.Fatalf("no frame case %q", name)
	return ""
}

func TestFrameTypes(t *testing.T) {
	t.Parallel()
	fromClient := []Type{TypeHello, TypeState, TypeAck, TypeProgress, TypeEvent, TypeCapture,
		TypeResult, TypeError, TypePing, TypeCreateFailed, TypeHold, TypeUnhold}
	fromBroker := []Type{TypeWelcome, TypeCommand, TypeCancel, TypeAssignment, TypePong, TypeError, TypeCreateContext, TypeHoldState}
	for _, tc := range frameCases {
		typ := tc.want.FrameType()
		require.Equal(t, Type(tc.name), typ)
		require.Equal(t, slices.Contains(fromClient, typ), typ.FromClient(), tc.name)
		require.Equal(t, slices.Contains(fromBroker, typ), typ.FromBroker(), tc.name)
	}
	require.False(t, Type("bogus").FromClient())
	require.False(t, Type("bogus").FromBroker())
}

func TestEnumsValid(t *testing.T) {
	t.Parallel()
	require.True(t, ClientBrowser.Valid())
	require.True(t, ClientConsole.Valid())
	require.False(t, ClientType("Browser").Valid())
	require.True(t, OwnerWorker.Valid())
	require.True(t, OwnerHuman.Valid())
	require.False(t, Owner("").Valid())
	for _, m := range []ResponseMode{ResponseRPC, ResponseAsync, ResponseNone} {
		require.True(t, m.Valid())
	}
	require.False(t, ResponseMode("sync").Valid())
	for _, s := range []AssignmentState{AssignmentAssigned, AssignmentReleased, AssignmentExpired,
		AssignmentRevoked, AssignmentContextGone} {
		require.True(t, s.Valid())
	}
	require.False(t, AssignmentState("gone").Valid())
}

func TestCaptureBytes(t *testing.T) {
	t.Parallel()
	png := []byte{0x89, 'P', 'N', 'G', 0, 0xff}
	c := NewCapture("0193a", "image/png", png)
	b, err := Encode(c)
	require.NoError(t, err)
	f, err := Decode(b)
	require.NoError(t, err)
	got, err := f.(*Capture).Bytes()
	require.NoError(t, err)
	require.Equal(t, png, got)
}

// TestStructTagsMatchEncoding keeps the json tags, which document the wire
// names and serve anyone who uses encoding/json, honest about what Encode
// actually writes.
func TestStructTagsMatchEncoding(t *testing.T) {
	t.Parallel()
	for _, tc := range frameCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, err := Encode(tc.want)
			require.NoError(t, err)
			got := reflect.New(reflect.TypeOf(tc.want).Elem()).Interface()
			require.NoError(t, json.Unmarshal(b, got))
			require.Equal(t, tc.want, got)
		})
	}
}

// A hold's ttl_s is 0 (the default) to MaxHoldTTL seconds; hold_state is
// pending, active or ended.
func TestHoldBounds(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{`{"type":"hold","context_id":"c"}`, `{"type":"hold","context_id":"c","ttl_s":3600}`} {
		_, err := Decode([]byte(ok))
		require.NoError(t, err, ok)
	}
	for _, bad := range []string{
		`{"type":"hold","context_id":"c","ttl_s":3601}`,
		`{"type":"hold","context_id":"c","ttl_s":-1}`,
		`{"type":"hold","context_id":""}`,
		`{"type":"hold_state","context_id":"c","state":"held"}`,
	} {
		_, err := Decode([]byte(bad))
		require.Error(t, err, bad)
	}
	_, err := Encode(&Hold{ContextID: "c", TTLSeconds: MaxHoldTTL + 1})
	require.Error(t, err, "encode checks as decode does")
}

// clear_state rides on an assignment only when set, and reads back alike on
// the fast and the general decoder; anything but a boolean is refused.
func TestAssignmentClearState(t *testing.T) {
	t.Parallel()
	a := &Assignment{ContextID: "tab-12", TaskID: "t-42", Epoch: 18, State: AssignmentReleased, ClearState: true}
	b, err := Encode(a)
	require.NoError(t, err)
	require.JSONEq(t, `{"type":"assignment","context_id":"tab-12","task_id":"t-42","epoch":18,"state":"released","clear_state":true}`, string(b))
	got, err := Decode(b)
	require.NoError(t, err)
	require.Equal(t, a, got)
	fast, ok := decodeFast(b)
	require.True(t, ok)
	require.Equal(t, a, fast)

	a.ClearState = false
	b, err = Encode(a)
	require.NoError(t, err)
	require.NotContains(t, string(b), "clear_state")

	_, err = Decode([]byte(`{"type":"assignment","context_id":"c","task_id":"t","epoch":1,"state":"assigned","clear_state":"yes"}`))
	require.ErrorContains(t, err, "clear_state")
}
