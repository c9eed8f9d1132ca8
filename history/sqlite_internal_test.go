package history

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
)

// TestSQLiteConnectionSettings checks, on the store's own pool, the
// per-connection settings its durability and integrity promises rest on.
func TestSQLiteConnectionSettings(t *testing.T) {
	t.Parallel()
	s, err := Open(t.Context(), Config{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })

	pragma := func(name string) string {
		var v string
		require.NoError(t, s.db.Raw("PRAGMA "+name).Scan(&v).Error)
		return v
	}
	require.Equal(t, "wal", pragma("journal_mode"))
	require.Equal(t, "2", pragma("synchronous"), "FULL")
	require.Equal(t, "1", pragma("foreign_keys"))
	require.Equal(t, "10000", pragma("busy_timeout"))

	// Times are stored as UTC text that sorts as time does.
	at := time.Date(2025, 1, 2, 3, 4, 5, 600000000, time.FixedZone("X", -7*3600))
	rec := cheetah.CommandRecord{CommandID: "c1", UserID: "u", ResponseMode: cheetah.ModeRPC, CreatedAt: at}
	require.NoError(t, s.Write(t.Context(), InsertCommand{Rec: rec}))
	var stored string
	require.NoError(t, s.db.Raw("SELECT CAST(created_at AS TEXT) FROM commands").Scan(&stored).Error)
	require.Equal(t, "2025-01-02 10:04:05.6+00:00", stored)
}

// A pragma the database URL sets replaces the store's own: the driver
// does not run them in the URL's order.
func TestSQLiteURLSettingWins(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := Open(t.Context(), Config{DatabaseURL: "sqlite://" + filepath.Join(dir, "x.db") + "?_pragma=busy_timeout(200)", DataDir: dir})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	var v string
	require.NoError(t, s.db.Raw("PRAGMA busy_timeout").Scan(&v).Error)
	require.Equal(t, "200", v)
	require.NoError(t, s.db.Raw("PRAGMA synchronous").Scan(&v).Error)
	require.Equal(t, "2", v, "the store's other settings stay")
}

func TestResolve(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ url, dialect, file, lock string }{
		{"", DialectSQLite, filepath.Join("data", "cheetah.db"), filepath.Join("data", "cheetah.db-migrate.lock")},
		{"sqlite:///var/lib/cheetah/c.db", DialectSQLite, "/var/lib/cheetah/c.db", "/var/lib/cheetah/c.db-migrate.lock"},
		{"file:rel.db?_pragma=cache_size(-20000)", DialectSQLite, "rel.db", "rel.db-migrate.lock"},
		{"postgres://u@h/db", DialectPostgres, "", ""},
		{"postgresql://u@h/db", DialectPostgres, "", ""},
	} {
		d, _, file, err := resolve(Config{DatabaseURL: tc.url, DataDir: "data"})
		require.NoError(t, err, tc.url)
		require.Equal(t, tc.dialect, d, tc.url)
		require.Equal(t, tc.file, file, tc.url)
		require.Equal(t, tc.lock, migrateLockFile(file), tc.url)
	}
	for _, u := range []string{"mysql://x", "sqlite://", "sqlite://:memory:", "cheetah.db"} {
		_, _, _, err := resolve(Config{DatabaseURL: u, DataDir: "data"})
		require.ErrorIs(t, err, cheetah.ErrInvalidRequest, u)
	}
}
