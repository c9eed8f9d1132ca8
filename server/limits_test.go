package server_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/server"
)

func TestKeyRateLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *server.Config) { c.KeyRateLimit = 2 })
	path := "/api/v1/users/" + user + "/contexts/available"
	require.Equal(t, http.StatusOK, b.do("GET", path, b.appKey, nil, nil).StatusCode)
	require.Equal(t, http.StatusOK, b.do("GET", path, b.appKey, nil, nil).StatusCode, "the burst is one second's worth")
	resp := b.do("GET", path, b.appKey, nil, nil)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	b.expectError(429, "rate_limited", "", "GET", path, b.appKey, nil)
	require.Equal(t, http.StatusOK, b.do("GET", path, b.adminKey, nil, nil).StatusCode, "each key has its own bucket")
	b.clock.Advance(time.Second)
	require.Equal(t, http.StatusOK, b.do("GET", path, b.appKey, nil, nil).StatusCode, "the bucket refills")
}

func TestFrameRateLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *server.Config) { c.FrameRateLimit = 5 })
	c := b.dial().read()
	c.hello(b.client, "a", protocol.ClientConsole) // frame 1
	for range 4 {                                  // frames 2..5: at the limit
		c.send(&protocol.Ping{})
		next[*protocol.Pong](c)
	}
	c.send(&protocol.Ping{}) // one past it
	c.expectClose(protocol.CloseRateLimited)
}

func TestBodyLimitEdge(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *server.Config) { c.MaxBodyBytes = 256 })
	body := func(n int) string {
		head, tail := `{"user_id":"`+user+`","task_id":"`, `"}`
		return head + strings.Repeat("t", n-len(head)-len(tail)) + tail
	}
	// At the limit the body is read and judged on its content (no client
	// is connected, so nothing can be assigned).
	b.expectError(409, "no_context_available", "no_eligible_client", "POST", "/api/v1/acquire", b.appKey, body(256))
	b.expectError(413, "payload_too_large", "", "POST", "/api/v1/acquire", b.appKey, body(257))
}
