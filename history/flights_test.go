package history_test

import (
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/history/historytest"
)

// flightSetup is a PostgreSQL store whose writer has one batch in flight,
// held in the air: its status change for command x waits on a row lock the
// test holds, until release. The lock is the one an UPDATE takes, so a
// message for x alone would not wait for it (its foreign key shares the
// row).
type flightSetup struct {
	s       *history.Store
	db      *sql.DB
	x       string
	first   chan error    // the held batch's outcome
	heard   chan struct{} // closed once the held batch's caller is told, before any later caller
	release func()
}

// waitingOnLock is the sessions of the test's database waiting for a row
// lock: the held batch's, once it reached the locked row.
const waitingOnLock = `FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid
	WHERE a.datname = current_database() AND l.locktype = 'transactionid' AND NOT l.granted`

func setupFlight(t *testing.T) *flightSetup {
	t.Helper()
	ctx := t.Context()
	s := historytest.NewPostgres(t)
	db := historytest.DB(t, s)
	x := insertCommand(t, s)

	lock, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = lock.ExecContext(ctx, "SELECT 1 FROM commands WHERE command_id = $1 FOR NO KEY UPDATE", x)
	require.NoError(t, err)
	var once sync.Once
	release := func() { once.Do(func() { require.NoError(t, lock.Rollback()) }) }
	t.Cleanup(release)

	first, heard := make(chan error, 1), make(chan struct{})
	s.WriteAsync(func(err error) { first <- err; close(heard) },
		history.SetStatus{CommandID: x, Status: cheetah.StatusDispatched},
		message(x, "first"))
	require.Eventually(t, func() bool {
		var waiting int
		err := db.QueryRowContext(ctx, "SELECT count(*) "+waitingOnLock).Scan(&waiting)
		return err == nil && waiting == 1
	}, 10*time.Second, 5*time.Millisecond, "the batch did not reach the locked row")
	return &flightSetup{s: s, db: db, x: x, first: first, heard: heard, release: release}
}

func insertCommand(t *testing.T, s *history.Store) string {
	t.Helper()
	id := uuid.Must(uuid.NewV7()).String()
	require.NoError(t, s.Write(t.Context(), history.InsertCommand{Rec: cheetah.CommandRecord{
		CommandID: id, UserID: "usr_1111", ClientID: "ext-1", ContextID: "tab-1", TaskID: "t", Name: "navigate",
		Params: json.RawMessage(`{}`), ResponseMode: cheetah.ModeRPC, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", CreatedAt: time.Now(),
	}}))
	return id
}

func message(id, text string) history.AppendMessage {
	return history.AppendMessage{CommandID: id, Msg: cheetah.Message{Kind: cheetah.KindProgress, Data: json.RawMessage(fmt.Sprintf("%q", text))}}
}

// requireHeldBatchFirst checks that x holds the held batch's status and
// message, and then the message "second", numbered in that order.
func (f *flightSetup) requireHeldBatchFirst(t *testing.T) {
	t.Helper()
	rec, err := f.s.Get(t.Context(), "usr_1111", f.x)
	require.NoError(t, err)
	require.Equal(t, cheetah.StatusDispatched, rec.Status)
	require.Len(t, rec.Messages, 2)
	for i, want := range []string{`"first"`, `"second"`} {
		require.Equal(t, int64(i+1), rec.Messages[i].Seq)
		require.JSONEq(t, want, string(rec.Messages[i].Data), "message %d", i+1)
	}
}

// TestPostgresFlights: while a batch is in flight, a batch of other
// commands is written beside it, and one that shares a command with it
// waits for it, so the command's writes keep their order.
func TestPostgresFlights(t *testing.T) {
	t.Parallel()
	f := setupFlight(t)
	ctx := t.Context()
	before := f.s.Stats().Overlapped

	y := insertCommand(t, f.s) // would wait for the held batch if written after it
	require.Empty(t, f.first, "the held batch landed before the row was released")
	require.Greater(t, f.s.Stats().Overlapped, before)

	second := make(chan error, 1)
	f.s.WriteAsync(func(err error) { second <- err }, message(f.x, "second"))
	// Written beside the held batch, the message would be x's first.
	require.Never(t, func() bool { return len(second) > 0 }, 300*time.Millisecond, 10*time.Millisecond,
		"a write of x overtook the batch in flight")
	f.release()
	require.NoError(t, <-f.first)
	require.NoError(t, <-second)

	f.requireHeldBatchFirst(t)
	_, err := f.s.Get(ctx, "usr_1111", y)
	require.NoError(t, err)
}

// TestPostgresOrderedWritesWaitForFlights: a Write with no ops, and a
// write of a lease row, wait for every batch in flight, whatever commands
// they touch.
func TestPostgresOrderedWritesWaitForFlights(t *testing.T) {
	t.Parallel()
	f := setupFlight(t)
	ctx := t.Context()

	// Each notes, as its Write returns, whether the held batch's caller
	// had been told by then.
	var mu sync.Mutex
	returned := map[string]bool{}
	note := func(what string) {
		told := false
		select {
		case <-f.heard:
			told = true
		default:
		}
		mu.Lock()
		defer mu.Unlock()
		returned[what] = told
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		require.NoError(t, f.s.Write(ctx))
		note("barrier")
	})
	wg.Go(func() {
		require.NoError(t, f.s.Write(ctx, history.PutLease{
			Kind: history.LeaseNew, TokenDigest: sha256.Sum256([]byte("token")), UserID: "usr_1111", ClientID: "ext-1",
			ContextID: "tab-2", TaskID: "t", Epoch: 1, TTL: time.Minute, ExpiresAt: time.Now().Add(time.Minute),
		}))
		note("lease")
	})
	// Either would be written at once if it flew beside the held batch.
	require.Never(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(returned) > 0
	}, 300*time.Millisecond, 10*time.Millisecond, "an ordered write overtook the batch in flight")
	f.release()
	require.NoError(t, <-f.first)
	wg.Wait()
	require.Equal(t, map[string]bool{"barrier": true, "lease": true}, returned,
		"whether the held batch's caller was told before each returned")
}

// TestPostgresFailedFlightKeepsItsPlace: a batch in flight that fails
// because the database did not answer is held, and a later write of the
// same command, which waited for it to land, goes after it once it is
// written, never beside it: the command's messages keep their order.
func TestPostgresFailedFlightKeepsItsPlace(t *testing.T) {
	t.Parallel()
	f := setupFlight(t)
	ctx := t.Context()

	second := make(chan error, 1)
	f.s.WriteAsync(func(err error) { second <- err }, message(f.x, "second"))
	// The held batch's session goes away: its batch fails and is held.
	_, err := f.db.ExecContext(ctx, "SELECT pg_terminate_backend(l.pid) "+waitingOnLock)
	require.NoError(t, err)
	require.ErrorIs(t, <-f.first, cheetah.ErrStoreUnavailable)
	f.release()
	require.NoError(t, <-second)

	require.Eventually(t, func() bool { return f.s.Stats().Held == 0 && f.s.Health() == nil }, 10*time.Second, 10*time.Millisecond)
	f.requireHeldBatchFirst(t)
}

// TestPostgresFlightTellsItsCallers: a batch in flight that the database
// answered tells its own callers, so a caller that takes its time to hear
// one batch's outcome does not hold up the callers of the batch beside it
// (which the writer goroutine would, telling them one batch after the
// other).
func TestPostgresFlightTellsItsCallers(t *testing.T) {
	t.Parallel()
	s := historytest.NewPostgres(t)
	x, y := insertCommand(t, s), insertCommand(t, s)

	hearing, slow := make(chan struct{}), make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(slow) }) }) // before the store closes
	s.WriteAsync(func(err error) {
		close(hearing)
		<-slow
	}, message(x, "slow"))
	select {
	case <-hearing:
	case <-time.After(10 * time.Second):
		t.Fatal("the first batch was never told")
	}

	told := make(chan error, 1)
	s.WriteAsync(func(err error) { told <- err }, message(y, "beside"))
	select {
	case err := <-told:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("a batch's callers waited for another batch's caller")
	}
	once.Do(func() { close(slow) })
	require.NoError(t, s.Write(t.Context())) // everything before it landed
}
