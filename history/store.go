// Package history is Cheetah's durable store: every command with every
// message that came back for it, the epoch high-water mark and the API keys.
// It runs on PostgreSQL or on an embedded SQLite file with one implementation;
// the SQL differs in the migrations and in the writer's hot path, which
// talks to each database directly (apply_pg.go, apply_sqlite.go) while gorm
// serves the schema, the reads, the keys and administration.
//
// Writes go through one writer goroutine that groups the operations of many
// callers into one transaction (group commit), so a busy broker pays one
// commit per batch rather than one per message. Reads go straight to the
// database.
package history

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	gormsqlite "github.com/libtnb/sqlite"
	"go.opentelemetry.io/otel/metric"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	gormlogger "gorm.io/gorm/logger"
	sqlitedriver "modernc.org/sqlite"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/migrations"
)

// Config says which database to use.
type Config struct {
	// DatabaseURL selects the database: "" is the SQLite file "cheetah.db"
	// in DataDir; "postgres://…" or "postgresql://…" is PostgreSQL;
	// "sqlite://PATH" or "file:PATH" is that SQLite file.
	DatabaseURL string
	// DataDir is created (0700) if missing and the database is SQLite;
	// with PostgreSQL it is not used. Default ".".
	DataDir string
	// Holder describes this process (its listen address, say) in the
	// SQLite database's lock file, beside its pid and host: a second store
	// that Open refuses (ErrDataDirInUse) names it.
	Holder string
	// Logger receives the store's own warnings. Nil discards them.
	Logger *slog.Logger
	// BatchSize caps the operations of one group commit: the writer stops
	// adding requests once a batch holds this many (one request is never
	// split). Default 512, at most 4096.
	BatchSize int
	// MeterProvider makes the writer's metrics (commit latency and batch
	// size); nil records none.
	MeterProvider metric.MeterProvider
	// MaxHeldBytes bounds what asynchronous writes may hold while the
	// database does not answer (an estimate of their size). Default 64 MiB.
	MaxHeldBytes int
	// ReplicaID names this broker among the replicas of one PostgreSQL
	// (DESIGN §9): every command row it writes carries it, through its
	// connections' cheetah.replica_id setting. Empty for a broker that is
	// no replica; SQLite ignores it.
	ReplicaID string
}

// The dialects a Store runs on.
const (
	DialectPostgres = migrations.Postgres
	DialectSQLite   = migrations.SQLite
)

// ErrClosed is returned (wrapped as store_unavailable) by writes made after
// Close.
var ErrClosed = errors.New("history: store closed")

// writeTimeout bounds one transaction of the writer, so that a database that
// stops answering fails the waiting callers instead of hanging them, and
// Close cannot hang on it forever.
const writeTimeout = 30 * time.Second

// Store is the durable history. It is safe for concurrent use.
type Store struct {
	db      *gorm.DB
	sqlDB   *sql.DB
	dialect string
	log     *slog.Logger
	batch   int

	// mu guards closed and, held for reading, every send on queue, so that
	// Close can close the channel without racing a sender.
	mu      sync.RWMutex
	closed  bool
	queue   chan request
	stopped chan struct{}

	closeOnce sync.Once
	closeErr  error
	// unlock releases the SQLite database's lock file (see lockDatabase).
	unlock func()

	stats stats
	inst  writerInstruments
	// commitTime is a moving average of how long the writer's transactions
	// that committed took, in nanoseconds (see CommitTime).
	commitTime atomic.Int64

	// down is set while the database does not answer (see Health); wake
	// tells the writer when someone else found that out.
	down atomic.Pointer[downState]
	wake chan struct{}
	// marks counts the times someone outside the writer found the
	// database away (markDown); see noteHealth.
	marks atomic.Uint64
	// What an outage holds, oldest first; only the writer goroutine
	// touches these.
	held      []heldWrite
	heldBytes int
	maxHeld   int
	// dropping is set by the first write hold drops, and cleared when the
	// database answers again: until then every later write is dropped too.
	dropping bool
	// The SQLite write path's connection and statements (see
	// applySQLite); only the writer goroutine touches them.
	sqliteConn sqliteConn
	// plan is the batch being written, made again for each batch in the
	// room of the last (see writePlan.plan), which the batch size bounds;
	// only the writer goroutine touches it.
	plan writePlan
	// The PostgreSQL writer's flights (see dispatch): those in the air,
	// in the order they took off, and those on the ground; a flight lands
	// on landed. Only the writer goroutine touches flying and idle.
	flying, idle []*flight
	landed       chan *flight
	// checkpoints runs SQLite's checkpoints beside the writer; nil on
	// PostgreSQL.
	checkpoints *checkpointer
}

// maxBatchSize bounds how long one group commit holds the database's write
// lock, and what a batch that fails costs to retry one request at a time.
const maxBatchSize = 4096

// Open connects to the database, applies the migrations and starts the
// writer. A SQLite database is locked for the store's lifetime (its lock
// file, "<file>.lock", is flocked until Close): while another store holds
// it, Open fails with ErrDataDirInUse, naming the holder.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	cfg = withDefaults(cfg)
	db, dialect, dbFile, err := connect(ctx, cfg)
	if err != nil {
		return nil, err
	}
	sqlDB, _ := db.DB() // connect checked it
	unlock := func() {}
	if dialect == DialectSQLite {
		unlock, err = lockDatabase(lockFileFor(dbFile), holderInfo(cfg.Holder))
		if err != nil {
			_ = sqlDB.Close()
			return nil, err
		}
	}
	if err := migrate(ctx, sqlDB, dialect, migrateLockFile(dbFile)); err != nil {
		_ = sqlDB.Close()
		unlock()
		return nil, err
	}
	s := &Store{
		db:      db,
		sqlDB:   sqlDB,
		dialect: dialect,
		log:     cfg.Logger,
		batch:   cfg.BatchSize,
		// A few batches of headroom lets callers keep enqueuing while a
		// commit is in flight; beyond that WriteAsync blocks (backpressure).
		queue:   make(chan request, 4*cfg.BatchSize),
		stopped: make(chan struct{}),
		landed:  make(chan *flight, maxFlights),
		wake:    make(chan struct{}, 1),
		maxHeld: cfg.MaxHeldBytes,
		unlock:  unlock,
	}
	if dialect == DialectPostgres {
		for range maxFlights {
			s.idle = append(s.idle, new(flight))
		}
	}
	if err := s.inst.init(cfg.MeterProvider, &s.stats); err != nil {
		_ = sqlDB.Close()
		unlock()
		return nil, fmt.Errorf("history.Open: metrics: %w", err)
	}
	if dialect == DialectSQLite {
		if s.checkpoints, err = startCheckpointer(ctx, sqlDB, cfg.Logger); err != nil {
			_ = sqlDB.Close()
			unlock()
			return nil, err
		}
		if s.checkpoints != nil {
			s.sqliteConn.autoCheckpoint = writerAutoCheckpoint
		}
	}
	go s.run()
	return s, nil
}

// Migrate applies the migrations to the configured database and returns
// their status, without starting a store: what `cheetah migrate` runs.
func Migrate(ctx context.Context, cfg Config) ([]migrations.Version, error) {
	return withDB(ctx, cfg, func(sqlDB *sql.DB, dialect, lockFile string) ([]migrations.Version, error) {
		if err := migrate(ctx, sqlDB, dialect, lockFile); err != nil {
			return nil, err
		}
		return migrationStatus(ctx, sqlDB, dialect, lockFile)
	})
}

// MigrationStatus returns which migrations the configured database has,
// applying none. (Goose creates its own version table if it is missing, and
// a SQLite file is created if it does not exist.)
func MigrationStatus(ctx context.Context, cfg Config) ([]migrations.Version, error) {
	return withDB(ctx, cfg, func(sqlDB *sql.DB, dialect, lockFile string) ([]migrations.Version, error) {
		return migrationStatus(ctx, sqlDB, dialect, lockFile)
	})
}

func withDB(ctx context.Context, cfg Config, fn func(*sql.DB, string, string) ([]migrations.Version, error)) ([]migrations.Version, error) {
	db, dialect, dbFile, err := connect(ctx, withDefaults(cfg))
	if err != nil {
		return nil, err
	}
	sqlDB, _ := db.DB()
	defer sqlDB.Close()
	return fn(sqlDB, dialect, migrateLockFile(dbFile))
}

// migrateLockFile is the file that serialises a SQLite database's
// migrations; PostgreSQL (no file) uses an advisory lock instead.
func migrateLockFile(dbFile string) string {
	if dbFile == "" {
		return ""
	}
	return migrations.LockFileFor(dbFile)
}

func withDefaults(cfg Config) Config {
	if cfg.DataDir == "" {
		cfg.DataDir = "."
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 512
	}
	cfg.BatchSize = min(cfg.BatchSize, maxBatchSize)
	if cfg.MaxHeldBytes <= 0 {
		cfg.MaxHeldBytes = 64 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return cfg
}

// connect opens the configured database (creating the data directory for
// SQLite; PostgreSQL needs none), checks that it answers within ctx, and
// sizes its connection pool. dbFile is the SQLite file, empty for
// PostgreSQL.
func connect(ctx context.Context, cfg Config) (db *gorm.DB, dialect, dbFile string, err error) {
	dialect, dialector, dbFile, err := resolve(cfg)
	if err != nil {
		return nil, "", "", fmt.Errorf("history.Open: %w", err)
	}
	if dialect == DialectSQLite {
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return nil, "", "", fmt.Errorf("history.Open: data dir: %w", err)
		}
	}
	// Opening connects (the SQLite dialector asks the version of the
	// library on a first connection), so it is tried again while busy too.
	err = whileBusy(ctx, func() error {
		var err error
		db, err = gorm.Open(dialector, &gorm.Config{
			// The writer wraps its own transactions; gorm's per-statement
			// ones would only add round trips.
			SkipDefaultTransaction: true,
			// Statement errors are returned to callers, who decide what to
			// log; gorm would log every refused insert and, with
			// parameters, secrets.
			Logger: gormlogger.Discard.LogMode(gormlogger.Silent),
			// gorm's own ping ignores any context: a database that accepts
			// the connection and never answers would hang Open past a
			// SIGTERM.
			DisableAutomaticPing: true,
		})
		return err
	})
	if err != nil {
		return nil, "", "", cheetah.StoreUnavailable("history.Open", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, "", "", fmt.Errorf("history.Open: %w", err)
	}
	if err := whileBusy(ctx, func() error { return sqlDB.PingContext(ctx) }); err != nil {
		_ = sqlDB.Close()
		return nil, "", "", cheetah.StoreUnavailable("history.Open", err)
	}
	if dialect == DialectPostgres {
		sqlDB.SetMaxOpenConns(16)
		sqlDB.SetMaxIdleConns(4)
	} else {
		// Every new SQLite connection runs the DSN pragmas; a few idle
		// spares avoid paying that on every read.
		sqlDB.SetMaxIdleConns(4)
	}
	return db, dialect, dbFile, nil
}

func lockOpts(lockFile string) []migrations.Option {
	if lockFile == "" {
		return nil
	}
	return []migrations.Option{migrations.WithLockFile(lockFile)}
}

func migrate(ctx context.Context, sqlDB *sql.DB, dialect, lockFile string) error {
	return migrationErr("history.Migrate", migrations.Apply(ctx, sqlDB, dialect, lockOpts(lockFile)...))
}

func migrationStatus(ctx context.Context, sqlDB *sql.DB, dialect, lockFile string) ([]migrations.Version, error) {
	v, err := migrations.Status(ctx, sqlDB, dialect, lockOpts(lockFile)...)
	return v, migrationErr("history.MigrationStatus", err)
}

// migrationErr tells a broken migration (the database refused a statement)
// from a database that does not answer.
func migrationErr(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case isRefused(err):
		return fmt.Errorf("%s: %w", op, err)
	default:
		return cheetah.StoreUnavailable(op, err)
	}
}

// IsPostgres reports whether a database URL names PostgreSQL.
func IsPostgres(dbURL string) bool {
	return strings.HasPrefix(dbURL, "postgres://") || strings.HasPrefix(dbURL, "postgresql://")
}

// resolve turns the config into a dialect, a gorm dialector and, for SQLite,
// the database file.
func resolve(cfg Config) (dialect string, d gorm.Dialector, dbFile string, err error) {
	u := cfg.DatabaseURL
	var path, query string
	switch {
	case IsPostgres(u):
		if cfg.ReplicaID != "" {
			if u, err = withRuntimeParam(u, replicaSetting, cfg.ReplicaID); err != nil {
				return "", nil, "", err
			}
		}
		return DialectPostgres, postgres.Open(u), "", nil
	case u == "":
		path = filepath.Join(cfg.DataDir, "cheetah.db")
	case strings.HasPrefix(u, "sqlite://"):
		path = strings.TrimPrefix(u, "sqlite://")
	case strings.HasPrefix(u, "file:"):
		path = strings.TrimPrefix(u, "file:")
	default:
		// The URL may carry a password, so only its scheme is repeated.
		scheme, _, _ := strings.Cut(u, ":")
		return "", nil, "", cheetah.Invalidf("unsupported database URL scheme %q (want postgres://, sqlite:// or file:)", scheme)
	}
	path, query, _ = strings.Cut(path, "?")
	if path == "" || path == ":memory:" {
		return "", nil, "", cheetah.Invalidf("the SQLite database must be a file")
	}
	return DialectSQLite, gormsqlite.Open(sqliteDSN(path, query)), path, nil
}

// replicaSetting is the connection setting the commands table's replica_id
// column takes its default from (migrations/postgres/00003_replicas.sql).
const replicaSetting = "cheetah.replica_id"

// withRuntimeParam adds a run-time parameter to a PostgreSQL URL: pgx sends
// every query parameter it does not know at connection start, where
// PostgreSQL takes it as a setting of the session.
func withRuntimeParam(dbURL, name, value string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		// url.Parse's error repeats the URL, password included.
		return "", cheetah.Invalidf("the database URL does not parse")
	}
	q := u.Query()
	q.Set(name, value)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// sqliteDSN adds the pragmas every connection needs to a file path. The
// driver runs each _pragma on every new connection, which matters because
// synchronous and foreign_keys are per-connection settings:
//   - WAL lets readers run beside the writer;
//   - synchronous=FULL makes a commit durable when it returns, so a command
//     id handed out has survived even a power loss, not just a process kill;
//   - busy_timeout makes a connection wait for the write lock instead of
//     failing at once (the broker's writer, MarkInterrupted and a second
//     process may all want it);
//   - foreign_keys makes a message for an unknown command fail and lets
//     deleting a command delete its messages;
//   - temp_store=MEMORY keeps statement journals in memory. Inside the
//     writer's transaction each multi-row INSERT keeps one, a copy of every
//     page it changes, so that a failing row undoes only its statement;
//     past 64 KiB SQLite moves it to a temporary file, and those writes
//     were about a quarter of the writer's CPU in the throughput benchmark.
//
// _txlock=immediate makes every transaction take the write lock at BEGIN:
// the writer reads MAX(seq) and then inserts, and a deferred transaction
// that read first could fail with SQLITE_BUSY when upgrading to a writer.
// _time_format=sqlite writes times as "2006-01-02 15:04:05.999999999-07:00",
// the text earlier versions of the store wrote, so that old and new rows
// compare and sort alike; _texttotime=0 gives back the text of a column
// without a declared type (an aggregate, a CAST) as it is stored, not
// reparsed as a time.
//
// A setting the database URL makes itself (extra, its query) wins over the
// store's: the driver runs the pragmas in an order of its own, not the
// URL's, so the store leaves out each one the URL sets.
func sqliteDSN(path, extra string) string {
	q, err := url.ParseQuery(extra)
	if err != nil {
		q = url.Values{} // the driver reports the malformed query itself
	}
	set := map[string]bool{}
	for _, p := range q["_pragma"] {
		name, _, _ := strings.Cut(p, "(")
		set[strings.ToLower(strings.TrimSpace(name))] = true
	}
	own := url.Values{}
	busy := fmt.Sprintf("busy_timeout(%d)", sqliteBusyTimeout.Milliseconds())
	for _, p := range []string{busy, "journal_mode(WAL)", "synchronous(FULL)", "foreign_keys(ON)", "temp_store(MEMORY)"} {
		if name, _, _ := strings.Cut(p, "("); !set[name] {
			own.Add("_pragma", p)
		}
	}
	for k, v := range map[string]string{"_txlock": "immediate", "_time_format": "sqlite", "_texttotime": "0"} {
		if !q.Has(k) {
			own.Set(k, v)
		}
	}
	dsn := path + "?" + own.Encode()
	if extra != "" {
		dsn += "&" + extra
	}
	return dsn
}

// sqliteBusyTimeout is how long a SQLite connection waits for a lock (the
// DSN's busy_timeout), and how long whileBusy tries a database that answers
// busy without waiting.
const sqliteBusyTimeout = 10 * time.Second

// whileBusy runs connect, which opens a first connection, again for as
// long as SQLite answers it busy. A new SQLite connection runs the DSN's
// pragmas first, and journal_mode(WAL) on a file that other processes are
// opening at the same moment can be refused with SQLITE_BUSY without
// waiting on busy_timeout: a second broker started beside the first would
// then fail with store_unavailable instead of ErrDataDirInUse, and `cheetah
// migrate` beside a starting broker would fail.
func whileBusy(ctx context.Context, connect func() error) error {
	deadline := time.Now().Add(sqliteBusyTimeout)
	for {
		err := connect()
		if err == nil || !sqliteBusy(err) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// sqliteBusy reports whether err is SQLite's SQLITE_BUSY.
func sqliteBusy(err error) bool {
	var se *sqlitedriver.Error
	return errors.As(err, &se) && se.Code()&0xff == 5
}

// Dialect returns "postgres" or "sqlite".
func (s *Store) Dialect() string { return s.dialect }

// Ping checks that the database answers a query, for readiness probes. A
// database that does not answer makes Health fail too, until the writer
// finds it answering again.
func (s *Store) Ping(ctx context.Context) error {
	var one int
	if err := s.db.WithContext(ctx).Raw("SELECT 1").Scan(&one).Error; err != nil {
		err = fail("history.Ping", err)
		s.markDown(err)
		return err
	}
	return nil
}

// Close stops accepting writes, commits everything already enqueued, and
// closes the database. It is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		close(s.queue)
		s.mu.Unlock()
		<-s.stopped
		s.sqliteConn.close() // the writer has stopped
		s.checkpoints.close()
		s.down.Store(&downState{err: cheetah.StoreUnavailable("history", ErrClosed)})
		if s.inst.reg != nil {
			_ = s.inst.reg.Unregister()
		}
		s.closeErr = s.sqlDB.Close()
		s.unlock()
	})
	return s.closeErr
}

// fail wraps a database error with the operation. A statement the database
// refused (a constraint, a bad value) is the caller's problem and is wrapped
// plainly; a cancelled caller gets its own error back; everything else means
// the database did not answer as it should, which the broker reports as
// store_unavailable.
func fail(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case isRefused(err), errors.Is(err, context.Canceled):
		return fmt.Errorf("%s: %w", op, err)
	default:
		return cheetah.StoreUnavailable(op, err)
	}
}

// isRefused reports whether err is the database answering "no" to a
// statement, as opposed to not answering.
func isRefused(err error) bool {
	var ce *cheetah.Error
	if errors.As(err, &ce) && ce.Code == cheetah.CodeInvalidRequest {
		return true
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) && len(pg.Code) == 5 {
		switch pg.Code[:2] {
		case "22", // data exception
			"23", // integrity constraint violation
			"42": // syntax error or access rule violation
			return true
		}
		return false
	}
	var se *sqlitedriver.Error
	if errors.As(err, &se) {
		// The primary result code is the low byte of an extended one.
		switch se.Code() & 0xff {
		case 1, // SQLITE_ERROR: a bad statement or schema
			18, // SQLITE_TOOBIG
			19, // SQLITE_CONSTRAINT
			20, // SQLITE_MISMATCH
			25: // SQLITE_RANGE
			return true
		}
	}
	return false
}

// utc normalises a time for storage: UTC, microsecond precision, the
// precision PostgreSQL keeps, so both dialects return the same value.
func utc(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

func utcPtr(t *time.Time) *time.Time {
	if t == nil || t.IsZero() {
		return nil
	}
	u := utc(*t)
	return &u
}
