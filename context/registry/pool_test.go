package registry_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
)

// A context that becomes idle while an acquire waits, at a moment no epoch
// can be issued (the store does not answer), is not stranded: the waiter
// learns store_unavailable and the context is idle, listed and acquirable
// once the store is back.
func TestFailedHandOverKeepsContextIdle(t *testing.T) {
	t.Parallel()
	e, fs := setupFaulty(t)
	e.connect("agent-1", cheetah.Console, nil, worker("w1"))
	ctx := context.Background()
	fs.setFail(true)
	// Use up the block of 8 epochs reserved at start; its refills fail.
	var l cheetah.Lease
	for i := range 8 {
		var err error
		l, err = e.acquire("t")
		require.NoError(t, err, "epoch %d", i+1)
		if i < 7 {
			_, err = e.reg.Release(ctx, l)
			require.NoError(t, err)
		}
	}
	// l holds w1; an acquire waits for it.
	got := make(chan error, 1)
	go func() {
		_, err := e.acquire("waiting", func(r *cheetah.AcquireRequest) { r.Wait = 30 * time.Second })
		got <- err
	}()
	bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, e.clock.BlockUntilContext(bctx, 2), "the expiry loop's timer and the waiter's")
	ok, err := e.reg.Release(ctx, l)
	require.NoError(t, err)
	require.True(t, ok)
	err = <-got
	require.ErrorIs(t, err, cheetah.ErrStoreUnavailable, "the waiter is told why")

	fs.setFail(false)
	require.NoError(t, e.reg.ReserveEpochs(ctx))
	avail, err := e.reg.ListAvailable(ctx, user, cheetah.Console)
	require.NoError(t, err)
	require.Len(t, avail, 1, "the context is idle again, not stranded")
	require.Equal(t, "w1", avail[0].ContextID)
	l = e.mustAcquire("after")
	require.Equal(t, "w1", l.ContextID)
}
