package agent_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cheetahbroker/cheetah/agent"
	"github.com/cheetahbroker/cheetah/protocol"
)

// `cheetah agent hold` reaches a running agent through its control socket
// (mode 0600): the agent sends hold and unhold frames and answers with the
// broker's hold_state.
func TestControlSocketHold(t *testing.T) {
	t.Parallel()
	b := newFakeBroker(t, 1<<20)
	cfg := testConfig(b)
	a := agent.New(cfg)
	start(t, a)
	bc, _ := b.accept(t)
	connected(t, a)

	// A short path: unix socket paths are limited to about 100 bytes.
	dir, err := os.MkdirTemp("", "ch")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "sub", "agent.sock")
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- a.ServeControl(ctx, path) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-served)
		_, err := os.Stat(path)
		require.True(t, os.IsNotExist(err), "the socket is removed")
	})
	require.Eventually(t, func() bool { _, err := os.Stat(path); return err == nil }, guard, time.Millisecond)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	di, err := os.Stat(filepath.Dir(path))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), di.Mode().Perm())
	require.Error(t, a.ServeControl(context.Background(), path), "a second agent cannot take the socket")

	type answer struct {
		ans agent.ControlAnswer
		err error
	}
	call := func(req agent.ControlRequest) chan answer {
		ch := make(chan answer, 1)
		go func() {
			ans, err := agent.Control(context.Background(), path, req)
			ch <- answer{ans, err}
		}()
		return ch
	}
	got := call(agent.ControlRequest{Op: "hold", ContextID: "flow-1", TTLSeconds: 120})
	h := next[*protocol.Hold](t, bc)
	require.Equal(t, &protocol.Hold{ContextID: "flow-1", TTLSeconds: 120}, h)
	bc.send(t, &protocol.HoldStateFrame{ContextID: "flow-1", State: protocol.HoldPending})
	r := <-got
	require.NoError(t, r.err)
	require.Equal(t, agent.ControlAnswer{State: "pending"}, r.ans)
	// Later news of the hold nobody waits for is only logged.
	bc.send(t, &protocol.HoldStateFrame{ContextID: "flow-1", State: protocol.HoldActive})

	got = call(agent.ControlRequest{Op: "unhold", ContextID: "flow-1"})
	require.Equal(t, &protocol.Unhold{ContextID: "flow-1"}, next[*protocol.Unhold](t, bc))
	bc.send(t, &protocol.HoldStateFrame{ContextID: "flow-1", State: protocol.HoldEnded})
	r = <-got
	require.NoError(t, r.err)
	require.Equal(t, "ended", r.ans.State)

	r = <-call(agent.ControlRequest{Op: "steal", ContextID: "flow-1"})
	require.NoError(t, r.err)
	require.Contains(t, r.ans.Error, "op must be")
	r = <-call(agent.ControlRequest{Op: "hold", ContextID: "flow-1", TTLSeconds: 99999})
	require.NoError(t, r.err)
	require.NotEmpty(t, r.ans.Error, "a TTL the broker would refuse is refused here")
}
