package registry_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/protocol"
)

// While the store's queue is full (WriteAsync blocks), the registry goes on:
// sends are dispatched, the client's messages are taken, leases renew, and
// once the store takes writes again they reach it in the order the registry
// decided them: dispatched, ack, the messages in their order, the terminal
// status.
func TestBlockedWritesNeverStallTheRegistry(t *testing.T) {
	t.Parallel()
	bs := &blockingWrites{Store: historytest.NewSQLite(t), gate: make(chan struct{}), entered: make(chan struct{})}
	opened := false
	defer func() {
		if !opened {
			close(bs.gate)
		}
	}()
	e := setup(t, func(c *registry.Config) { c.Store = bs })
	var reps []protocol.ContextReport
	for i := range 4 {
		reps = append(reps, worker(fmt.Sprintf("w%d", i)))
	}
	c := e.connect("a", cheetah.Console, nil, reps...)
	ctx := context.Background()
	var leases []cheetah.Lease
	for range 4 {
		leases = append(leases, e.mustAcquire("t"))
	}

	finished := make(chan struct{})
	errs := make(chan error, 64)
	ids := make([]string, len(leases))
	go func() {
		defer close(finished)
		var wg sync.WaitGroup
		for i, l := range leases {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sent, err := e.reg.Send(ctx, l, cheetah.Command{Name: "echo"}, cheetah.SendOptions{Timeout: time.Hour})
				if err != nil {
					errs <- err
					return
				}
				ids[i] = sent.CommandID
				for range 10 {
					if _, err := e.reg.Renew(ctx, l, 0); err != nil {
						errs <- err
					}
					_ = e.reg.Stats()
				}
			}()
		}
		wg.Wait()
		// The client answers every command with an ack, three events and
		// a result.
		for _, id := range ids {
			if id == "" {
				continue
			}
			e.reg.ClientMessage(ctx, c.att, &protocol.Ack{CommandID: id})
			for j := range 3 {
				e.reg.ClientMessage(ctx, c.att, &protocol.Event{CommandID: id, Name: fmt.Sprintf("e%d", j)})
			}
			e.result(c, id, `{}`)
		}
	}()
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		t.Fatal("the registry waited for the blocked store")
	}
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	select {
	case <-bs.entered:
	default:
		t.Fatal("the store never blocked: the test proves nothing")
	}
	require.Zero(t, e.reg.Stats().Commands, "every command ended in the registry")

	close(bs.gate)
	opened = true
	// Interrupt (nothing is left in flight) returns once everything handed
	// to the store is written.
	n, err := e.reg.Interrupt(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	for _, id := range ids {
		rec, err := e.reg.ReadCommand(ctx, user, id)
		require.NoError(t, err)
		require.Equal(t, cheetah.StatusCompleted, rec.Status)
		var kinds []string
		for _, m := range rec.Messages {
			kinds = append(kinds, string(m.Kind)+m.Name)
		}
		require.Equal(t, []string{"ack", "evente0", "evente1", "evente2", "result"}, kinds)
		require.NotNil(t, rec.DispatchedAt)
		require.NotNil(t, rec.AckedAt)
	}
}
