package migrations_test

import (
	"database/sql"
	"io/fs"
	"path/filepath"
	"sync"
	"testing"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/migrations"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// target is one empty database of a dialect, reachable from several
// connection pools, as from several processes.
type target struct {
	dialect, driver, dsn string
	opts                 []migrations.Option
}

func setup(t *testing.T, dialect string) target {
	t.Helper()
	if dialect == migrations.Postgres {
		return target{dialect: dialect, driver: "pgx", dsn: historytest.EmptyPostgres(t)}
	}
	path := filepath.Join(t.TempDir(), "m.db")
	return target{
		dialect: dialect, driver: "sqlite",
		dsn:  path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)",
		opts: []migrations.Option{migrations.WithLockFile(migrations.LockFileFor(path))},
	}
}

func (tg target) open(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open(tg.driver, tg.dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

var dialects = []string{migrations.Postgres, migrations.SQLite}

// TestConcurrentApply migrates one database from several pools at once:
// all succeed, and each migration is recorded exactly once. "fresh" starts
// from an empty database; "upgrade" from one where goose's version table
// exists already, so that nothing but the lock keeps the migrations from
// running twice (on a fresh database goose's own retry around creating its
// table can hide a missing lock).
func TestConcurrentApply(t *testing.T) {
	t.Parallel()
	for _, d := range dialects {
		for _, upgrade := range []bool{false, true} {
			name := d + "/fresh"
			if upgrade {
				name = d + "/upgrade"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				tg := setup(t, d)
				if upgrade {
					_, err := migrations.Status(t.Context(), tg.open(t), d, tg.opts...)
					require.NoError(t, err)
				}
				const n = 5
				errs := make([]error, n)
				var wg sync.WaitGroup
				for i := range n {
					db := tg.open(t)
					wg.Go(func() { errs[i] = migrations.Apply(t.Context(), db, d, tg.opts...) })
				}
				wg.Wait()
				for _, err := range errs {
					require.NoError(t, err)
				}
				var applied int
				db := tg.open(t)
				require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM goose_db_version WHERE version_id = 1").Scan(&applied))
				require.Equal(t, 1, applied)
				var high int64
				require.NoError(t, db.QueryRow("SELECT high_water FROM epochs WHERE id = 1").Scan(&high))
				require.Zero(t, high, "the epochs row is seeded once")
			})
		}
	}
}

// TestStatus shows what `cheetah migrate` prints: pending before, applied
// after.
func TestStatus(t *testing.T) {
	t.Parallel()
	for _, d := range dialects {
		t.Run(d, func(t *testing.T) {
			t.Parallel()
			tg := setup(t, d)
			db := tg.open(t)
			st, err := migrations.Status(t.Context(), db, d, tg.opts...)
			require.NoError(t, err)
			require.NotEmpty(t, st)
			require.Equal(t, migrations.Version{Version: 1, Name: "00001_init.sql"}, st[0])

			require.NoError(t, migrations.Apply(t.Context(), db, d, tg.opts...))
			require.NoError(t, migrations.Apply(t.Context(), db, d, tg.opts...), "applying again is a no-op")
			st, err = migrations.Status(t.Context(), db, d, tg.opts...)
			require.NoError(t, err)
			for _, v := range st {
				require.True(t, v.Applied, v.Name)
				require.False(t, v.AppliedAt.IsZero())
			}
		})
	}
}

// TestDown checks that every migration's Down section runs, so a release
// can be rolled back by hand.
func TestDown(t *testing.T) {
	t.Parallel()
	for _, d := range dialects {
		t.Run(d, func(t *testing.T) {
			t.Parallel()
			tg := setup(t, d)
			db := tg.open(t)
			require.NoError(t, migrations.Apply(t.Context(), db, d, tg.opts...))
			gd := goose.DialectPostgres
			if d == migrations.SQLite {
				gd = goose.DialectSQLite3
			}
			p, err := goose.NewProvider(gd, db, mustSub(t, d), goose.WithDisableGlobalRegistry(true))
			require.NoError(t, err)
			_, err = p.DownTo(t.Context(), 0)
			require.NoError(t, err)
			_, err = db.Exec("SELECT 1 FROM commands")
			require.Error(t, err, "the tables are gone")
			require.NoError(t, migrations.Apply(t.Context(), db, d, tg.opts...), "and can be made again")
		})
	}
}

func TestUnknownDialect(t *testing.T) {
	t.Parallel()
	err := migrations.Apply(t.Context(), nil, "oracle")
	require.ErrorContains(t, err, "unknown dialect")
}

func mustSub(t *testing.T, dialect string) fs.FS {
	t.Helper()
	sub, err := fs.Sub(migrations.FS, dialect)
	require.NoError(t, err)
	return sub
}
