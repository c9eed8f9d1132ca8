package registry_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/protocol"
)

// checker is a fake client's view of what it was sent, checked against the
// invariants: per context, assignments and their ends alternate with rising
// epochs (one lease at a time), and commands never arrive from an epoch
// older than one already seen (a stale handle never acts).
type checker struct {
	mu       sync.Mutex
	holder   map[string]int64 // context → epoch of the current assignment, 0 when none
	lastSeen map[string]int64 // context → highest epoch seen
	errs     []string
}

func newChecker() *checker {
	return &checker{holder: map[string]int64{}, lastSeen: map[string]int64{}}
}

func (k *checker) failf(format string, args ...any) {
	k.errs = append(k.errs, fmt.Sprintf(format, args...))
}

func (k *checker) see(f protocol.Frame) {
	k.mu.Lock()
	defer k.mu.Unlock()
	switch f := f.(type) {
	case *protocol.Assignment:
		if f.State == protocol.AssignmentAssigned {
			if h := k.holder[f.ContextID]; h != 0 {
				k.failf("%s assigned epoch %d while epoch %d held it", f.ContextID, f.Epoch, h)
			}
			if f.Epoch <= k.lastSeen[f.ContextID] {
				k.failf("%s assigned epoch %d after seeing %d", f.ContextID, f.Epoch, k.lastSeen[f.ContextID])
			}
			k.holder[f.ContextID], k.lastSeen[f.ContextID] = f.Epoch, f.Epoch
			return
		}
		if k.holder[f.ContextID] != f.Epoch {
			k.failf("%s: %s for epoch %d, but epoch %d held it", f.ContextID, f.State, f.Epoch, k.holder[f.ContextID])
		}
		k.holder[f.ContextID] = 0
	case *protocol.Command:
		if f.Epoch < k.lastSeen[f.ContextID] {
			k.failf("%s: command of epoch %d after epoch %d", f.ContextID, f.Epoch, k.lastSeen[f.ContextID])
		}
	}
}

// respond plays a client: it checks every frame and answers every command
// with a result, until stop closes.
func (e *env) respond(c *client, k *checker, stop <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	next := 0
	for {
		frames := c.conn.all()
		for _, f := range frames[next:] {
			k.see(f)
			if cmd, ok := f.(*protocol.Command); ok && cmd.ResponseMode != protocol.ResponseNone {
				e.reg.ClientMessage(context.Background(), c.att, &protocol.Ack{CommandID: cmd.CommandID})
				e.result(c, cmd.CommandID, `{"ok":1}`)
			}
		}
		next = len(frames)
		select {
		case <-stop:
			return
		case <-c.conn.notify:
		}
	}
}

func TestConcurrentInvariants(t *testing.T) {
	t.Parallel()
	// Blocks large enough that the next one is always reserved in time: an
	// acquire that finds the block empty fails rather than wait.
	e := setup(t, func(c *registry.Config) { c.EpochBlock = 1024 })
	const clients, perClient, workers, rounds = 4, 4, 16, 60
	k := newChecker()
	stop := make(chan struct{})
	var rwg sync.WaitGroup
	var cs []*client
	for i := range clients {
		var reps []protocol.ContextReport
		for j := range perClient {
			reps = append(reps, worker(fmt.Sprintf("c%d-w%d", i, j)))
		}
		c := e.connect(fmt.Sprintf("agent-%d", i), cheetah.Console, nil, reps...)
		cs = append(cs, c)
		rwg.Add(1)
		go e.respond(c, k, stop, &rwg)
	}

	allowed := map[cheetah.LostReason]bool{cheetah.LostExpired: true, cheetah.LostRevoked: true, cheetah.LostReassigned: true}
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			ctx := context.Background()
			for range rounds {
				l, err := e.acquire(fmt.Sprintf("task-%d", w%5), func(r *cheetah.AcquireRequest) { r.TTL = 5 * time.Second })
				if errors.Is(err, cheetah.ErrNoContextAvailable) {
					continue
				}
				if err != nil {
					errc <- err
					return
				}
				for range rng.IntN(4) + 1 {
					var err error
					switch rng.IntN(4) {
					case 0:
						var res cheetah.Resolution
						res, err = e.reg.SendAndWait(ctx, l, cheetah.Command{Name: "echo"}, cheetah.SendOptions{Timeout: time.Hour})
						if err == nil && res.Status != cheetah.StatusCompleted {
							err = fmt.Errorf("resolution %s", res.Status)
						}
					case 1:
						_, err = e.reg.Send(ctx, l, cheetah.Command{Name: "echo"}, cheetah.SendOptions{Timeout: time.Hour})
					case 2:
						_, err = e.reg.Renew(ctx, l, 0)
					case 3:
						_, _ = e.reg.Revoke(context.Background(), user, l.ClientID, l.ContextID)
					}
					var lost *cheetah.LeaseLostError
					if errors.As(err, &lost) && allowed[lost.Reason] {
						break
					}
					if err != nil {
						errc <- err
						return
					}
				}
				if _, err := e.reg.Release(ctx, l); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	// Time moves on meanwhile, so leases expire under load.
	tick := make(chan struct{})
	go func() {
		defer close(tick)
		for range 50 {
			e.clock.Advance(time.Second)
			e.reg.ExpireDue()
		}
	}()
	wg.Wait()
	<-tick
	close(errc)
	for err := range errc {
		require.NoError(t, err)
	}
	// Let every resolution reach history before the clients go.
	require.Eventually(t, func() bool { return e.reg.Stats().Commands == 0 && e.reg.Stats().Leases == 0 }, 10*time.Second, time.Millisecond)
	close(stop)
	rwg.Wait()
	for _, c := range cs {
		e.reg.Disconnect(c.att)
	}
	e.clock.Advance(time.Minute) // past the reconnect grace
	require.Eventually(t, func() bool { return e.reg.Stats().Clients == 0 }, 10*time.Second, time.Millisecond)
	requireZero(t, e.reg)
	k.mu.Lock()
	defer k.mu.Unlock()
	require.Empty(t, k.errs)
}
