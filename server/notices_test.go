package server_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/server"
)

// Over a real session whose outbound queue has 4 slots, a client with 64
// contexts that reads keeps its connection through a churn of 10,000
// acquire/release pairs: the session carries the registry's coalesced
// notices, so the notice frames queued for it are bounded by its contexts.
// It ends told the registry's view of each context.
func TestChurnKeepsAReadingClient(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *server.Config) { c.OutboundQueue = 4 })
	ctx := context.Background()
	var ids []string
	for i := range 64 {
		ids = append(ids, fmt.Sprintf("w%d", i))
	}
	c := b.connectAgent("churned", ids...)

	var mu sync.Mutex
	last := map[string]protocol.Assignment{}
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		for f := range c.frames {
			if a, ok := f.(*protocol.Assignment); ok {
				mu.Lock()
				last[a.ContextID] = *a
				mu.Unlock()
			}
		}
	}()

	const pairs, workers = 10_000, 8
	var wg sync.WaitGroup
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := cheetah.AcquireRequest{UserID: user, TaskID: fmt.Sprintf("t%d", g), ClientType: cheetah.Console}
			for range pairs / workers {
				l, err := b.reg.Acquire(ctx, req)
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := b.reg.Release(ctx, l); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	held := map[string]cheetah.Lease{}
	for range 8 {
		l, err := b.reg.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "final", ClientType: cheetah.Console})
		require.NoError(t, err)
		held[l.ContextID] = l
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			a, ok := last[id]
			if l, isHeld := held[id]; isHeld {
				if !ok || a.State != protocol.AssignmentAssigned || a.Epoch != l.Epoch {
					return false
				}
			} else if ok && a.State == protocol.AssignmentAssigned {
				return false
			}
		}
		return true
	}, 10*time.Second, 5*time.Millisecond, "the client's final view differs from the registry's")

	select {
	case err := <-c.closed:
		t.Fatalf("the reading client was dropped: %v", err)
	default:
	}
	idle, err := b.reg.ListAvailable(ctx, user, cheetah.Console)
	require.NoError(t, err)
	require.Len(t, idle, 64-len(held), "the client's contexts are still live")
	for _, l := range held {
		_, err := b.reg.Release(ctx, l)
		require.NoError(t, err)
	}
	c.conn.CloseNow()
	<-readDone
}
