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
// sends are dispatched (dispatch overlaps the record's commit), the
// client's messages are taken, leases renew; the senders are answered once
// their records are durable, and the writes reach the store in the order
// the registry decided them: the record, ack, the messages in their order,
// the terminal status.
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

	sent := make(chan error, len(leases))
	ids := make([]string, len(leases))
	var wg sync.WaitGroup
	for i, l := range leases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := e.reg.Send(ctx, l, cheetah.Command{Name: "echo"}, cheetah.SendOptions{Timeout: time.Hour})
			ids[i] = s.CommandID
			sent <- err
		}()
	}
	finished := make(chan struct{})
	errs := make(chan error, 64)
	go func() {
		defer close(finished)
		for _, l := range leases {
			for range 10 {
				if _, err := e.reg.Renew(ctx, l, 0); err != nil {
					errs <- err
				}
				_ = e.reg.Stats()
			}
		}
		// The client answers every command with an ack, three events and
		// a result, while no record is durable yet.
		for n := 1; n <= len(leases); n++ {
			id := cmdFrame(t, c, n).CommandID
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
	case err := <-sent:
		t.Fatalf("a send was answered (%v) before its record could be written", err)
	default:
	}
	select {
	case <-bs.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the store never blocked: the test proves nothing")
	}
	require.Zero(t, e.reg.Stats().Commands, "every command ended in the registry")

	close(bs.gate)
	opened = true
	wg.Wait()
	for range leases {
		require.NoError(t, <-sent)
	}
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
