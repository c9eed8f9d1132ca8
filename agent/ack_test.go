package agent_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cheetahbroker/cheetah/agent"
	"github.com/cheetahbroker/cheetah/protocol"
)

// startWithAckWithin is startConnected with the agent's ack bound set to d.
func startWithAckWithin(t *testing.T, d time.Duration, handlers map[string]agent.Handler) *brokerConn {
	t.Helper()
	b := newFakeBroker(t, 1<<20)
	a := agent.New(testConfig(b))
	agent.SetAckWithin(a, d)
	for name, h := range handlers {
		a.Handle(name, h)
	}
	start(t, a)
	bc, _ := b.accept(t)
	connected(t, a)
	return bc
}

// A command's ack goes out with its first message, in order before it,
// when that comes within the bound: nothing is sent while the handler
// runs, then the ack and the progress, then the result.
func TestAckGoesWithTheFirstMessage(t *testing.T) {
	t.Parallel()
	progress, finish := make(chan struct{}), make(chan struct{})
	bc := startWithAckWithin(t, time.Hour, map[string]agent.Handler{
		"step": func(_ context.Context, _ *protocol.Command, out agent.Output) (any, error) {
			<-progress
			if err := out.Progress(map[string]int{"done": 1}); err != nil {
				return nil, err
			}
			<-finish
			return "ok", nil
		},
		"quick": func(context.Context, *protocol.Command, agent.Output) (any, error) { return nil, nil },
	})
	bc.send(t, command("c1", "flow-1", "step", `{}`))
	select {
	case fe := <-bc.frames:
		t.Fatalf("the agent sent %T before the command's first message", fe.f)
	case <-time.After(50 * time.Millisecond):
	}
	close(progress)
	require.Equal(t, "c1", next[*protocol.Ack](t, bc).CommandID)
	require.Equal(t, "c1", next[*protocol.Progress](t, bc).CommandID)
	close(finish)
	require.Equal(t, "c1", next[*protocol.Result](t, bc).CommandID)

	// A command that ends at once: the ack, then its result.
	bc.send(t, command("c2", "flow-1", "step", `{}`))
	require.Equal(t, "c2", next[*protocol.Ack](t, bc).CommandID)
	require.Equal(t, "c2", next[*protocol.Progress](t, bc).CommandID)
	require.Equal(t, "c2", next[*protocol.Result](t, bc).CommandID)

	// Response mode none: no message but the ack, sent when it ends.
	quiet := command("c3", "flow-1", "quick", `{}`)
	quiet.ResponseMode = protocol.ResponseNone
	bc.send(t, quiet)
	require.Equal(t, "c3", next[*protocol.Ack](t, bc).CommandID)
	// An unknown command is answered with its ack and an error.
	bc.send(t, command("c4", "flow-1", "nope", `{}`))
	require.Equal(t, "c4", next[*protocol.Ack](t, bc).CommandID)
	require.Equal(t, "c4", next[*protocol.Error](t, bc).CommandID)
}

// A command still running once the bound has passed is acknowledged on its
// own, while it runs; so is a command of response mode none when it ends.
func TestAckOfALongCommandGoesAlone(t *testing.T) {
	t.Parallel()
	finish := make(chan struct{})
	bc := startWithAckWithin(t, time.Millisecond, map[string]agent.Handler{
		"long": func(context.Context, *protocol.Command, agent.Output) (any, error) {
			<-finish
			return nil, nil
		},
	})
	bc.send(t, command("c1", "flow-1", "long", `{}`))
	require.Equal(t, "c1", next[*protocol.Ack](t, bc).CommandID, "acknowledged while it runs")
	close(finish)
	require.Equal(t, "c1", next[*protocol.Result](t, bc).CommandID)

	quiet := command("c2", "flow-1", "long", `{}`)
	quiet.ResponseMode = protocol.ResponseNone
	bc.send(t, quiet)
	require.Equal(t, "c2", next[*protocol.Ack](t, bc).CommandID)
}
