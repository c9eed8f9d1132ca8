package history_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/history/historytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSQLite(t *testing.T) {
	t.Parallel()
	historytest.Run(t, func(t *testing.T) *history.Store { return historytest.NewSQLite(t) })
}

func TestSQLiteOutage(t *testing.T) {
	t.Parallel()
	historytest.RunOutage(t, func(t *testing.T) *history.Store {
		return historytest.NewSQLite(t, historytest.BusyTimeout(200*time.Millisecond))
	})
}

func TestPostgresOutage(t *testing.T) {
	t.Parallel()
	historytest.RunOutage(t, func(t *testing.T) *history.Store { return historytest.NewPostgres(t) })
}

func TestPostgres(t *testing.T) {
	t.Parallel()
	historytest.Run(t, func(t *testing.T) *history.Store { return historytest.NewPostgres(t) })
}

func TestOpenDefaultsToSQLiteInDataDir(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	s, err := history.Open(t.Context(), history.Config{DataDir: dir})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	require.Equal(t, history.DialectSQLite, s.Dialect())
	require.NoError(t, s.Ping(t.Context()))

	info, err := os.Stat(dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), info.Mode().Perm())
	require.FileExists(t, filepath.Join(dir, "cheetah.db"))
	require.FileExists(t, filepath.Join(dir, "cheetah.db-migrate.lock"))

	// The pragmas the durability promise rests on are in force.
	db, err := sql.Open("sqlite", filepath.Join(dir, "cheetah.db"))
	require.NoError(t, err)
	defer db.Close()
	var mode string
	require.NoError(t, db.QueryRow("PRAGMA journal_mode").Scan(&mode))
	require.Equal(t, "wal", mode)
}

func TestOpenFileURL(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "other.db")
	s, err := history.Open(t.Context(), history.Config{DatabaseURL: "file:" + path, DataDir: t.TempDir()})
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.FileExists(t, path)
}

func TestOpenRefusesUnknownURL(t *testing.T) {
	t.Parallel()
	_, err := history.Open(t.Context(), history.Config{DatabaseURL: "mysql://root:secret@db/x", DataDir: t.TempDir()})
	require.ErrorIs(t, err, cheetah.ErrInvalidRequest)
	require.NotContains(t, err.Error(), "secret", "a URL's password is never repeated")
}

func TestOpenUnreachablePostgres(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := history.Open(ctx, history.Config{DatabaseURL: "postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=2", DataDir: t.TempDir()})
	require.ErrorIs(t, err, cheetah.ErrStoreUnavailable)
}

// TestPostgresGoesAway drops the database under an open store: reads and
// writes then fail as store_unavailable, the broker's 503, not as bad input.
func TestPostgresGoesAway(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := historytest.NewPostgres(t)
	var name string
	require.NoError(t, historytest.DB(t, s).QueryRowContext(ctx, "SELECT current_database()").Scan(&name))
	admin, err := sql.Open("pgx", historytest.ServerURL())
	require.NoError(t, err)
	defer admin.Close()
	_, err = admin.ExecContext(ctx, "DROP DATABASE "+name+" WITH (FORCE)")
	require.NoError(t, err)

	rec := cheetah.CommandRecord{CommandID: uuid.Must(uuid.NewV7()).String(), UserID: "usr_1111", ResponseMode: cheetah.ModeRPC}
	err = s.Write(ctx, history.InsertCommand{Rec: rec})
	require.ErrorIs(t, err, cheetah.ErrStoreUnavailable)
	_, err = s.Get(ctx, rec.UserID, rec.CommandID)
	require.ErrorIs(t, err, cheetah.ErrStoreUnavailable)
	require.ErrorIs(t, s.Ping(ctx), cheetah.ErrStoreUnavailable)
}

// TestConcurrentOpen opens several stores on one new PostgreSQL database at
// once, as replicas starting together would: the migration lock lets exactly
// one migrate and the others find the schema ready.
func TestConcurrentOpen(t *testing.T) {
	t.Parallel()
	for name, newURL := range map[string]func(*testing.T) string{
		"postgres": func(t *testing.T) string { return historytest.EmptyPostgres(t) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			url := newURL(t)
			const n = 4
			stores := make([]*history.Store, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					stores[i], errs[i] = history.Open(t.Context(), history.Config{DatabaseURL: url, DataDir: t.TempDir()})
				})
			}
			wg.Wait()
			for i := range n {
				if stores[i] != nil {
					t.Cleanup(func() { require.NoError(t, stores[i].Close()) })
				}
			}
			for i := range n {
				require.NoError(t, errs[i])
			}
			// Each store works and sees the others' writes.
			for i, s := range stores {
				rec := cheetah.CommandRecord{CommandID: uuid.Must(uuid.NewV7()).String(), UserID: "usr_1111", ResponseMode: cheetah.ModeRPC}
				require.NoError(t, s.Write(t.Context(), history.InsertCommand{Rec: rec}), "store %d", i)
				_, err := stores[(i+1)%n].Get(t.Context(), rec.UserID, rec.CommandID)
				require.NoError(t, err)
			}
		})
	}
}

// TestConcurrentOpenSQLite: SQLite is single-node, so of several stores
// opened on one new file at once exactly one opens, and the others are
// refused by its lock; migrations run beside them (`cheetah migrate`) wait
// for the migration lock and all succeed.
func TestConcurrentOpenSQLite(t *testing.T) {
	t.Parallel()
	url := "sqlite://" + filepath.Join(t.TempDir(), "shared.db")
	const n = 4
	stores := make([]*history.Store, n)
	errs := make([]error, 2*n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			stores[i], errs[i] = history.Open(t.Context(), history.Config{DatabaseURL: url, DataDir: t.TempDir()})
		})
		wg.Go(func() {
			_, errs[n+i] = history.Migrate(t.Context(), history.Config{DatabaseURL: url, DataDir: t.TempDir()})
		})
	}
	wg.Wait()
	opened := 0
	for i := range n {
		if stores[i] != nil {
			opened++
			t.Cleanup(func() { require.NoError(t, stores[i].Close()) })
			continue
		}
		require.ErrorIs(t, errs[i], history.ErrDataDirInUse)
	}
	require.Equal(t, 1, opened)
	for i := n; i < 2*n; i++ {
		require.NoError(t, errs[i])
	}
}

// BenchmarkGroupCommit measures what a busy broker does: many callers each
// admitting a command and recording a message, each waiting for durability.
func BenchmarkGroupCommit(b *testing.B) {
	for name, open := range map[string]func(testing.TB, ...historytest.Option) *history.Store{
		"sqlite":   historytest.NewSQLite,
		"postgres": historytest.NewPostgres,
	} {
		b.Run(name, func(b *testing.B) {
			s := open(b)
			ctx := b.Context()
			before := s.Stats()
			b.SetParallelism(16) // 16 callers per CPU
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					id := uuid.Must(uuid.NewV7()).String()
					err := s.Write(ctx,
						history.InsertCommand{Rec: cheetah.CommandRecord{
							CommandID: id, UserID: "usr_1111", ClientID: "ext-1", ContextID: "tab-1", TaskID: "t",
							Name: "navigate", Params: json.RawMessage(`{"url":"https://example.com/"}`),
							ResponseMode: cheetah.ModeRPC, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736",
						}},
						history.AppendMessage{CommandID: id, Msg: cheetah.Message{Kind: cheetah.KindAck}},
					)
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			st := s.Stats()
			if batches := st.Batches - before.Batches; batches > 0 {
				b.ReportMetric(float64(st.Ops-before.Ops)/float64(batches), "ops/commit")
			}
		})
	}
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	cfg := history.Config{DatabaseURL: "sqlite://" + filepath.Join(t.TempDir(), "m.db"), DataDir: t.TempDir()}
	st, err := history.MigrationStatus(t.Context(), cfg)
	require.NoError(t, err)
	require.False(t, st[0].Applied)
	st, err = history.Migrate(t.Context(), cfg)
	require.NoError(t, err)
	for _, v := range st {
		require.True(t, v.Applied, v.Name)
	}
	s, err := history.Open(t.Context(), cfg)
	require.NoError(t, err)
	require.NoError(t, s.Close())
}

// What an outage holds is bounded: past MaxHeldBytes the newest writes are
// dropped and counted, and what was held before them still lands in order.
func TestHeldBound(t *testing.T) {
	t.Parallel()
	for name, open := range map[string]func(testing.TB, ...historytest.Option) *history.Store{
		"sqlite":   historytest.NewSQLite,
		"postgres": historytest.NewPostgres,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			// Each progress op counts as 256 bytes plus its data: four fit.
			s := open(t, historytest.BusyTimeout(100*time.Millisecond), historytest.MaxHeldBytes(4*300))
			rec := cheetah.CommandRecord{CommandID: uuid.Must(uuid.NewV7()).String(), UserID: "usr_1111", ClientID: "c",
				ContextID: "x", TaskID: "t", Epoch: 1, Name: "echo", ResponseMode: cheetah.ModeAsync, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736"}
			require.NoError(t, s.Write(ctx, history.InsertCommand{Rec: rec}))

			restore := historytest.Outage(t, s)
			const n = 10
			errs := make(chan error, n)
			for i := range n {
				s.WriteAsync(func(err error) { errs <- err }, history.AppendMessage{CommandID: rec.CommandID,
					Msg: cheetah.Message{Kind: cheetah.KindProgress, Data: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}})
			}
			for range n {
				require.ErrorIs(t, <-errs, cheetah.ErrStoreUnavailable)
			}
			st := s.Stats()
			require.EqualValues(t, 4, st.Held)
			require.EqualValues(t, n-4, st.Dropped)
			restore()
			require.Eventually(t, func() bool { return s.Health() == nil }, 30*time.Second, 10*time.Millisecond)
			got, err := s.Get(ctx, rec.UserID, rec.CommandID)
			require.NoError(t, err)
			require.Len(t, got.Messages, 4)
			for i, m := range got.Messages {
				require.JSONEq(t, fmt.Sprintf(`{"i":%d}`, i), string(m.Data), "the oldest are kept, in order")
			}
		})
	}
}

// Once the bound drops a write, every later one is dropped too until the
// database answers again, however small: a small write kept after a large
// one dropped would leave a hole in the middle of a command's messages and
// number the rest around it. After recovery, holding starts again; and a
// first write too large on its own starts dropping just the same.
func TestHeldBoundKeepsPrefix(t *testing.T) {
	t.Parallel()
	for name, open := range map[string]func(testing.TB, ...historytest.Option) *history.Store{
		"sqlite":   historytest.NewSQLite,
		"postgres": historytest.NewPostgres,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			// A small progress op counts as about 264 bytes: four fit, a
			// large one (1,000 bytes of data) does not fit beside two.
			s := open(t, historytest.BusyTimeout(100*time.Millisecond), historytest.MaxHeldBytes(4*300))
			rec := cheetah.CommandRecord{CommandID: uuid.Must(uuid.NewV7()).String(), UserID: "usr_1111", ClientID: "c",
				ContextID: "x", TaskID: "t", Epoch: 1, Name: "echo", ResponseMode: cheetah.ModeAsync, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736"}
			require.NoError(t, s.Write(ctx, history.InsertCommand{Rec: rec}))
			msg := func(i, pad int) history.AppendMessage {
				return history.AppendMessage{CommandID: rec.CommandID, Msg: cheetah.Message{Kind: cheetah.KindProgress,
					Data: json.RawMessage(fmt.Sprintf(`{"i":%d,"pad":"%s"}`, i, strings.Repeat("x", pad)))}}
			}
			// outage writes the messages with the given padding during an
			// outage, then ends it and waits for the store to recover.
			i := 0
			outage := func(pads ...int) history.Stats {
				restore := historytest.Outage(t, s)
				errs := make(chan error, len(pads))
				for _, pad := range pads {
					s.WriteAsync(func(err error) { errs <- err }, msg(i, pad))
					i++
				}
				for range pads {
					require.ErrorIs(t, <-errs, cheetah.ErrStoreUnavailable)
				}
				st := s.Stats()
				restore()
				require.Eventually(t, func() bool { return s.Health() == nil }, 30*time.Second, 10*time.Millisecond)
				return st
			}
			seen := func() []int {
				got, err := s.Get(ctx, rec.UserID, rec.CommandID)
				require.NoError(t, err)
				var is []int
				for k, m := range got.Messages {
					require.EqualValues(t, k+1, m.Seq)
					var v struct{ I int }
					require.NoError(t, json.Unmarshal(m.Data, &v))
					is = append(is, v.I)
				}
				return is
			}

			// Two small held, one large dropped, then two small: dropped too.
			st := outage(0, 0, 1000, 0, 0)
			require.EqualValues(t, 2, st.Held)
			require.EqualValues(t, 3, st.Dropped)
			require.Equal(t, []int{0, 1}, seen(), "what was written is a prefix of what was enqueued")

			// The outage is over: the next one holds again.
			outage(0, 0)
			require.Equal(t, []int{0, 1, 5, 6}, seen())

			// A first write too large alone: nothing is held, and the small
			// one after it is dropped as well.
			st = outage(2000, 0)
			require.EqualValues(t, 5, st.Dropped)
			require.Equal(t, []int{0, 1, 5, 6}, seen())

			// And that outage's dropping ended with it.
			outage(0)
			require.Equal(t, []int{0, 1, 5, 6, 9}, seen())
		})
	}
}

// A SQLite database belongs to one store at a time: a second Open on the
// same data directory is refused, naming the first (pid, host, holder),
// until the first closes.
func TestSQLiteDataDirLock(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := history.Config{DataDir: dir, Holder: "a broker listening on 127.0.0.1:8420"}
	first, err := history.Open(t.Context(), cfg)
	require.NoError(t, err)
	closed := false
	t.Cleanup(func() {
		if !closed {
			require.NoError(t, first.Close())
		}
	})

	_, err = history.Open(t.Context(), history.Config{DataDir: dir, Holder: "another"})
	require.ErrorIs(t, err, history.ErrDataDirInUse)
	require.NotErrorIs(t, err, cheetah.ErrStoreUnavailable, "not an outage to wait out")
	host, _ := os.Hostname()
	require.Contains(t, err.Error(), fmt.Sprintf("pid %d on host %s, a broker listening on 127.0.0.1:8420", os.Getpid(), host))
	require.Contains(t, err.Error(), filepath.Join(dir, "cheetah.db.lock"))
	// The same file named by URL is the same database.
	_, err = history.Open(t.Context(), history.Config{DatabaseURL: "sqlite://" + filepath.Join(dir, "cheetah.db"), DataDir: t.TempDir()})
	require.ErrorIs(t, err, history.ErrDataDirInUse)
	require.NoError(t, first.Ping(t.Context()), "the refused opens left the first store alone")

	require.NoError(t, first.Close())
	closed = true
	second, err := history.Open(t.Context(), history.Config{DataDir: dir})
	require.NoError(t, err)
	require.NoError(t, second.Close())
}

// PostgreSQL needs no data directory: Open does not create one.
func TestPostgresMakesNoDataDir(t *testing.T) {
	t.Parallel()
	url := historytest.EmptyPostgres(t)
	dir := filepath.Join(t.TempDir(), "data")
	s, err := history.Open(t.Context(), history.Config{DatabaseURL: url, DataDir: dir})
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.NoDirExists(t, dir)
}
