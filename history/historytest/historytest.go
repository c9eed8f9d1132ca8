// Package historytest makes real history stores for tests: a SQLite file in
// the test's temporary directory, or a fresh PostgreSQL database cloned from
// a migrated template. Run is the conformance suite both must pass.
package historytest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	_ "modernc.org/sqlite"             // the "sqlite" database/sql driver, for DB

	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/migrations"
)

// DefaultPostgresURL is the server tests use unless CHEETAH_TEST_POSTGRES_URL
// names another. Its database is only used to create and drop test
// databases.
const DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// opened remembers how each store made here was opened, so that Reopen can
// open the same database again and DB can reach it directly.
var opened sync.Map // *history.Store → target

type target struct {
	cfg    history.Config
	driver string // database/sql driver name for DB
	dsn    string
	path   string // the SQLite file
}

// Option adjusts a store NewSQLite or NewPostgres makes.
type Option func(*target)

// MaxHeldBytes sets the store's bound on what an outage may hold.
func MaxHeldBytes(n int) Option { return func(t *target) { t.cfg.MaxHeldBytes = n } }

// BusyTimeout makes the store's SQLite connections wait at most d for the
// write lock (the broker's default is 10 s), so that a test holding the
// lock with Outage sees writes fail quickly. PostgreSQL ignores it.
func BusyTimeout(d time.Duration) Option {
	return func(t *target) {
		if t.driver == "sqlite" {
			t.cfg.DatabaseURL += fmt.Sprintf("?_pragma=busy_timeout(%d)", d.Milliseconds())
		}
	}
}

// Replica makes the store write as replica id of its PostgreSQL database
// (history.Config.ReplicaID).
func Replica(id string) Option { return func(t *target) { t.cfg.ReplicaID = id } }

// Through makes the store reach its PostgreSQL server at hostport (a
// tcpproxy, say) instead of the server's own address.
func Through(hostport string) Option {
	return func(t *target) {
		u, err := url.Parse(t.cfg.DatabaseURL)
		if err != nil || t.driver != "pgx" {
			return
		}
		u.Host = hostport
		t.cfg.DatabaseURL = u.String()
	}
}

// NewSQLite returns a store on a new SQLite file in tb.TempDir(), closed when
// the test ends.
func NewSQLite(tb testing.TB, opts ...Option) *history.Store {
	tb.Helper()
	dir := tb.TempDir()
	path := filepath.Join(dir, "cheetah.db")
	t := target{
		cfg:    history.Config{DatabaseURL: "sqlite://" + path, DataDir: dir},
		driver: "sqlite",
		dsn:    path + "?_pragma=busy_timeout(10000)",
		path:   path,
	}
	for _, o := range opts {
		o(&t)
	}
	return open(tb, t)
}

// Outage makes s's database stop answering the store until the returned
// function is called (or the test ends), without touching the store itself:
// on PostgreSQL the database stops taking connections and its sessions are
// ended; on SQLite another connection holds the write lock, so the store's
// writes fail once their busy timeout passes (see BusyTimeout). Reads keep
// working on SQLite (WAL), as they would with a second writer.
func Outage(tb testing.TB, s *history.Store) (restore func()) {
	tb.Helper()
	t := lookup(tb, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var once sync.Once
	var undo func() error
	if t.driver == "pgx" {
		u, err := url.Parse(t.dsn)
		if err != nil {
			tb.Fatalf("historytest: outage: %v", err)
		}
		name := strings.TrimPrefix(u.Path, "/")
		db := admin(tb)
		for _, stmt := range []string{
			"ALTER DATABASE " + name + " ALLOW_CONNECTIONS false",
			"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '" + name + "' AND pid <> pg_backend_pid()",
		} {
			if _, err := db.ExecContext(ctx, stmt); err != nil {
				_ = db.Close()
				tb.Fatalf("historytest: outage: %s: %v", stmt, err)
			}
		}
		// pg_terminate_backend only signals: wait until the sessions are
		// gone, so that none of them answers the store after this returns.
		deadline := time.Now().Add(20 * time.Second)
		for {
			var n int
			err := db.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = $1", name).Scan(&n)
			if err != nil {
				_ = db.Close()
				tb.Fatalf("historytest: outage: %v", err)
			}
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				_ = db.Close()
				tb.Fatalf("historytest: outage: %d sessions of %s are still there", n, name)
			}
			time.Sleep(5 * time.Millisecond)
		}
		undo = func() error {
			defer db.Close()
			_, err := db.Exec("ALTER DATABASE " + name + " ALLOW_CONNECTIONS true")
			return err
		}
	} else {
		db, err := sql.Open(t.driver, t.path+"?_pragma=busy_timeout(10000)")
		if err != nil {
			tb.Fatalf("historytest: outage: %v", err)
		}
		conn, err := db.Conn(ctx)
		if err == nil {
			_, err = conn.ExecContext(ctx, "BEGIN IMMEDIATE")
		}
		if err != nil {
			_ = db.Close()
			tb.Fatalf("historytest: outage: take the write lock: %v", err)
		}
		undo = func() error {
			_, err := conn.ExecContext(context.Background(), "ROLLBACK")
			_ = conn.Close()
			_ = db.Close()
			return err
		}
	}
	restore = func() {
		once.Do(func() {
			if err := undo(); err != nil {
				tb.Errorf("historytest: end outage: %v", err)
			}
		})
	}
	tb.Cleanup(restore)
	return restore
}

// NewPostgres returns a store on a new PostgreSQL database, cloned from a
// template that is migrated once, and dropped when the test ends. The test
// fails, saying how to start one, when the server does not answer.
func NewPostgres(tb testing.TB, opts ...Option) *history.Store {
	tb.Helper()
	u := createDatabase(tb, template(tb))
	t := target{
		cfg:    history.Config{DatabaseURL: u, DataDir: tb.TempDir()},
		driver: "pgx",
		dsn:    u,
	}
	for _, o := range opts {
		o(&t)
	}
	return open(tb, t)
}

// EmptyPostgres creates an empty PostgreSQL database, dropped when the test
// ends, and returns its URL: for tests of the migrations themselves.
func EmptyPostgres(tb testing.TB) string {
	tb.Helper()
	return createDatabase(tb, "")
}

// Reopen closes s and opens the same database again, as a restarted broker
// would. s must come from NewSQLite, NewPostgres or Reopen.
func Reopen(tb testing.TB, s *history.Store) *history.Store {
	tb.Helper()
	t := lookup(tb, s)
	if err := s.Close(); err != nil {
		tb.Fatalf("historytest: close before reopen: %v", err)
	}
	return open(tb, t)
}

// Beside opens another store on s's database, as another broker on it
// would, closed when the test ends; s stays open. opts apply to the new
// store.
func Beside(tb testing.TB, s *history.Store, opts ...Option) *history.Store {
	tb.Helper()
	t := lookup(tb, s)
	for _, o := range opts {
		o(&t)
	}
	return open(tb, t)
}

// Joined opens, beside s, one store for each replica id, each joined as
// that replica (no URL, an hour's TTL), in the order of ids.
func Joined(tb testing.TB, s *history.Store, ids ...string) []*history.Store {
	tb.Helper()
	out := make([]*history.Store, len(ids))
	for i, id := range ids {
		out[i] = Beside(tb, s, Replica(id))
		if err := out[i].JoinReplica(context.Background(), id, "", time.Hour); err != nil {
			tb.Fatalf("historytest: join as %s: %v", id, err)
		}
	}
	return out
}

// DB returns a plain database/sql connection to s's database, for tests
// that check what is stored, closed when the test ends. Placeholders are the
// dialect's own: ? for SQLite, $1 for PostgreSQL (see Q).
func DB(tb testing.TB, s *history.Store) *sql.DB {
	tb.Helper()
	t := lookup(tb, s)
	db, err := sql.Open(t.driver, t.dsn)
	if err != nil {
		tb.Fatalf("historytest: %v", err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	return db
}

// Q rewrites a query written with ? placeholders for s's dialect.
func Q(s *history.Store, query string) string {
	if s.Dialect() != history.DialectPostgres {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// ServerURL is the PostgreSQL server the helpers use.
func ServerURL() string {
	if u := os.Getenv("CHEETAH_TEST_POSTGRES_URL"); u != "" {
		return u
	}
	return DefaultPostgresURL
}

func open(tb testing.TB, t target) *history.Store {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := history.Open(ctx, t.cfg)
	if err != nil {
		tb.Fatalf("historytest: open store: %v", err)
	}
	opened.Store(s, t)
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Errorf("historytest: close store: %v", err)
		}
		opened.Delete(s)
	})
	return s
}

func lookup(tb testing.TB, s *history.Store) target {
	tb.Helper()
	t, ok := opened.Load(s)
	if !ok {
		tb.Fatalf("historytest: this store was not made by NewSQLite, NewPostgres or Reopen")
	}
	return t.(target)
}

// admin connects to the server's maintenance database or fails the test
// with instructions.
func admin(tb testing.TB) *sql.DB {
	tb.Helper()
	if testing.Short() {
		tb.Skip("historytest: PostgreSQL tests do not run with -short")
	}
	db, err := sql.Open("pgx", ServerURL())
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = db.PingContext(ctx)
		cancel()
		if err != nil {
			_ = db.Close()
		}
	}
	if err != nil {
		redacted := ServerURL()
		if u, perr := url.Parse(redacted); perr == nil {
			redacted = u.Redacted()
		}
		tb.Fatalf("historytest: PostgreSQL at %s does not answer: %v\n"+
			"These tests need a PostgreSQL server (trust auth is enough). Start one with\n"+
			"  make postgres        (scripts/ensure-postgres: the machine's cluster)\n"+
			"or\n"+
			"  docker run -d --name cheetah-pg -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres:16\n"+
			"or point CHEETAH_TEST_POSTGRES_URL at one you have (go test -short skips these tests).", redacted, err)
	}
	return db
}

// createDatabase makes a database (a clone of tmpl when tmpl is not empty),
// registers its drop, and returns its URL.
func createDatabase(tb testing.TB, tmpl string) string {
	tb.Helper()
	db := admin(tb)
	defer db.Close()
	name := "cheetah_test_" + randomHex(8)
	stmt := "CREATE DATABASE " + name
	if tmpl != "" {
		stmt += " TEMPLATE " + tmpl
	}
	if err := execRetry(db, stmt); err != nil {
		tb.Fatalf("historytest: %s: %v", stmt, err)
	}
	tb.Cleanup(func() {
		db := admin(tb)
		defer db.Close()
		// FORCE ends any session a failed test left behind.
		if _, err := db.Exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)"); err != nil {
			tb.Errorf("historytest: drop %s: %v", name, err)
		}
	})
	return databaseURL(tb, name)
}

// tmpl caches the template's name for this test binary.
var tmpl struct {
	sync.Mutex
	name string
}

// template returns the name of a migrated template database, creating it if
// needed. Its name carries a hash of the migration files, so a binary built
// with other migrations uses another template instead of a stale one; an
// advisory lock keeps concurrent test binaries from building it twice; it is
// built under a temporary name and renamed when complete, so a binary killed
// halfway leaves nothing that looks finished.
func template(tb testing.TB) string {
	tb.Helper()
	tmpl.Lock()
	defer tmpl.Unlock()
	if tmpl.name != "" {
		return tmpl.name
	}
	name := "cheetah_tmpl_" + migrationsHash(tb)
	db := admin(tb)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := db.Conn(ctx)
	if err != nil {
		tb.Fatalf("historytest: %v", err)
	}
	defer conn.Close()
	const lockID = 0x63686565 // "chee"
	if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock($1)", lockID); err != nil {
		tb.Fatalf("historytest: lock template: %v", err)
	}
	defer func() { _, _ = conn.ExecContext(context.Background(), "SELECT pg_advisory_unlock($1)", lockID) }()

	var exists bool
	if err := conn.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		tb.Fatalf("historytest: %v", err)
	}
	if !exists {
		build := name + "_build"
		for _, stmt := range []string{"DROP DATABASE IF EXISTS " + build + " WITH (FORCE)", "CREATE DATABASE " + build} {
			if _, err := conn.ExecContext(ctx, stmt); err != nil {
				tb.Fatalf("historytest: %s: %v", stmt, err)
			}
		}
		mdb, err := sql.Open("pgx", databaseURL(tb, build))
		if err != nil {
			tb.Fatalf("historytest: %v", err)
		}
		err = migrations.Apply(ctx, mdb, migrations.Postgres)
		_ = mdb.Close()
		if err != nil {
			tb.Fatalf("historytest: migrate template: %v", err)
		}
		if err := execRetry(db, "ALTER DATABASE "+build+" RENAME TO "+name); err != nil {
			tb.Fatalf("historytest: publish template: %v", err)
		}
	}
	tmpl.name = name
	return name
}

// execRetry runs a statement that PostgreSQL refuses while another session
// is still connected to a database it names (a template being cloned, a
// database being renamed); sessions that just closed take a moment to go.
func execRetry(db *sql.DB, stmt string) error {
	var err error
	for range 50 {
		if _, err = db.Exec(stmt); err == nil {
			return nil
		}
		var pg *pgconn.PgError
		if !errors.As(err, &pg) || pg.Code != "55006" { // object_in_use
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

func migrationsHash(tb testing.TB) string {
	tb.Helper()
	h := sha256.New()
	err := fs.WalkDir(migrations.FS, migrations.Postgres, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrations.FS, p)
		if err != nil {
			return err
		}
		h.Write([]byte(p))
		h.Write(b)
		return nil
	})
	if err != nil {
		tb.Fatalf("historytest: %v", err)
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

func databaseURL(tb testing.TB, name string) string {
	tb.Helper()
	u, err := url.Parse(ServerURL())
	if err != nil {
		tb.Fatalf("historytest: CHEETAH_TEST_POSTGRES_URL: %v", err)
	}
	u.Path = "/" + name
	return u.String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
