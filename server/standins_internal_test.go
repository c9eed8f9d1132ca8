package server

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
)

// A wait withdrawn before it comes never starts; one withdrawn while it
// waits ends; a withdrawal is forgotten once its wait can no longer come.
func TestStandInsWithdraw(t *testing.T) {
	t.Parallel()
	var w standIns
	now := time.Unix(1_000_000, 0)

	w.withdraw("early", now)
	_, _, ok := w.begin(context.Background(), "early")
	require.False(t, ok, "withdrawn before it came")
	ctx, done, ok := w.begin(context.Background(), "early")
	require.True(t, ok, "a withdrawal stops one wait, not every later one")
	require.NoError(t, ctx.Err())
	done()

	ctx, done, ok = w.begin(context.Background(), "waiting")
	require.True(t, ok)
	w.withdraw("waiting", now)
	require.ErrorIs(t, ctx.Err(), context.Canceled)
	done()
	require.Empty(t, w.waiting)
	require.Empty(t, w.withdrawn, "a wait withdrawn while it waited leaves nothing behind")

	w.withdraw("never", now)
	w.withdraw("later", now.Add(cheetah.MaxWait+withdrawGrace+time.Second))
	require.NotContains(t, w.withdrawn, "never")
	require.Contains(t, w.withdrawn, "later")
}
