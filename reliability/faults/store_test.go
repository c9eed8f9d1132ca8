package faults

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/reliability/internal/rig"
	"github.com/cheetahbroker/cheetah/remote"
	"github.com/cheetahbroker/cheetah/server"
	"github.com/cheetahbroker/cheetah/server/auth"
)

// faultyStore is a real store whose writes the test can hold (a slow
// database) or fail (a database that went away), one kind of op at a time.
type faultyStore struct {
	*history.Store
	mu sync.Mutex
	// hold, when set, makes the next write that inserts a command wait for
	// it to close; held is closed once that write is waiting. A WriteAsync
	// waits before the store has it: the writes after it wait too.
	hold, held chan struct{}
	// failTerminal makes WriteAsync fail every terminal SetStatus.
	failTerminal bool
}

func (s *faultyStore) Write(ctx context.Context, ops ...history.Op) error {
	s.mu.Lock()
	hold, held := s.hold, s.held
	if hold != nil {
		for _, op := range ops {
			if _, ok := op.(history.InsertCommand); ok {
				s.hold, s.held = nil, nil
				s.mu.Unlock()
				close(held)
				<-hold
				return s.Store.Write(ctx, ops...)
			}
		}
	}
	s.mu.Unlock()
	return s.Store.Write(ctx, ops...)
}

func (s *faultyStore) WriteAsync(done func(error), ops ...history.Op) {
	s.mu.Lock()
	fail := s.failTerminal
	if hold, held := s.hold, s.held; hold != nil {
		for _, op := range ops {
			if _, ok := op.(history.InsertCommand); ok {
				s.hold, s.held = nil, nil
				s.mu.Unlock()
				close(held)
				<-hold
				s.Store.WriteAsync(done, ops...)
				return
			}
		}
	}
	s.mu.Unlock()
	if fail {
		for _, op := range ops {
			if st, ok := op.(history.SetStatus); ok && st.Status.Terminal() {
				if done != nil {
					go done(cheetah.StoreUnavailable("faulty store", errors.New("the database went away")))
				}
				return
			}
		}
	}
	s.Store.WriteAsync(done, ops...)
}

// frames records what one client connection is sent.
type frames struct {
	mu sync.Mutex
	fs []protocol.Frame
}

func (c *frames) Send(f protocol.Frame) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fs = append(c.fs, f)
	return true
}
func (c *frames) Close(protocol.CloseCode, string) {}

func (c *frames) all() []protocol.Frame {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]protocol.Frame(nil), c.fs...)
}

func worker1(id string) protocol.ContextReport {
	return protocol.ContextReport{ContextID: id, TabID: id, Owner: protocol.OwnerWorker}
}

// TestDroppedContextNoticeOrder: a context leaves the state report while a
// command on it waits for its record (a slow store; the command was
// dispatched at admission, before its record's commit), comes back, and is
// acquired again. The client must never hear of the old lease's end after
// the new lease's assignment, nor of the command after either: commands
// and assignment frames reach the client in the order they happened.
func TestDroppedContextNoticeOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := &faultyStore{Store: historytest.NewSQLite(t)}
	reg, err := registry.New(ctx, registry.Config{Store: store})
	require.NoError(t, err)
	defer reg.Close()
	conn := &frames{}
	att := reg.Connect(registry.ClientInfo{UserID: "usr_order", ClientID: "c", Type: cheetah.Console}, conn)
	reg.Report(att, []protocol.ContextReport{worker1("tab")})
	old, err := reg.Acquire(ctx, cheetah.AcquireRequest{UserID: "usr_order", TaskID: "t", ClientType: cheetah.Console})
	require.NoError(t, err)

	hold, held := make(chan struct{}), make(chan struct{})
	store.mu.Lock()
	store.hold, store.held = hold, held
	store.mu.Unlock()
	sent := make(chan error, 1)
	go func() {
		_, err := reg.Send(ctx, old, cheetah.Command{Name: "slow-to-record"}, cheetah.SendOptions{})
		sent <- err
	}()
	<-held // the command is admitted and waits for its record
	reg.Report(att, nil)
	reg.Report(att, []protocol.ContextReport{worker1("tab")})
	cur, err := reg.Acquire(ctx, cheetah.AcquireRequest{UserID: "usr_order", TaskID: "t", ClientType: cheetah.Console})
	require.NoError(t, err)
	require.Greater(t, cur.Epoch, old.Epoch)
	close(hold)
	require.NoError(t, <-sent)
	require.NoError(t, store.Store.Write(ctx)) // every write has landed

	// The client's view, in order: the last assignment frame about "tab"
	// must be the new lease's.
	var last *protocol.Assignment
	var seq []string
	for _, f := range conn.all() {
		if a, ok := f.(*protocol.Assignment); ok && a.ContextID == "tab" {
			last = a
			seq = append(seq, string(a.State)+"@"+itoa(a.Epoch))
		}
		if _, ok := f.(*protocol.Command); ok {
			seq = append(seq, "command")
		}
	}
	require.NotNil(t, last)
	t.Logf("assignment frames about the context: %v", seq)
	require.Equal(t, cur.Epoch, last.Epoch, "the client heard %v: the old lease's end after the new lease's assignment", seq)
	require.Equal(t, protocol.AssignmentAssigned, last.State, "the client heard %v", seq)
	require.Equal(t, []string{"assigned@" + itoa(old.Epoch), "command", "context_gone@" + itoa(old.Epoch),
		"assigned@" + itoa(cur.Epoch)}, seq, "in the order it happened")
}

// TestTerminalWriteFails: the database stops answering (another connection
// holds SQLite's write lock) after a command was dispatched and before its
// client answers. Invariant 8 says a send_and_wait that returns completed
// has its terminal message in history already, so the caller must be told
// store_unavailable instead; acquires are refused while the database is
// away; and once it answers again, the end that could not be written is
// written, without a restart: history shows the result.
func TestTerminalWriteFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := historytest.NewSQLite(t, historytest.BusyTimeout(200*time.Millisecond))
	reg, err := registry.New(ctx, registry.Config{Store: store})
	require.NoError(t, err)
	defer reg.Close()
	conn := &commandConn{cmds: make(chan *protocol.Command, 4)}
	att := reg.Connect(registry.ClientInfo{UserID: "usr_term", ClientID: "c", Type: cheetah.Console}, conn)
	reg.Report(att, []protocol.ContextReport{worker1("tab"), worker1("tab2")})
	l, err := reg.Acquire(ctx, cheetah.AcquireRequest{UserID: "usr_term", TaskID: "t", ClientType: cheetah.Console})
	require.NoError(t, err)

	type answer struct {
		res cheetah.Resolution
		err error
	}
	answers := make(chan answer, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		res, err := reg.SendAndWait(wctx, l, cheetah.Command{Name: "echo"}, cheetah.SendOptions{})
		answers <- answer{res, err}
	}()
	cmd := <-conn.cmds
	// Dispatch overlaps the record's commit: the outage starts once the
	// record is durable, so that only the end meets it.
	require.Eventually(t, func() bool {
		_, err := store.Get(ctx, "usr_term", cmd.CommandID)
		return err == nil
	}, 10*time.Second, time.Millisecond)
	restore := historytest.Outage(t, store)
	reg.ClientMessage(ctx, att, &protocol.Result{CommandID: cmd.CommandID, Data: []byte(`{"echo":1}`)})
	a := <-answers
	require.ErrorIs(t, a.err, cheetah.ErrStoreUnavailable, "the caller is told the truth, not %+v", a.res)
	require.NotErrorIs(t, a.err, context.DeadlineExceeded, "the waiter hung")

	_, err = reg.Acquire(ctx, cheetah.AcquireRequest{UserID: "usr_term", TaskID: "t2", ClientType: cheetah.Console})
	require.ErrorIs(t, err, cheetah.ErrStoreUnavailable, "an acquire while the database is away")

	restore()
	require.Eventually(t, func() bool { return store.Health() == nil }, 30*time.Second, 10*time.Millisecond)
	rec, err := store.Get(ctx, "usr_term", cmd.CommandID)
	require.NoError(t, err)
	require.Equal(t, cheetah.StatusCompleted, rec.Status, "the end held through the outage was written")
	require.NotEmpty(t, rec.Messages)
	last := rec.Messages[len(rec.Messages)-1]
	require.Equal(t, cheetah.KindResult, last.Kind)
	require.JSONEq(t, `{"echo":1}`, string(last.Data))

	// The broker serves again: a second acquire, and a send on the first
	// lease, which survived.
	l2, err := reg.Acquire(ctx, cheetah.AcquireRequest{UserID: "usr_term", TaskID: "t2", ClientType: cheetah.Console})
	require.NoError(t, err)
	go func() {
		res, err := reg.SendAndWait(ctx, l, cheetah.Command{Name: "echo"}, cheetah.SendOptions{})
		answers <- answer{res, err}
	}()
	cmd = <-conn.cmds
	reg.ClientMessage(ctx, att, &protocol.Result{CommandID: cmd.CommandID, Data: []byte(`{}`)})
	a = <-answers
	require.NoError(t, a.err)
	require.Equal(t, cheetah.StatusCompleted, a.res.Status)
	for _, h := range []cheetah.Lease{l, l2} {
		ok, err := reg.Release(ctx, h)
		require.NoError(t, err)
		require.True(t, ok)
	}
}

// commandConn hands each command frame it is sent to the test.
type commandConn struct{ cmds chan *protocol.Command }

func (c *commandConn) Send(f protocol.Frame) bool {
	if cmd, ok := f.(*protocol.Command); ok {
		c.cmds <- cmd
	}
	return true
}
func (c *commandConn) Close(protocol.CloseCode, string) {}

func itoa(n int64) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for n > 0 {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
	}
	return string(b)
}

// TestTerminalWriteFailsOverHTTP is TestTerminalWriteFails through the HTTP
// API and the remote SDK: a send_and_wait whose end could not be recorded
// must reach an HTTP caller as store_unavailable, and the remote SDK must
// return that error, not a resolution.
func TestTerminalWriteFailsOverHTTP(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base := historytest.NewSQLite(t)
	store := &faultyStore{Store: base}
	// The record goes to the store alone (no insert delay): held back, it
	// would share the terminal's write, fail with it, and the wait would
	// be answered 503 before its early header.
	reg, err := registry.New(ctx, registry.Config{Store: store, InsertDelay: -1})
	require.NoError(t, err)
	keys := auth.New(base, adminKey, time.Now)
	srv, err := server.New(server.Config{Registry: reg, Store: base, Keys: keys})
	require.NoError(t, err)
	hs := rig.ServeInProcess(t, srv, reg)
	api := rig.NewAPI(hs.URL)
	defer api.HC.CloseIdleConnections()
	app := api.MakeKey(t, adminKey, "app", "")
	fc := &rig.FakeClient{URL: hs.URL, Key: api.MakeKey(t, adminKey, "client", "usr_http"), UserID: "usr_http", ClientID: "c", Check: rig.NewChecker()}
	require.NoError(t, fc.Connect(ctx))
	defer fc.Close()
	require.NoError(t, fc.Report(rig.Worker("tab")))
	lease, ans := api.Acquire(ctx, app, map[string]any{"user_id": "usr_http", "task_id": "t", "client_type": "console"})
	require.Equal(t, 201, ans.Status, ans.String())
	store.mu.Lock()
	store.failTerminal = true
	store.mu.Unlock()

	_, _, raw := api.SendAndWait(ctx, app, lease.LeaseToken, map[string]any{"name": "echo"})
	require.NoError(t, raw.Err)
	mgr := remote.New(hs.URL, app)
	h, err := mgr.Acquire(ctx, cheetah.AcquireRequest{UserID: "usr_http", TaskID: "t2", ClientType: cheetah.Console})
	if err != nil {
		// The raw request still holds the only context: give it back.
		api.Do(ctx, "POST", "/api/v1/lease/release", app, nil, "X-Lease", lease.LeaseToken)
		h, err = mgr.Acquire(ctx, cheetah.AcquireRequest{UserID: "usr_http", TaskID: "t2", ClientType: cheetah.Console})
	}
	require.NoError(t, err)
	res, sdkErr := h.SendAndWait(ctx, cheetah.Command{Name: "echo"})
	t.Logf("raw HTTP: %s; remote SDK: %+v, %v", raw, res, sdkErr)
	// 200 and X-Command-Id went out at admission, so the later error is the
	// body (behaviour.md, "A wait's late error").
	require.Equal(t, 200, raw.Status)
	require.Equal(t, cheetah.CodeStoreUnavailable, raw.Code())
	require.NotEmpty(t, raw.Header.Get("X-Command-Id"))
	require.ErrorIs(t, sdkErr, cheetah.ErrStoreUnavailable)
	require.Empty(t, res.Status, "no resolution beside the error")
}
