package agent

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/cheetahbroker/cheetah/protocol"
)

// countingConn counts the writes that reach the network.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// Several frames written together leave in one write of the connection,
// in order; a frame on its own, in one write too.
func TestSessionWritesFramesTogetherInOneWrite(t *testing.T) {
	t.Parallel()
	got := make(chan string, 8)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			_, data, err := c.Read(context.Background())
			if err != nil {
				return
			}
			got <- string(data)
		}
	}))
	t.Cleanup(srv.Close)

	s, err := dial(context.Background(), "ws"+strings.TrimPrefix(srv.URL, "http"), dialer(nil), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.conn.CloseNow() })
	require.NotNil(t, s.held, "the session knows its connection")
	cc := &countingConn{Conn: s.held.Conn}
	s.held.Conn = cc // nothing writes before the first write below

	ctx := context.Background()
	require.NoError(t, s.write(ctx, &protocol.Ack{CommandID: "c1"}, &protocol.Result{CommandID: "c1"}))
	require.EqualValues(t, 1, cc.writes.Load(), "an ack and a result in one write")
	require.NoError(t, s.write(ctx, &protocol.Ack{CommandID: "c2"}))
	require.EqualValues(t, 2, cc.writes.Load())
	for _, want := range []string{`"ack","command_id":"c1"`, `"result","command_id":"c1"`, `"ack","command_id":"c2"`} {
		require.Contains(t, <-got, want)
	}
}
