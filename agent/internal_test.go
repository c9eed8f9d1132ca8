package agent

import (
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestClientURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"http://127.0.0.1:8420":                "ws://127.0.0.1:8420/ws/v1/client",
		"https://broker.example.com/":          "wss://broker.example.com/ws/v1/client",
		"https://example.com/cheetah":          "wss://example.com/cheetah/ws/v1/client",
		"ws://127.0.0.1:8420/ws/v1/client":     "ws://127.0.0.1:8420/ws/v1/client",
		"wss://example.com/x/ws/v1/client?a=b": "wss://example.com/x/ws/v1/client?a=b",
	} {
		got, err := clientURL(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"ftp://example.com", "http://", "://nope"} {
		_, err := clientURL(bad)
		require.Error(t, err, bad)
	}
}

func TestBackoffGrowsWithJitterAndResets(t *testing.T) {
	t.Parallel()
	b := &backoff{min: 100 * time.Millisecond, max: time.Second}
	for _, base := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		base *= time.Millisecond
		d := b.next()
		require.GreaterOrEqual(t, d, base/2)
		require.LessOrEqual(t, d, base)
	}
	b.reset()
	require.LessOrEqual(t, b.next(), 100*time.Millisecond)
}

func TestCompleteTextHoldsBackCutCharacters(t *testing.T) {
	t.Parallel()
	s := []byte("a✓") // ✓ is three bytes
	require.Equal(t, 4, completeText(s))
	require.Equal(t, 1, completeText(s[:2]))
	require.Equal(t, 1, completeText(s[:3]))
	require.Equal(t, 2, completeText([]byte{'a', 0xff}), "bytes that are not UTF-8 are not held back")
	require.Equal(t, 1, charBoundary(s, 2))
	require.True(t, utf8.Valid(s[:charBoundary(s, 3)]))
}

func TestCleartextRemote(t *testing.T) {
	t.Parallel()
	for target, want := range map[string]bool{
		"ws://127.0.0.1:8420/ws/v1/client":        false,
		"ws://127.3.2.1:8420/ws/v1/client":        false,
		"ws://localhost:8420/ws/v1/client":        false,
		"ws://[::1]:8420/ws/v1/client":            false,
		"wss://broker.example.com/ws/v1/client":   false,
		"wss://10.0.0.5:8443/ws/v1/client":        false,
		"ws://10.0.0.5:8420/ws/v1/client":         true,
		"ws://broker.example.com/ws/v1/client":    true,
		"ws://127.0.0.1.nip.io:8420/ws/v1/client": true,
	} {
		require.Equal(t, want, cleartextRemote(target), target)
	}
}
