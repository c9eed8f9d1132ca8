package registry_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const user = "usr_1111"

// env is one registry on a fake clock over a real SQLite store.
type env struct {
	t     *testing.T
	reg   *registry.Registry
	clock *clockwork.FakeClock
	store *history.Store
}

func setup(t *testing.T, tweak ...func(*registry.Config)) *env {
	t.Helper()
	store := historytest.NewSQLite(t)
	clock := clockwork.NewFakeClockAt(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	cfg := registry.Config{Clock: clock, Store: store, EpochBlock: 8}
	for _, f := range tweak {
		f(&cfg)
	}
	reg, err := registry.New(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(reg.Close)
	return &env{t: t, reg: reg, clock: clock, store: store}
}

// fakeConn records what the registry sends to one client connection.
type fakeConn struct {
	mu     sync.Mutex
	frames []protocol.Frame
	closed protocol.CloseCode
	notify chan struct{}
	full   bool // answers Send with false, as a client that does not read
}

func newFakeConn() *fakeConn { return &fakeConn{notify: make(chan struct{}, 1)} }

func (c *fakeConn) Send(f protocol.Frame) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.full {
		return false
	}
	c.frames = append(c.frames, f)
	select {
	case c.notify <- struct{}{}:
	default:
	}
	return true
}

func (c *fakeConn) Close(code protocol.CloseCode, _ string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = code
}

func (c *fakeConn) closeCode() protocol.CloseCode {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// all returns the frames received so far.
func (c *fakeConn) all() []protocol.Frame {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]protocol.Frame(nil), c.frames...)
}

// waitFor waits until a frame matching ok has arrived and returns it.
func waitFor[F protocol.Frame](t *testing.T, c *fakeConn, ok func(F) bool) F {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		for _, f := range c.all() {
			if x, is := f.(F); is && ok(x) {
				return x
			}
		}
		select {
		case <-c.notify:
		case <-deadline:
			var zero F
			t.Fatalf("no %T arrived; got %v", zero, c.all())
			return zero
		}
	}
}

func anyFrame[F protocol.Frame](F) bool { return true }

// client connects a console client with n worker contexts flow-1..flow-n.
type client struct {
	conn *fakeConn
	att  *registry.Attachment
	id   string
}

func (e *env) connect(clientID string, typ cheetah.ClientType, labels map[string]string, contexts ...protocol.ContextReport) *client {
	c := &client{conn: newFakeConn(), id: clientID}
	c.att = e.reg.Connect(registry.ClientInfo{UserID: user, ClientID: clientID, Type: typ, Labels: labels, KeyID: "k1",
		Forgets: e.reg.Forgets()}, c.conn)
	e.reg.Report(c.att, contexts)
	return c
}

func worker(id string) protocol.ContextReport {
	return protocol.ContextReport{ContextID: id, TabID: "tab-" + id, Owner: protocol.OwnerWorker}
}

func human(id string) protocol.ContextReport {
	return protocol.ContextReport{ContextID: id, TabID: "tab-" + id, Owner: protocol.OwnerHuman}
}

func (e *env) acquire(task string, mods ...func(*cheetah.AcquireRequest)) (cheetah.Lease, error) {
	req := cheetah.AcquireRequest{UserID: user, TaskID: task, ClientType: cheetah.Console}
	for _, m := range mods {
		m(&req)
	}
	return e.reg.Acquire(context.Background(), req)
}

// revoked revokes the lease on a context, which must carry one.
func (e *env) revoked(userID, clientID, contextID string) {
	e.t.Helper()
	ok, err := e.reg.Revoke(context.Background(), userID, clientID, contextID)
	require.NoError(e.t, err)
	require.True(e.t, ok, "a lease to revoke on %s", contextID)
}

func (e *env) mustAcquire(task string, mods ...func(*cheetah.AcquireRequest)) cheetah.Lease {
	e.t.Helper()
	l, err := e.acquire(task, mods...)
	require.NoError(e.t, err)
	return l
}

func lostReason(t *testing.T, err error) cheetah.LostReason {
	t.Helper()
	var lost *cheetah.LeaseLostError
	require.ErrorAs(t, err, &lost)
	require.ErrorIs(t, err, cheetah.ErrLeaseLost)
	return lost.Reason
}

func noContextReason(t *testing.T, err error) cheetah.NoContextReason {
	t.Helper()
	var nc *cheetah.NoContextError
	require.ErrorAs(t, err, &nc)
	require.ErrorIs(t, err, cheetah.ErrNoContextAvailable)
	return nc.Reason
}

// answer replies to command id from client c with a result.
func (e *env) result(c *client, id string, data string) {
	e.reg.ClientMessage(context.Background(), c.att, &protocol.Result{CommandID: id, Data: []byte(data)})
}

// requireZero asserts that the registry's bookkeeping is empty (invariant 11).
func requireZero(t *testing.T, reg *registry.Registry) {
	t.Helper()
	s := reg.Stats()
	require.Zero(t, s.Leases, "leases")
	require.Zero(t, s.Heap, "heap")
	require.Zero(t, s.Commands, "commands")
	require.Zero(t, s.Waiters, "waiters")
	require.Zero(t, s.Preserving, "preserving")
	require.Zero(t, s.Clients, "clients")
	require.Zero(t, s.Contexts, "contexts")
	require.Zero(t, s.Slots, "quota slots")
	require.Zero(t, s.QuotaWaiters, "quota waiters")
	require.Zero(t, s.Creations, "creations")
}

// faultyStore is a history store whose epoch reservations can be made to
// fail, or to block until released.
type faultyStore struct {
	*history.Store
	mu       sync.Mutex
	fail     bool
	gate     chan struct{} // when not nil, ReserveEpochs waits for it to close
	entered  chan struct{} // receives once per ReserveEpochs call that waits on gate
	reserves int
	asked    []int64 // the size of each reservation
}

func (s *faultyStore) ReserveEpochs(ctx context.Context, n int64) (int64, error) {
	s.mu.Lock()
	s.reserves++
	s.asked = append(s.asked, n)
	fail, gate, entered := s.fail, s.gate, s.entered
	s.mu.Unlock()
	if gate != nil {
		if entered != nil {
			entered <- struct{}{}
		}
		select {
		case <-gate:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	if fail {
		return 0, errors.New("the database does not answer")
	}
	return s.Store.ReserveEpochs(ctx, n)
}

func (s *faultyStore) setFail(v bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = v
}

// setupFaulty is setup over a faultyStore.
func setupFaulty(t *testing.T, tweak ...func(*registry.Config)) (*env, *faultyStore) {
	t.Helper()
	fs := &faultyStore{Store: historytest.NewSQLite(t)}
	e := setup(t, append([]func(*registry.Config){func(c *registry.Config) { c.Store = fs }}, tweak...)...)
	e.store = fs.Store
	return e, fs
}

// blockingWrites is a history store whose WriteAsync blocks until gate is
// closed, as the writer's does while its queue is full.
type blockingWrites struct {
	*history.Store
	gate    chan struct{}
	entered chan struct{} // receives once when a WriteAsync first blocks
	once    sync.Once
}

func (s *blockingWrites) WriteAsync(done func(error), ops ...history.Op) {
	select {
	case <-s.gate:
	default:
		s.once.Do(func() { close(s.entered) })
		<-s.gate
	}
	s.Store.WriteAsync(done, ops...)
}
