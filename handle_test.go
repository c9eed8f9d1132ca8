package cheetah_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
)

// watchBackend is a Backend whose leases are watched by hand: lose ends
// the watched lease, and the watches started and stopped are counted.
type watchBackend struct {
	cheetah.Backend // nil: only what the test calls is implemented
	mu              sync.Mutex
	lost            []func(cheetah.LostReason)
	started         int
	stopped         int
}

func (b *watchBackend) Acquire(context.Context, cheetah.AcquireRequest) (cheetah.Lease, error) {
	return cheetah.Lease{LeaseToken: "t"}, nil
}

func (b *watchBackend) Release(context.Context, cheetah.Lease) (bool, error) { return true, nil }

func (b *watchBackend) WatchLease(_ cheetah.Lease, lost func(cheetah.LostReason)) func() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.started++
	b.lost = append(b.lost, lost)
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.stopped++
	}
}

func (b *watchBackend) lose(r cheetah.LostReason) {
	b.mu.Lock()
	fs := b.lost
	b.mu.Unlock()
	for _, f := range fs {
		f(r)
	}
}

func TestHandleDone(t *testing.T) {
	t.Parallel()
	b := &watchBackend{}
	m := cheetah.NewManager(b)
	h, err := m.Acquire(context.Background(), cheetah.AcquireRequest{})
	require.NoError(t, err)
	require.NoError(t, h.Err())
	done := h.Done()
	require.Equal(t, done, h.Done(), "one channel, one watch")
	require.Equal(t, 1, b.started)
	b.lose(cheetah.LostRevoked)
	b.lose(cheetah.LostExpired) // the first reason stands
	<-done
	var lost *cheetah.LeaseLostError
	require.True(t, errors.As(h.Err(), &lost))
	require.Equal(t, cheetah.LostRevoked, lost.Reason)
	require.ErrorIs(t, h.Err(), cheetah.ErrLeaseLost)

	// Released through the Manager: Done closes with released, the watch
	// stops.
	h2, _ := m.Acquire(context.Background(), cheetah.AcquireRequest{})
	d2 := h2.Done()
	_, err = m.Release(context.Background(), h2)
	require.NoError(t, err)
	<-d2
	require.True(t, errors.As(h2.Err(), &lost))
	require.Equal(t, cheetah.LostReleased, lost.Reason)
	require.Equal(t, 1, b.stopped)

	// Closed before Done: no watch starts, Done stays open.
	h3, _ := m.Acquire(context.Background(), cheetah.AcquireRequest{})
	h3.Close()
	select {
	case <-h3.Done():
		t.Fatal("Done closed on a handle that was only closed")
	default:
	}
	require.Equal(t, 2, b.started, "h and h2 only")
}

// A handle released before anyone asked for Done: Done is closed at once,
// Err says released, and no watch starts. Released while others watch
// Done: none of them ever sees Done closed with Err still nil.
func TestHandleReleasedDone(t *testing.T) {
	t.Parallel()
	b := &watchBackend{}
	m := cheetah.NewManager(b)
	ctx := context.Background()
	h, err := m.Acquire(ctx, cheetah.AcquireRequest{})
	require.NoError(t, err)
	_, err = m.Release(ctx, h)
	require.NoError(t, err)
	<-h.Done()
	var lost *cheetah.LeaseLostError
	require.True(t, errors.As(h.Err(), &lost))
	require.Equal(t, cheetah.LostReleased, lost.Reason)
	require.Zero(t, b.started, "no watch for a released handle")

	for range 200 {
		h, err := m.Acquire(ctx, cheetah.AcquireRequest{})
		require.NoError(t, err)
		var wg sync.WaitGroup
		var early sync.Map
		for i := range 4 {
			wg.Go(func() {
				<-h.Done()
				if h.Err() == nil {
					early.Store(i, true)
				}
			})
		}
		_, err = m.Release(ctx, h)
		require.NoError(t, err)
		wg.Wait()
		early.Range(func(k, _ any) bool { t.Errorf("watcher %v saw Done closed with Err nil", k); return false })
		require.ErrorIs(t, h.Err(), cheetah.ErrLeaseLost)
	}
}
