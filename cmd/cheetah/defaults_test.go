package main

import (
	"testing"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
)

// TestServeDefaultsAreTheBrokers: the serve flags' defaults are the
// broker's own defaults, not copies of them.
func TestServeDefaultsAreTheBrokers(t *testing.T) {
	t.Parallel()
	var c cli
	parser, err := kong.New(&c, kong.DefaultEnvars("CHEETAH_TEST_UNSET"), defaults)
	require.NoError(t, err)
	_, err = parser.Parse([]string{"serve"})
	require.NoError(t, err)
	s := c.Serve
	require.Equal(t, cheetah.DefaultTTL, s.DefaultTTL)
	require.Equal(t, cheetah.DefaultReconnectGrace, s.ReconnectGrace)
	require.Equal(t, cheetah.DefaultHeartbeat, s.Heartbeat)
	require.Equal(t, cheetah.DefaultMaxMessageBytes, s.MaxMessageBytes)
	require.Equal(t, int64(cheetah.DefaultMaxBodyBytes), s.MaxBodyBytes)
	require.Equal(t, cheetah.DefaultMaxInFlightPerContext, s.MaxInFlight)
	require.Equal(t, cheetah.DefaultMaxPendingHellos, s.MaxPendingHellos)
}
