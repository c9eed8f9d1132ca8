package protocol_test

import (
	"encoding/json"
	"testing"

	"github.com/cheetahbroker/cheetah/protocol"
)

// hotFrames are the frames of every command's round trip: the command out,
// the ack and the result back, the assignment around them.
func hotFrames() []protocol.Frame {
	params := json.RawMessage(`{"url":"https://example.com/a?b=c&d=e","selector":"#main > .item","pad":"` +
		`xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`)
	return []protocol.Frame{
		&protocol.Command{CommandID: "0193a4c2-7b1e-7c3d-9f00-1234567890ab", ContextID: "w1", TaskID: "task-1", Epoch: 17,
			Name: "navigate", Params: params, ResponseMode: protocol.ResponseRPC, TimeoutMS: 30000,
			Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		&protocol.Ack{CommandID: "0193a4c2-7b1e-7c3d-9f00-1234567890ab"},
		&protocol.Result{CommandID: "0193a4c2-7b1e-7c3d-9f00-1234567890ab", Data: params},
		&protocol.Assignment{ContextID: "w1", TaskID: "task-1", Epoch: 17, State: protocol.AssignmentAssigned},
	}
}

func BenchmarkEncode(b *testing.B) {
	frames := hotFrames()
	b.ReportAllocs()
	for b.Loop() {
		for _, f := range frames {
			if _, err := protocol.Encode(f); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	var texts [][]byte
	for _, f := range hotFrames() {
		t, err := protocol.Encode(f)
		if err != nil {
			b.Fatal(err)
		}
		texts = append(texts, t)
	}
	b.ReportAllocs()
	for b.Loop() {
		for _, t := range texts {
			if _, err := protocol.Decode(t); err != nil {
				b.Fatal(err)
			}
		}
	}
}
