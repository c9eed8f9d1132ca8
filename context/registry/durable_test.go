package registry_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/protocol"
)

// Dispatch overlaps the record's commit (invariant 9); what the caller is
// told waits for it. These tests read the store right after the registry
// answers, on a real SQLite file and on PostgreSQL.

var dialects = []struct {
	name string
	open func(testing.TB, ...historytest.Option) *history.Store
}{
	{"sqlite", historytest.NewSQLite},
	{"postgres", historytest.NewPostgres},
}

// setupOn is setup over store.
func setupOn(t *testing.T, store registry.Store, base *history.Store, tweak ...func(*registry.Config)) *env {
	t.Helper()
	e := setup(t, append([]func(*registry.Config){func(c *registry.Config) { c.Store = store }}, tweak...)...)
	e.store = base
	return e
}

// answering is a client connection that answers every command frame with
// an ack and a result, on a goroutine of its own, as soon as it is sent.
type answering struct {
	*fakeConn
	cmds chan *protocol.Command
}

func newAnswering() *answering {
	return &answering{fakeConn: newFakeConn(), cmds: make(chan *protocol.Command, 64)}
}

func (a *answering) Send(f protocol.Frame) bool {
	if !a.fakeConn.Send(f) {
		return false
	}
	if cmd, ok := f.(*protocol.Command); ok {
		a.cmds <- cmd
	}
	return true
}

// serve answers the commands sent to a until ctx ends.
func (a *answering) serve(ctx context.Context, reg *registry.Registry, att *registry.Attachment) {
	for {
		select {
		case cmd := <-a.cmds:
			reg.ClientMessage(ctx, att, &protocol.Ack{CommandID: cmd.CommandID})
			reg.ClientMessage(ctx, att, &protocol.Result{CommandID: cmd.CommandID, Data: []byte(`{"echo":true}`)})
		case <-ctx.Done():
			return
		}
	}
}

// connectAnswering connects a console client with one worker context whose
// connection answers every command at once.
func (e *env) connectAnswering(t *testing.T) {
	t.Helper()
	conn := newAnswering()
	att := e.reg.Connect(registry.ClientInfo{UserID: user, ClientID: "answering", Type: cheetah.Console, KeyID: "k1"}, conn)
	e.reg.Report(att, []protocol.ContextReport{worker("w1")})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		conn.serve(ctx, e.reg, att)
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// Send answers only once its record is durable: the id it returns reads
// back from the store at once, and while the store holds the record's
// commit back, Send waits although the command is dispatched already.
func TestSendIDDurableWhenReturned(t *testing.T) {
	t.Parallel()
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			base := d.open(t)
			hs := &historytest.Holding{Store: base}
			e := setupOn(t, hs, base)
			c := e.connect("a", cheetah.Console, nil, worker("w1"))
			l := e.mustAcquire("t")
			ctx := context.Background()
			for range 20 {
				s, err := e.reg.Send(ctx, l, cheetah.Command{Name: "n"}, cheetah.SendOptions{})
				require.NoError(t, err)
				rec, err := base.Get(ctx, user, s.CommandID)
				require.NoError(t, err, "the id returned reads back")
				require.Equal(t, cheetah.StatusDispatched, rec.Status)
				require.NotNil(t, rec.DispatchedAt)
			}

			hs.SetHold(true)
			sent := make(chan error, 1)
			go func() {
				_, err := e.reg.Send(ctx, l, cheetah.Command{Name: "held"}, cheetah.SendOptions{})
				sent <- err
			}()
			f := cmdFrame(t, c, 21)
			require.Equal(t, "held", f.Name, "dispatched before the record's commit came back")
			select {
			case err := <-sent:
				t.Fatalf("Send answered (%v) before its record's commit came back", err)
			case <-time.After(50 * time.Millisecond):
			}
			require.NoError(t, base.Write(ctx))
			hs.Release()
			require.NoError(t, <-sent)
		})
	}
}

// OnAdmitted (the HTTP wait's early header) fires only once the record is
// durable; SendAndWait returns once the record and the terminal message
// both are (invariants 8 and 9).
func TestOnAdmittedAndResolutionWaitForDurability(t *testing.T) {
	t.Parallel()
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			base := d.open(t)
			hs := &historytest.Holding{Store: base}
			e := setupOn(t, hs, base)
			c := e.connect("a", cheetah.Console, nil, worker("w1"))
			l := e.mustAcquire("t")
			ctx := context.Background()

			hs.SetHold(true)
			admitted := make(chan error, 1)
			done := make(chan waited, 1)
			go func() {
				res, err := e.reg.SendAndWait(ctx, l, cheetah.Command{Name: "n"}, cheetah.SendOptions{
					OnAdmitted: func(s cheetah.Sent) {
						_, err := base.Get(ctx, user, s.CommandID)
						admitted <- err
					}})
				done <- waited{res, err}
			}()
			f := cmdFrame(t, c, 1)
			e.reg.ClientMessage(ctx, c.att, &protocol.Ack{CommandID: f.CommandID})
			e.result(c, f.CommandID, `{"ok":1}`)
			select {
			case <-admitted:
				t.Fatal("OnAdmitted fired before the record's commit came back")
			case w := <-done:
				t.Fatalf("SendAndWait answered %+v before the commit came back", w)
			case <-time.After(50 * time.Millisecond):
			}
			require.NoError(t, base.Write(ctx))
			hs.Release()
			require.NoError(t, <-admitted, "the record reads back inside OnAdmitted")
			w := receive(t, done)
			require.NoError(t, w.err)
			require.Equal(t, cheetah.StatusCompleted, w.res.Status)

			// Without holding: every return reads back its record and its
			// terminal message.
			e.connectAnswering(t)
			l2 := e.mustAcquire("t2", func(r *cheetah.AcquireRequest) { r.ClientID = "answering" })
			for range 20 {
				var seen string
				res, err := e.reg.SendAndWait(ctx, l2, cheetah.Command{Name: "echo"}, cheetah.SendOptions{
					OnAdmitted: func(s cheetah.Sent) {
						if _, err := base.Get(ctx, user, s.CommandID); err != nil {
							seen = err.Error()
						}
					}})
				require.NoError(t, err)
				require.Empty(t, seen, "OnAdmitted before the record was durable")
				require.Equal(t, cheetah.StatusCompleted, res.Status)
				rec, err := base.Get(ctx, user, res.CommandID)
				require.NoError(t, err)
				require.Equal(t, cheetah.StatusCompleted, rec.Status)
				require.Len(t, rec.Messages, 2)
				require.Equal(t, cheetah.KindResult, rec.Messages[1].Kind)
				require.NotNil(t, rec.DispatchedAt)
				require.NotNil(t, rec.AckedAt)
			}
		})
	}
}

// A client that answers before the record's insert is handed to the store
// makes the insert, the ack and the terminal one commit: with the delay
// long enough to wait for the answer, every round trip costs exactly one
// transaction of the store's writer. With the delay off, it costs more
// (logged: two as a rule, the insert and the end).
func TestFastResultOneCommit(t *testing.T) {
	t.Parallel()
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			for _, delay := range []time.Duration{time.Minute, -1} {
				base := d.open(t)
				e := setupOn(t, base, base, func(c *registry.Config) { c.InsertDelay = delay })
				e.connectAnswering(t)
				l := e.mustAcquire("t")
				ctx := context.Background()
				const n = 20
				before := base.Stats().Batches
				for range n {
					res, err := e.reg.SendAndWait(ctx, l, cheetah.Command{Name: "echo"}, cheetah.SendOptions{})
					require.NoError(t, err)
					require.Equal(t, cheetah.StatusCompleted, res.Status)
				}
				commits := base.Stats().Batches - before
				t.Logf("%s, delay %v: %d commits for %d round trips", d.name, delay, commits, n)
				if delay > 0 {
					require.EqualValues(t, n, commits, "one commit per round trip")
				}
			}
		})
	}
}

// slowCommits is a history store that says its commits take commitTime,
// as a loaded one's do, and records the ops of every WriteAsync call.
type slowCommits struct {
	*history.Store
	commitTime time.Duration
	mu         sync.Mutex
	writes     [][]history.Op
}

func (s *slowCommits) CommitTime() time.Duration { return s.commitTime }

func (s *slowCommits) WriteAsync(done func(error), ops ...history.Op) {
	s.mu.Lock()
	s.writes = append(s.writes, ops)
	s.mu.Unlock()
	s.Store.WriteAsync(done, ops...)
}

// writesOf returns the writes so far that hold an op about command id.
func (s *slowCommits) writesOf(id string) [][]history.Op {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out [][]history.Op
	for _, w := range s.writes {
		for _, op := range w {
			if opCommand(op) == id {
				out = append(out, w)
				break
			}
		}
	}
	return out
}

func opCommand(op history.Op) string {
	switch o := op.(type) {
	case history.InsertCommand:
		return o.Rec.CommandID
	case history.SetStatus:
		return o.CommandID
	case history.AppendMessage:
		return o.CommandID
	}
	return ""
}

// While the store's commits take long (CommitTime), a waited command's
// record is held back about that long, not just InsertDelay: an answer that
// comes well after InsertDelay but within a commit's time still shares the
// record's write, so the command costs the store one write, not two. On a
// slow store the hold ends at MaxInsertDelay, and the record goes alone.
func TestInsertHeldForACommitTime(t *testing.T) {
	t.Parallel()
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			for _, tc := range []struct {
				name     string
				maxDelay time.Duration
				shared   bool
			}{
				{"within a commit's time", time.Hour, true},
				{"past MaxInsertDelay", 20 * time.Millisecond, false},
			} {
				base := d.open(t)
				sc := &slowCommits{Store: base, commitTime: time.Hour}
				e := setupOn(t, sc, base, func(c *registry.Config) {
					c.InsertDelay = time.Millisecond
					c.MaxInsertDelay = tc.maxDelay
				})
				c := e.connect("a", cheetah.Console, nil, worker("w1"))
				l := e.mustAcquire("t")
				type answer struct {
					res cheetah.Resolution
					err error
				}
				waited := make(chan answer, 1)
				go func() {
					res, err := e.reg.SendAndWait(ctx, l, cheetah.Command{Name: "slow"}, cheetah.SendOptions{})
					waited <- answer{res, err}
				}()
				f := cmdFrame(t, c, 1)
				if tc.shared {
					// Fifty times InsertDelay: without the hold on the
					// store's commit time, the record is written by now.
					time.Sleep(50 * time.Millisecond)
					require.Empty(t, sc.writesOf(f.CommandID), "%s: the record is still held", tc.name)
				} else {
					require.Eventually(t, func() bool { _, err := base.Get(ctx, user, f.CommandID); return err == nil },
						10*time.Second, time.Millisecond, "%s: the record is written alone at MaxInsertDelay", tc.name)
				}
				e.reg.ClientMessage(ctx, c.att, &protocol.Ack{CommandID: f.CommandID})
				e.reg.ClientMessage(ctx, c.att, &protocol.Result{CommandID: f.CommandID, Data: []byte(`{"ok":true}`)})
				a := <-waited
				require.NoError(t, a.err)
				require.Equal(t, cheetah.StatusCompleted, a.res.Status)
				writes := sc.writesOf(f.CommandID)
				if tc.shared {
					require.Len(t, writes, 1, "%s: record, ack and result in one write", tc.name)
					w := writes[0]
					_, ok := w[0].(history.InsertCommand)
					require.True(t, ok, "%s: the insert comes first", tc.name)
					end, ok := w[len(w)-1].(history.SetStatus)
					require.True(t, ok, "%s: the terminal status comes last", tc.name)
					require.Equal(t, cheetah.StatusCompleted, end.Status)
				} else {
					require.Greater(t, len(writes), 1, "%s: the record was written before the answer", tc.name)
				}
				rec, err := base.Get(ctx, user, f.CommandID)
				require.NoError(t, err)
				require.Equal(t, cheetah.StatusCompleted, rec.Status)
				require.Len(t, rec.Messages, 2)
			}
		})
	}
}

// insertFailing is a store that fails every write holding a command's
// insert, as a database that went away would, without writing it.
type insertFailing struct {
	*history.Store
	mu   sync.Mutex
	fail bool
}

func (s *insertFailing) WriteAsync(done func(error), ops ...history.Op) {
	s.mu.Lock()
	fail := s.fail
	s.mu.Unlock()
	for _, op := range ops {
		if _, ok := op.(history.InsertCommand); ok && fail {
			if done != nil {
				go done(cheetah.StoreUnavailable("insert failing", errors.New("the database went away")))
			}
			return
		}
	}
	s.Store.WriteAsync(done, ops...)
}

// A record that cannot be written after its command was dispatched: the
// sender is told store_unavailable (never the id), the client is sent a
// cancel for the command it already has, and the registry keeps nothing of
// it. The client's late answer is answered as for an ended command.
func TestInsertFailsAfterDispatch(t *testing.T) {
	t.Parallel()
	base := historytest.NewSQLite(t)
	fs := &insertFailing{Store: base, fail: true}
	e := setupOn(t, fs, base)
	c := e.connect("a", cheetah.Console, nil, worker("w1"))
	l := e.mustAcquire("t")
	ctx := context.Background()

	_, err := e.reg.Send(ctx, l, cheetah.Command{Name: "plain"}, cheetah.SendOptions{})
	require.ErrorIs(t, err, cheetah.ErrStoreUnavailable)
	f := cmdFrame(t, c, 1)
	cancel := waitFor(t, c.conn, func(x *protocol.Cancel) bool { return x.CommandID == f.CommandID })
	require.NotEmpty(t, cancel.Reason)

	res, err := e.reg.SendAndWait(ctx, l, cheetah.Command{Name: "waited"}, cheetah.SendOptions{})
	require.ErrorIs(t, err, cheetah.ErrStoreUnavailable)
	require.Empty(t, res.CommandID, "no id told")
	f = cmdFrame(t, c, 2)
	waitFor(t, c.conn, func(x *protocol.Cancel) bool { return x.CommandID == f.CommandID })
	// The frames in order: command, cancel, command, cancel.
	var kinds []string
	for _, fr := range c.conn.all() {
		switch fr.(type) {
		case *protocol.Command:
			kinds = append(kinds, "command")
		case *protocol.Cancel:
			kinds = append(kinds, "cancel")
		}
	}
	require.Equal(t, []string{"command", "cancel", "command", "cancel"}, kinds)
	require.Eventually(t, func() bool { s := e.reg.Stats(); return s.Commands == 0 && s.Preserving == 0 },
		10*time.Second, time.Millisecond, "nothing kept")

	// The store answers again: the lease serves.
	fs.mu.Lock()
	fs.fail = false
	fs.mu.Unlock()
	s, err := e.reg.Send(ctx, l, cheetah.Command{Name: "again"}, cheetah.SendOptions{})
	require.NoError(t, err)
	_, err = base.Get(ctx, user, s.CommandID)
	require.NoError(t, err)
	ok, err := e.reg.Release(ctx, l)
	require.NoError(t, err)
	require.True(t, ok)
}

// The database stops answering while a command's record is being written,
// after the command was dispatched: the sender is told store_unavailable
// and the client a cancel; the insert and the end are held by the store and
// written once the database answers, so history then shows the command
// cancelled with error store_unavailable (docs/behaviour.md).
func TestInsertDuringOutageShowsCancelledLater(t *testing.T) {
	t.Parallel()
	base := historytest.NewSQLite(t, historytest.BusyTimeout(200*time.Millisecond))
	e := setupOn(t, base, base)
	c := e.connect("a", cheetah.Console, nil, worker("w1"))
	l := e.mustAcquire("t")
	ctx := context.Background()

	restore := historytest.Outage(t, base)
	_, err := e.reg.SendAndWait(ctx, l, cheetah.Command{Name: "unrecorded"}, cheetah.SendOptions{})
	require.ErrorIs(t, err, cheetah.ErrStoreUnavailable)
	f := cmdFrame(t, c, 1)
	waitFor(t, c.conn, func(x *protocol.Cancel) bool { return x.CommandID == f.CommandID })
	// The client answers the cancel as a client does.
	e.reg.ClientMessage(ctx, c.att, &protocol.Error{CommandID: f.CommandID, Code: "cancelled", Message: "stopped"})

	restore()
	var rec cheetah.CommandRecord
	require.Eventually(t, func() bool {
		rec, err = base.Get(ctx, user, f.CommandID)
		return err == nil && rec.Status.Terminal() && len(rec.Messages) == 1
	}, 30*time.Second, 10*time.Millisecond, "the held insert and end are written once the database answers")
	require.Equal(t, cheetah.StatusCancelled, rec.Status)
	require.NotNil(t, rec.Error)
	require.Equal(t, cheetah.CodeStoreUnavailable, rec.Error.Code)
	require.NotNil(t, rec.DispatchedAt)
	require.True(t, rec.Messages[0].Late, "the client's answer after the cancel is late")
	require.Zero(t, e.reg.Stats().Commands)
}

// deleteGated is a store that holds every lease row's deletion (or, with
// holds, every op it names) until gate is closed, says on deleting when
// one comes, and marks committed once the store committed it.
type deleteGated struct {
	*history.Store
	gate      chan struct{}
	deleting  chan struct{}
	committed atomic.Bool
	holds     func(history.Op) bool
}

func (s *deleteGated) WriteAsync(done func(error), ops ...history.Op) {
	for _, op := range ops {
		_, held := op.(history.DeleteLease)
		if s.holds != nil {
			held = s.holds(op)
		}
		if held {
			s.deleting <- struct{}{}
			go func() {
				<-s.gate
				s.Store.WriteAsync(func(err error) {
					s.committed.Store(err == nil)
					if done != nil {
						done(err)
					}
				}, ops...)
			}()
			return
		}
	}
	s.Store.WriteAsync(done, ops...)
}

// With durable leases, a revoke returns once the lease's row is deleted, as
// a release does: a replica that dies right after cannot bring it back.
func TestRevokeAndReleaseWaitForTheRow(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"revoke", "release", "release-all"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			base := historytest.NewSQLite(t)
			gs := &deleteGated{Store: base, gate: make(chan struct{}), deleting: make(chan struct{}, 1)}
			e := setupOn(t, gs, base, func(c *registry.Config) { c.DurableLeases, c.TokenTag = true, "0000abcd" })
			e.connect("a", cheetah.Console, nil, worker("w1"))
			l := e.mustAcquire("t")
			returned := make(chan bool, 1)
			go func() {
				var ok bool
				var err error
				switch end {
				case "revoke":
					ok, err = e.reg.Revoke(context.Background(), user, "a", "w1")
				case "release":
					ok, err = e.reg.Release(context.Background(), l)
				default:
					var n int
					n, err = e.reg.ReleaseAll(context.Background(), []string{l.LeaseToken})
					ok = n == 1
				}
				returned <- err == nil && ok && gs.committed.Load()
			}()
			<-gs.deleting
			close(gs.gate)
			require.True(t, <-returned, "%s returned once its row was deleted", end)
		})
	}
}

// A lease row the registry decided before its replica fenced (Forget) and
// that committed only after is told as it stands: the others may have
// taken the replica's rows over meanwhile (reaped it, or adopted the rows
// it gave up). An end whose row another replica holds by then changed
// nothing, and is store_unavailable; one whose row is gone stands. An
// acquire is store_unavailable: the registry forgot its lease.
func TestLeaseRowCommittedAfterAForget(t *testing.T) {
	t.Parallel()
	for _, op := range []string{"revoke", "release", "release-all", "acquire"} {
		for _, taken := range []bool{false, true} {
			if op == "acquire" && taken {
				continue
			}
			t.Run(fmt.Sprintf("%s, row taken %v", op, taken), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				rs := historytest.Joined(t, historytest.NewPostgres(t), "f0f00001", "f0f00002")
				mine, other := rs[0], rs[1]
				gs := &deleteGated{Store: mine, gate: make(chan struct{}), deleting: make(chan struct{}, 1)}
				if op == "acquire" {
					gs.holds = func(o history.Op) bool { p, ok := o.(history.PutLease); return ok && p.Kind == history.LeaseNew }
				}
				// The rows' expiries are read against the database's clock.
				e := setupOn(t, gs, mine, func(c *registry.Config) {
					c.DurableLeases, c.TokenTag, c.Clock = true, "f0f00001", clockwork.NewFakeClockAt(time.Now())
				})
				e.connect("a", cheetah.Console, nil, worker("w1"))
				var l cheetah.Lease
				if op != "acquire" {
					l = e.mustAcquire("t")
				}
				type answer struct {
					ok  bool
					err error
				}
				answered := make(chan answer, 1)
				go func() {
					var a answer
					switch op {
					case "revoke":
						a.ok, a.err = e.reg.Revoke(ctx, user, "a", "w1")
					case "release":
						a.ok, a.err = e.reg.Release(ctx, l)
					case "release-all":
						var n int
						n, a.err = e.reg.ReleaseAll(ctx, []string{l.LeaseToken})
						a.ok = n == 1
					default:
						_, a.err = e.acquire("t")
						a.ok = a.err == nil
					}
					answered <- a
				}()
				<-gs.deleting
				e.reg.Forget(protocol.CloseGoingAway, "fenced")
				if taken {
					require.NoError(t, mine.AbandonReplica(ctx, "f0f00001", time.Now()))
					rows, err := other.ClaimOrphanedLeases(ctx, user, "a")
					require.NoError(t, err)
					require.Len(t, rows, 1)
				}
				close(gs.gate)
				a := <-answered
				if taken || op == "acquire" {
					require.ErrorIs(t, a.err, cheetah.ErrStoreUnavailable)
					return
				}
				require.NoError(t, a.err)
				require.True(t, a.ok)
				held, err := mine.LeaseRowHeld(ctx, registry.TokenDigest(l.LeaseToken))
				require.NoError(t, err)
				require.False(t, held)
			})
		}
	}
}

// With durable leases, no answer shows a lease, or a lease's end, whose row
// is not committed yet: the other replicas take over from the rows, so a
// replica that died before the commit would leave them without what the
// answer showed (a send told `reassigned` for a lease that no replica
// knows after the death).
func TestAnswersShowOnlyDurableLeaseRows(t *testing.T) {
	t.Parallel()
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			base := d.open(t)
			hs := &historytest.Holding{Store: base}
			e := setupOn(t, hs, base, func(c *registry.Config) { c.DurableLeases = true })
			e.connect("a", cheetah.Console, nil, worker("w1"))
			ctx := context.Background()
			old := e.mustAcquire("old")
			e.revoked(user, "a", "w1")

			type answer struct {
				name string
				err  error
			}
			// held runs every call while the write begun by start has its
			// commit held back, checks that none answers before it comes
			// back, and returns their answers once it did.
			held := func(start func(), calls map[string]func() error) map[string]error {
				t.Helper()
				hs.SetHold(true)
				start()
				require.Eventually(t, func() bool { return hs.Held() == 1 }, 10*time.Second, time.Millisecond)
				answers := make(chan answer, len(calls))
				for name, call := range calls {
					go func() { answers <- answer{name, call()} }()
				}
				select {
				case a := <-answers:
					t.Fatalf("%s answered (%v) while the lease row it shows was not committed", a.name, a.err)
				case <-time.After(50 * time.Millisecond):
				}
				require.Equal(t, 1, hs.Release())
				got := map[string]error{}
				for range calls {
					a := receive(t, answers)
					got[a.name] = a.err
				}
				return got
			}

			// A lease made: its acquire waits for its row, and so does
			// every answer that shows it.
			acquired := make(chan cheetah.Lease, 1)
			got := held(func() {
				go func() {
					l, err := e.acquire("new")
					if err != nil {
						t.Errorf("acquire: %v", err)
					}
					acquired <- l
				}()
			}, map[string]func() error{
				"renew": func() error { _, err := e.reg.Renew(ctx, old, 0); return err },
				"send": func() error {
					_, err := e.reg.Send(ctx, old, cheetah.Command{Name: "n"}, cheetah.SendOptions{})
					return err
				},
				"acquire": func() error { _, err := e.acquire("other"); return err },
			})
			require.Equal(t, cheetah.LostReassigned, lostReason(t, got["renew"]))
			require.Equal(t, cheetah.LostReassigned, lostReason(t, got["send"]))
			require.Equal(t, cheetah.ReasonNoIdleWorker, noContextReason(t, got["acquire"]))
			fresh := receive(t, acquired)

			// A lease ended: its release waits for the row's deletion,
			// and so does every answer that shows the end.
			released := make(chan bool, 1)
			got = held(func() {
				go func() {
					ok, err := e.reg.Release(ctx, fresh)
					released <- ok && err == nil
				}()
			}, map[string]func() error{
				"renew": func() error { _, err := e.reg.Renew(ctx, fresh, 0); return err },
				"release": func() error {
					if ok, err := e.reg.Release(ctx, fresh); ok || err != nil {
						return fmt.Errorf("released %v: %v", ok, err)
					}
					return nil
				},
				"revoke": func() error {
					if ok, err := e.reg.Revoke(ctx, user, "a", "w1"); ok || err != nil {
						return fmt.Errorf("revoked %v: %v", ok, err)
					}
					return nil
				},
			})
			require.Equal(t, cheetah.LostReleased, lostReason(t, got["renew"]))
			require.NoError(t, got["release"])
			require.NoError(t, got["revoke"])
			require.True(t, receive(t, released))
		})
	}
}

// outageStore is a history store whose lease deletions fail as during an
// outage (the store holds them), and whose barrier Write fails while down.
type outageStore struct {
	*history.Store
	down atomic.Bool
}

var errOutage = errors.New("the database does not answer")

func (s *outageStore) WriteAsync(done func(error), ops ...history.Op) {
	for _, op := range ops {
		if _, ok := op.(history.DeleteLease); ok && s.down.Load() {
			done(errOutage)
			return
		}
	}
	s.Store.WriteAsync(done, ops...)
}

func (s *outageStore) Write(ctx context.Context, ops ...history.Op) error {
	if len(ops) == 0 && s.down.Load() {
		return errOutage
	}
	return s.Store.Write(ctx, ops...)
}

// An end whose row did not commit is not shown while the store cannot
// write what it holds: the answers that would show it are
// store_unavailable until it can.
func TestAnswersWaitOutAFailedLeaseRow(t *testing.T) {
	t.Parallel()
	base := historytest.NewSQLite(t)
	st := &outageStore{Store: base}
	e := setupOn(t, st, base, func(c *registry.Config) { c.DurableLeases = true })
	e.connect("a", cheetah.Console, nil, worker("w1"))
	ctx := context.Background()
	l := e.mustAcquire("t")

	st.down.Store(true)
	_, err := e.reg.Release(ctx, l)
	require.ErrorIs(t, err, cheetah.ErrStoreUnavailable, "the release's row did not commit")
	_, err = e.reg.Renew(ctx, l, 0)
	require.ErrorIs(t, err, cheetah.ErrStoreUnavailable, "not lease_lost: the end is not durable")
	ok, err := e.reg.Release(ctx, l)
	require.False(t, ok)
	require.ErrorIs(t, err, cheetah.ErrStoreUnavailable)

	st.down.Store(false)
	_, err = e.reg.Renew(ctx, l, 0)
	require.Equal(t, cheetah.LostReleased, lostReason(t, err), "once the store writes again")
}

// writesGated holds the store's writes, in order, from the first one that
// holds an op matching holds until gate is closed: the registry's flusher
// waits in WriteAsync, so everything decided after queues behind it, as
// behind a slow commit.
type writesGated struct {
	*history.Store
	holds   func(history.Op) bool
	holding chan struct{}
	gate    chan struct{}
}

func (s *writesGated) WriteAsync(done func(error), ops ...history.Op) {
	for _, op := range ops {
		if s.holds(op) {
			s.holding <- struct{}{}
			<-s.gate
			break
		}
	}
	s.Store.WriteAsync(done, ops...)
}

// assignments are the assignment frames c received.
func assignments(c *fakeConn) []*protocol.Assignment {
	var out []*protocol.Assignment
	for _, f := range c.all() {
		if a, ok := f.(*protocol.Assignment); ok {
			out = append(out, a)
		}
	}
	return out
}

// With durable leases a client hears of a lease once its row is durable,
// as the acquire's caller does: a replica that died between the decision
// and the commit would otherwise have shown the client an epoch that no
// other replica knows, above the lease its context carries there (one
// ended here in memory only and adopted back from its row), so the client
// would see epochs go back. A client that reconnects meanwhile is told
// once, then too; a lease that ends before its row is durable is never
// told, nor its end.
func TestAssignedToldOnceTheRowIsDurable(t *testing.T) {
	t.Parallel()
	for _, meanwhile := range []string{"nothing", "reconnect", "context gone"} {
		t.Run(meanwhile, func(t *testing.T) {
			t.Parallel()
			base := historytest.NewSQLite(t)
			gs := &writesGated{Store: base, holding: make(chan struct{}, 1), gate: make(chan struct{}),
				holds: func(o history.Op) bool { p, ok := o.(history.PutLease); return ok && p.Kind == history.LeaseNew }}
			e := setupOn(t, gs, base, func(c *registry.Config) { c.DurableLeases = true })
			open := sync.OnceFunc(func() { close(gs.gate) })
			t.Cleanup(open) // before the registry's Close, which joins its flusher
			c := e.connect("a", cheetah.Console, nil, worker("w1"))
			type answer struct {
				l   cheetah.Lease
				err error
			}
			answered := make(chan answer, 1)
			go func() {
				l, err := e.acquire("t")
				answered <- answer{l, err}
			}()
			<-gs.holding
			switch meanwhile {
			case "reconnect":
				e.reg.Disconnect(c.att)
				c = e.connect("a", cheetah.Console, nil, worker("w1"))
			case "context gone":
				e.reg.Report(c.att, nil)
			}
			require.Empty(t, assignments(c.conn), "told before the row is durable")
			open()
			a := <-answered
			require.NoError(t, a.err)
			told := assignments(c.conn)
			if meanwhile == "context gone" {
				require.Empty(t, told, "a lease never told ends untold")
				return
			}
			require.Len(t, told, 1, "told once, before the acquire answered")
			require.Equal(t, protocol.AssignmentAssigned, told[0].State)
			require.Equal(t, a.l.Epoch, told[0].Epoch)
		})
	}
}
