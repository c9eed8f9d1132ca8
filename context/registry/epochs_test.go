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
	"github.com/cheetahbroker/cheetah/protocol"
)

// While the store blocks in an epoch reservation, nothing else of the
// registry waits for it: stats, renews and releases of other leases go on,
// and an acquire that finds the block empty waits for the reservation
// outside the lock, then gets an epoch of the new block.
func TestEpochReservationNeverStallsTheRegistry(t *testing.T) {
	t.Parallel()
	e, fs := setupFaulty(t)
	var reps []protocol.ContextReport
	for i := range 12 {
		reps = append(reps, worker(fmt.Sprintf("w%d", i)))
	}
	e.connect("agent-1", cheetah.Console, nil, reps...)
	ctx := context.Background()

	gate, entered := make(chan struct{}), make(chan struct{}, 4)
	fs.mu.Lock()
	fs.gate, fs.entered = gate, entered
	fs.mu.Unlock()
	opened := false
	defer func() {
		if !opened {
			close(gate)
		}
	}()

	// The block holds epochs 1..8; issuing the 4th leaves half of it, and
	// the next block is reserved in the background, where the store blocks.
	var leases []cheetah.Lease
	for range 4 {
		leases = append(leases, e.mustAcquire("t"))
	}
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no reservation started when half the block was issued")
	}
	for range 4 {
		leases = append(leases, e.mustAcquire("t"))
	}
	for i, l := range leases {
		require.Equal(t, int64(i+1), l.Epoch)
	}

	// Now the block is empty and the store still blocks. Everything below
	// runs on many goroutines and must finish while it does.
	errs := make(chan error, 64)
	var wg sync.WaitGroup
	for i, l := range leases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				s := e.reg.Stats()
				if s.Leases > 8 || s.Leases < 4 {
					errs <- fmt.Errorf("stats: %d leases", s.Leases)
					return
				}
			}
			if i%2 == 0 {
				got, err := e.reg.Renew(ctx, l, 0)
				if err != nil || got.Epoch != l.Epoch || got.ContextID != l.ContextID {
					errs <- fmt.Errorf("renew %d: %v %+v", l.Epoch, err, got)
				}
				return
			}
			ok, err := e.reg.Release(ctx, l)
			if err != nil || !ok {
				errs <- fmt.Errorf("release %d: %v %v", l.Epoch, ok, err)
			}
		}()
	}
	acquired := make(chan cheetah.Lease, 4)
	var acquirers sync.WaitGroup
	for range 4 {
		acquirers.Add(1)
		go func() {
			defer acquirers.Done()
			l, err := e.acquire("more")
			if err != nil {
				errs <- fmt.Errorf("acquire with no epoch at hand: %v, want it to wait for the block", err)
				return
			}
			acquired <- l
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(5 * time.Second):
		t.Fatal("the registry waited for the blocked store")
	}
	require.Empty(t, acquired, "no acquire got an epoch while the store blocked")
	s := e.reg.Stats()
	require.Equal(t, 4, s.Leases, "the renewed leases remain, the released ones are gone")
	fs.mu.Lock()
	require.Equal(t, 2, fs.reserves, "the first block and one background reservation: none under the lock")
	fs.mu.Unlock()

	// Once the store answers, the waiting acquires get epochs of the new
	// block.
	close(gate)
	opened = true
	acquirers.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	close(acquired)
	for l := range acquired {
		require.Greater(t, l.Epoch, int64(8))
	}
}

// A block that runs out makes the next one larger, so that a burst of
// acquires stops waiting for the store.
func TestEpochBlockGrowsWhenItRunsOut(t *testing.T) {
	t.Parallel()
	e, fs := setupFaulty(t)
	var reps []protocol.ContextReport
	for i := range 64 {
		reps = append(reps, worker(fmt.Sprintf("w%d", i)))
	}
	e.connect("agent-1", cheetah.Console, nil, reps...)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	seen := sync.Map{}
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := e.acquire("burst")
			if err != nil {
				errs <- err
				return
			}
			if _, dup := seen.LoadOrStore(l.Epoch, true); dup {
				errs <- fmt.Errorf("epoch %d issued twice", l.Epoch)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err, "a burst of acquires waits for epochs rather than failing")
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	// Blocks of 8, 16, 32, 64: without growth 64 epochs take 8 blocks.
	require.Less(t, fs.reserves, 8, "reservations")
}

// An acquire that finds the block used up while the next one is being
// reserved waits for it (briefly) instead of failing, and blocks used up
// fast grow, so a churn does not outrun the store's reservations.
func TestEpochBlocksKeepUpWithAChurn(t *testing.T) {
	t.Parallel()
	e, fs := setupFaulty(t)
	e.connect("agent-1", cheetah.Console, nil, worker("w1"), worker("w2"))
	ctx := context.Background()

	gate, entered := make(chan struct{}), make(chan struct{}, 4)
	fs.mu.Lock()
	fs.gate, fs.entered = gate, entered
	fs.mu.Unlock()
	// Epochs 1..8; the 4th starts the next reservation, which the store
	// holds.
	for range 8 {
		l := e.mustAcquire("t")
		ok, err := e.reg.Release(ctx, l)
		require.NoError(t, err)
		require.True(t, ok)
	}
	<-entered
	fs.mu.Lock()
	fs.gate = nil
	fs.mu.Unlock()
	time.AfterFunc(50*time.Millisecond, func() { close(gate) })
	l := e.mustAcquire("t")
	require.Equal(t, int64(9), l.Epoch, "the acquire waited for the reservation under way")
	_, err := e.reg.Release(ctx, l)
	require.NoError(t, err)

	// A churn: every block is used up in far less than a second, so the
	// blocks asked for grow.
	for range 2000 {
		l := e.mustAcquire("t")
		_, err := e.reg.Release(ctx, l)
		require.NoError(t, err)
	}
	require.NoError(t, e.reg.ReserveEpochs(ctx))
	fs.mu.Lock()
	asked := append([]int64(nil), fs.asked...)
	fs.mu.Unlock()
	require.Greater(t, asked[len(asked)-1], asked[0], "blocks asked for: %v", asked)
	require.Less(t, len(asked), 20, "blocks asked for: %v", asked)
}

// Two registries on one store reserve interleaved blocks of epochs, as the
// replicas of one database do. A client that moves from the one whose block
// is higher to the other gets epochs above every epoch issued before it
// came (its epoch floor), and a context handed over keeps its last epoch as
// a floor: a context's epochs never go down, whichever replica assigns them.
func TestEpochsRiseAcrossRegistriesOfOneStore(t *testing.T) {
	t.Parallel()
	low := setup(t)
	high, err := registry.New(context.Background(), registry.Config{Clock: low.clock, Store: low.store, EpochBlock: 1000})
	require.NoError(t, err)
	t.Cleanup(high.Close)
	ctx := context.Background()

	// On the registry of the higher block, the context gets a high epoch.
	conn := newFakeConn()
	a := high.Connect(registry.ClientInfo{UserID: user, ClientID: "mover", Type: cheetah.Console}, conn)
	high.Report(a, []protocol.ContextReport{worker("w1")})
	h, err := high.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "t", ClientType: cheetah.Console})
	require.NoError(t, err)
	_, err = high.Release(ctx, h)
	require.NoError(t, err)

	// Handed over to the registry of the lower block: above it, still.
	handed, ok := high.HandOver(user, "mover", "elsewhere")
	require.True(t, ok)
	low.reg.Adopt(low.reg.Forgets(), user, "mover", handed)
	a2 := low.reg.Connect(registry.ClientInfo{UserID: user, ClientID: "mover", Type: cheetah.Console}, newFakeConn())
	low.reg.Report(a2, []protocol.ContextReport{worker("w1")})
	l, err := low.acquire("t2")
	require.NoError(t, err)
	require.Greater(t, l.Epoch, h.Epoch, "the handed-over context's last epoch is its floor")

	// A client new here, whose contexts had epochs elsewhere: the floor
	// given at hello.
	high2 := newFakeConn()
	b := high.Connect(registry.ClientInfo{UserID: user, ClientID: "fresh", Type: cheetah.Console}, high2)
	high.Report(b, []protocol.ContextReport{worker("f1")})
	hf, err := high.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "t3", ClientType: cheetah.Console, ClientID: "fresh"})
	require.NoError(t, err)
	high.Disconnect(b)
	c := low.reg.Connect(registry.ClientInfo{UserID: user, ClientID: "fresh", Type: cheetah.Console, EpochFloor: hf.Epoch}, newFakeConn())
	low.reg.Report(c, []protocol.ContextReport{worker("f1")})
	lf, err := low.acquire("t4", func(r *cheetah.AcquireRequest) { r.ClientID = "fresh" })
	require.NoError(t, err)
	require.Greater(t, lf.Epoch, hf.Epoch)
}
