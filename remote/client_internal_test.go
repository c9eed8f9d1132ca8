package remote

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{" 7 ", 7 * time.Second, true},
		{"-1", 0, false},
		{"soon", 0, false},
		{"99999999999", 24 * time.Hour, true},
		{now.Add(time.Minute).Format(http.TimeFormat), time.Minute, true},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0, true},
	} {
		d, ok := parseRetryAfter(tc.in, now)
		require.Equal(t, tc.ok, ok, tc.in)
		require.Equal(t, tc.want, d, tc.in)
	}
}

// The default client must not cut long waits short: each call's context
// bounds it instead.
func TestDefaultHTTPClientHasNoTimeout(t *testing.T) {
	c := NewClient("http://example.invalid", "k")
	require.Zero(t, c.hc.Timeout)
	require.Nil(t, c.hc.Transport, "the shared default transport")
	own := &http.Client{}
	require.Same(t, own, NewClient("http://x", "k", WithHTTPClient(own)).hc)
	require.NotNil(t, NewClient("http://x", "k", WithHTTPClient(nil)).hc)
}
