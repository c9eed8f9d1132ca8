package registry_test

import (
	"context"
	"fmt"
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
	e.connect("agent-1", cheetah.Console, nil, worker("w1"), worker("w2"))
	ctx := context.Background()
	fs.setFail(true)
	// Use up 7 of the block of 8 epochs reserved at start (its refills
	// fail), leaving both contexts leased and one epoch at hand.
	for i := range 5 {
		l, err := e.acquire("t")
		require.NoError(t, err, "epoch %d", i+1)
		_, err = e.reg.Release(ctx, l)
		require.NoError(t, err)
	}
	la, lb := e.mustAcquire("a"), e.mustAcquire("b")
	// Two acquires wait; the first hand-over takes the last epoch, the
	// second finds none.
	got := make(chan error, 2)
	waitFor := func(task string) {
		l, err := e.acquire(task, func(r *cheetah.AcquireRequest) { r.Wait = 30 * time.Second })
		if err == nil && l.Epoch != 8 {
			err = fmt.Errorf("epoch %d, want 8", l.Epoch)
		}
		got <- err
	}
	go waitFor("waiting-1")
	bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, e.clock.BlockUntilContext(bctx, 2), "the expiry loop's timer and the first waiter's")
	go waitFor("waiting-2")
	require.NoError(t, e.clock.BlockUntilContext(bctx, 3), "and the second waiter's")
	ok, err := e.reg.Release(ctx, la)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, <-got, "the first waiter gets the last epoch")
	ok, err = e.reg.Release(ctx, lb)
	require.NoError(t, err)
	require.True(t, ok)
	require.ErrorIs(t, <-got, cheetah.ErrStoreUnavailable, "the second waiter is told why")

	fs.setFail(false)
	require.NoError(t, e.reg.ReserveEpochs(ctx))
	avail, err := e.reg.ListAvailable(ctx, user, cheetah.Console)
	require.NoError(t, err)
	require.Len(t, avail, 1, "the context is idle again, not stranded")
	require.Equal(t, lb.ContextID, avail[0].ContextID)
	l := e.mustAcquire("after")
	require.Equal(t, lb.ContextID, l.ContextID)
}
