package server_test

import (
	"net/http"
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
