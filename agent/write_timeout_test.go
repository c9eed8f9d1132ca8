package agent

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/cheetahbroker/cheetah/protocol"
)

// A broker that stops reading leaves a write blocked; the session gives the
// connection up once a write has taken its timeout, and the write fails.
func TestWriteToABrokerThatDoesNotReadFails(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		<-release // never reads
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })

	s, err := dial(context.Background(), "ws"+strings.TrimPrefix(srv.URL, "http"), nil, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.conn.CloseNow() })
	s.writeTimeout = 50 * time.Millisecond

	data := json.RawMessage(`"` + strings.Repeat("x", 1<<20) + `"`)
	failed := make(chan error, 1)
	go func() {
		for {
			// Each write takes well under the timeout until the
			// connection's buffers are full.
			if err := s.write(context.Background(), &protocol.Event{CommandID: "c", Name: "n", Data: data}); err != nil {
				failed <- err
				return
			}
		}
	}()
	select {
	case err := <-failed:
		require.Error(t, err)
	case <-time.After(time.Minute):
		t.Fatal("a write to a broker that does not read never failed")
	}
}
