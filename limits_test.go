package cheetah_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
)

// The messages that name a limit are built from the limit.
func TestLimitMessages(t *testing.T) {
	require.Equal(t, "ttl_s must be a whole number of seconds from 1 to 3600", cheetah.MsgTTL)
	require.Equal(t, "wait_ms must be a whole number from 0 to 60000", cheetah.MsgWait)
	require.Equal(t, "timeout_ms must be a whole number from 1 to 3600000", cheetah.MsgTimeout)
	require.Equal(t, "limit must be a whole number from 1 to 500", cheetah.MsgListLimit)
}

func TestChecks(t *testing.T) {
	for _, ok := range []string{"a", "usr_1", strings.Repeat("a", cheetah.MaxIDLen), "0193-aa:b.c"} {
		require.NoError(t, cheetah.CheckID("user_id", ok), ok)
	}
	for _, bad := range []string{"", "-a", "a b", "a\x00", "é", strings.Repeat("a", cheetah.MaxIDLen+1)} {
		err := cheetah.CheckID("user_id", bad)
		require.ErrorIs(t, err, cheetah.ErrInvalidRequest, bad)
		require.Contains(t, err.Error(), "user_id")
	}
	require.NoError(t, cheetah.CheckTaskID("task_id", "catalog/42 é"))
	for _, bad := range []string{"", "t\x00", "t\xff", strings.Repeat("t", cheetah.MaxTaskIDLen+1)} {
		require.ErrorIs(t, cheetah.CheckTaskID("task_id", bad), cheetah.ErrInvalidRequest, bad)
	}
	require.NoError(t, cheetah.CheckLabels("labels", map[string]string{"region": "eu", "é": ""}))
	for _, bad := range []map[string]string{
		{"": "v"}, {"k\x00": "v"}, {"k": "v\x00"}, {"k": "\xff"},
		{strings.Repeat("k", cheetah.MaxLabelKeyLen+1): "v"}, {"k": strings.Repeat("v", cheetah.MaxLabelValueLen+1)},
	} {
		require.ErrorIs(t, cheetah.CheckLabels("labels", bad), cheetah.ErrInvalidRequest, "%q", bad)
	}
	many := map[string]string{}
	for i := range cheetah.MaxLabels + 1 {
		many[strings.Repeat("k", i+1)] = ""
	}
	require.ErrorIs(t, cheetah.CheckLabels("labels", many), cheetah.ErrInvalidRequest)
}
