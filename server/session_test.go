package server_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/server"
)

// serverGoroutines counts the goroutines of this process that run the
// broker's client sessions: readers (session.run), writers, pings and the
// shared heartbeat loop.
func serverGoroutines() (readers, writers, pings, loops int) {
	var b bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	for g := range strings.SplitSeq(b.String(), "\n\n") {
		switch {
		case strings.Contains(g, "server.(*session).run"):
			readers++
		case strings.Contains(g, "server.(*session).writeLoop"):
			writers++
		case strings.Contains(g, "server.(*session).beat"):
			pings++
		case strings.Contains(g, "server.(*Server).heartbeatLoop"):
			loops++
		}
	}
	return
}

// TestIdleSessionsRunOnlyTheirReader proves that an idle session costs one
// goroutine, its reader: no writer waits on an empty queue, and heartbeats
// come from one loop for the whole server. (Not parallel: it counts the
// goroutines of the whole process.)
func TestIdleSessionsRunOnlyTheirReader(t *testing.T) {
	b := setup(t)
	r0, w0, p0, l0 := serverGoroutines()
	const n = 200
	clients := make([]*wsClient, n)
	for i := range clients {
		clients[i] = b.connectAgent(fmt.Sprint("idle-", i), "w1")
	}
	require.Eventually(t, func() bool {
		r, w, p, l := serverGoroutines()
		return r-r0 == n && w-w0 == 0 && p-p0 == 0 && l-l0 == 1
	}, 10*time.Second, 10*time.Millisecond, "one goroutine per idle session, and one heartbeat loop")

	// They are alive all the same: each answers.
	for _, c := range clients[:5] {
		c.send(&protocol.Ping{})
		next[*protocol.Pong](c)
	}
	// Once they are gone, the heartbeat loop is gone too.
	for _, c := range clients {
		c.conn.CloseNow()
	}
	require.Eventually(t, func() bool {
		r, w, p, l := serverGoroutines()
		return r == r0 && w == w0 && p == p0 && l == l0
	}, 10*time.Second, 10*time.Millisecond)
}

// TestSlowReaderIsNotDropped proves that the outbound bound is one of a
// client that does not read, not of one that reads slowly: far more frames
// than the old 256 slots wait for a client that reads late, and all of them
// arrive, in order.
func TestSlowReaderIsNotDropped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	slow := dialSmallWindow(b) // reads nothing yet
	slow.send(&protocol.Hello{Protocol: 1, Token: b.client, ClientID: "slow", ClientType: protocol.ClientConsole})
	slow.send(&protocol.State{Contexts: []protocol.ContextReport{{ContextID: "w1", Owner: protocol.OwnerWorker}}})
	var l cheetah.Lease
	require.Eventually(t, func() bool {
		var err error
		l, err = b.reg.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "t", ClientType: cheetah.Console})
		return err == nil
	}, 10*time.Second, 5*time.Millisecond)
	const n = 1000
	params := map[string]string{"pad": strings.Repeat("x", 8<<10)}
	ids := make([]string, n)
	for i := range ids {
		sent, err := b.reg.Send(ctx, l, cheetah.Command{Name: "x", Params: params}, cheetah.SendOptions{})
		require.NoError(t, err, "command %d", i)
		ids[i] = sent.CommandID
	}
	// Now it reads, slowly.
	slow.read()
	var got []string
	for len(got) < n {
		got = append(got, next[*protocol.Command](slow).CommandID)
		if len(got)%100 == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	require.Equal(t, ids, got)
	_, err := b.reg.Send(ctx, l, cheetah.Command{Name: "x"}, cheetah.SendOptions{})
	require.NoError(t, err, "the slow client is still connected")
}

// dialSmallWindow dials like b.dial, with a small TCP receive buffer, so
// that what the client does not read waits in the broker's queue rather
// than in the kernel's.
func dialSmallWindow(b *broker) *wsClient {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			_ = c.(*net.TCPConn).SetReadBuffer(64 << 10)
		}
		return c, err
	}}
	b.t.Cleanup(tr.CloseIdleConnections)
	conn, _, err := websocket.Dial(ctx, strings.Replace(b.http.URL, "http", "ws", 1)+"/ws/v1/client",
		&websocket.DialOptions{HTTPClient: &http.Client{Transport: tr}})
	require.NoError(b.t, err)
	conn.SetReadLimit(-1)
	c := &wsClient{t: b.t, conn: conn, frames: make(chan protocol.Frame, 1024), closed: make(chan error, 1)}
	b.t.Cleanup(func() { conn.CloseNow() })
	return c
}

// TestOutboundBytesBound proves the bound by bytes: a client that does not
// read is cut off once its queue holds more than OutboundBytes, even with
// few frames queued.
func TestOutboundBytesBound(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *server.Config) { c.OutboundBytes = 1 << 20 })
	ctx := context.Background()
	stuck := b.dial()
	stuck.send(&protocol.Hello{Protocol: 1, Token: b.client, ClientID: "stuck", ClientType: protocol.ClientConsole})
	stuck.send(&protocol.State{Contexts: []protocol.ContextReport{{ContextID: "w1", Owner: protocol.OwnerWorker}}})
	var l cheetah.Lease
	require.Eventually(t, func() bool {
		var err error
		l, err = b.reg.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "t", ClientType: cheetah.Console})
		return err == nil
	}, 10*time.Second, 5*time.Millisecond)
	params := map[string]string{"pad": strings.Repeat("x", 60<<10)}
	var lastErr error
	for range 1000 {
		if _, lastErr = b.reg.Send(ctx, l, cheetah.Command{Name: "x", Params: params}, cheetah.SendOptions{}); lastErr != nil {
			break
		}
	}
	var lost *cheetah.LeaseLostError
	require.ErrorAs(t, lastErr, &lost, "the stuck client was cut off")
	require.Equal(t, cheetah.LostNotLive, lost.Reason)
}

// TestHeartbeatKeepsTalkingClient drives the shared heartbeat loop with the
// fake clock: a client that speaks within every three intervals stays, one
// that falls silent is closed with 4408, while another session on the same
// loop is unaffected.
func TestHeartbeatKeepsTalkingClient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	talker := b.connectAgent("talker", "w1")
	silent := b.dial()
	silent.send(&protocol.Hello{Protocol: 1, Token: b.client, ClientID: "silent", ClientType: protocol.ClientConsole})
	_, msg, err := silent.conn.Read(ctx) // the welcome; then it reads nothing, so it answers no ping
	require.NoError(t, err)
	require.Contains(t, string(msg), `"welcome"`)
	require.NoError(t, b.clock.BlockUntilContext(ctx, 1)) // the one heartbeat ticker of both
	for range 3 {
		b.clock.Advance(20 * time.Second)
		talker.send(&protocol.Ping{})
		next[*protocol.Pong](talker)
	}
	silent.read()
	silent.expectClose(protocol.CloseTimeout)
	for range 3 {
		b.clock.Advance(20 * time.Second)
		talker.send(&protocol.Ping{})
		next[*protocol.Pong](talker)
	}
}
