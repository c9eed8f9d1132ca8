// Package migrations holds Cheetah's versioned schema, one folder of numbered
// SQL files per dialect, and applies it with goose under a lock so that two
// processes starting at once cannot both migrate one database.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// FS holds the SQL files: postgres/NNNNN_name.sql and sqlite/NNNNN_name.sql.
// It is exported so that test helpers can name a template database after its
// contents.
//
//go:embed postgres/*.sql sqlite/*.sql
var FS embed.FS

// The dialects this package knows.
const (
	Postgres = "postgres"
	SQLite   = "sqlite"
)

// Option changes how Apply and Status run.
type Option func(*options)

type options struct {
	lockFile string
	logger   *slog.Logger
}

// WithLockFile names the file that serialises SQLite migrations across
// processes. Goose has no locker for SQLite, so Apply takes an exclusive
// flock on this file (conventionally "<dbfile>-migrate.lock") for the whole
// run. Without it, SQLite migrations run unlocked, which is only safe when a
// single process uses the database file. PostgreSQL ignores it.
func WithLockFile(path string) Option {
	return func(o *options) { o.lockFile = path }
}

// WithLogger makes goose log each migration it applies.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.logger = l }
}

// LockFileFor returns the conventional migration lock file of a SQLite
// database file.
func LockFileFor(dbFile string) string { return dbFile + "-migrate.lock" }

// Apply brings the database up to the newest version. It is safe to call from
// several processes (and goroutines) at once: the first migrates, the others
// wait for the lock and then find nothing to do.
func Apply(ctx context.Context, db *sql.DB, dialect string, opts ...Option) error {
	err := withProvider(ctx, db, dialect, opts, func(p *goose.Provider) error {
		_, err := p.Up(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("migrations.Apply: %w", err)
	}
	return nil
}

// Version is one migration and whether the database has it.
type Version struct {
	Version   int64
	Name      string // the file name, e.g. "00001_init.sql"
	Applied   bool
	AppliedAt time.Time // zero when not applied
}

// Status lists every known migration, oldest first, and whether it is
// applied: what `cheetah migrate` prints.
func Status(ctx context.Context, db *sql.DB, dialect string, opts ...Option) ([]Version, error) {
	var out []Version
	err := withProvider(ctx, db, dialect, opts, func(p *goose.Provider) error {
		st, err := p.Status(ctx)
		if err != nil {
			return err
		}
		for _, s := range st {
			out = append(out, Version{
				Version:   s.Source.Version,
				Name:      path.Base(s.Source.Path),
				Applied:   s.State == goose.StateApplied,
				AppliedAt: s.AppliedAt.UTC(),
			})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("migrations.Status: %w", err)
	}
	return out, nil
}

// withProvider builds a goose Provider for the dialect, with the lock that
// dialect needs, and runs fn with it.
func withProvider(ctx context.Context, db *sql.DB, dialect string, opts []Option, fn func(*goose.Provider) error) error {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	sub, err := fs.Sub(FS, dialect)
	if err != nil {
		return err
	}
	popts := []goose.ProviderOption{goose.WithDisableGlobalRegistry(true)}
	if o.logger != nil {
		popts = append(popts, goose.WithVerbose(true), goose.WithSlog(o.logger))
	}
	var gooseDialect goose.Dialect
	switch dialect {
	case Postgres:
		gooseDialect = goose.DialectPostgres
		// A session-level advisory lock is held by the migrating connection
		// and released by PostgreSQL itself if that process dies, so a
		// crashed migration never leaves a stale lock behind (goose's table
		// locker would, until its lease runs out). Goose polls for it; a
		// one-second period keeps a waiting process's delay short, and 300
		// tries bound the wait at five minutes.
		locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 300))
		if err != nil {
			return err
		}
		popts = append(popts, goose.WithSessionLocker(locker))
	case SQLite:
		gooseDialect = goose.DialectSQLite3
		// Goose ships lockers for PostgreSQL and MySQL only, so SQLite gets an
		// OS file lock. It is held around the whole run, including goose's
		// unlocked pending check, so concurrent processes never race to
		// create goose's version table either.
		if o.lockFile != "" {
			unlock, err := flockFile(ctx, o.lockFile)
			if err != nil {
				return err
			}
			defer unlock()
		}
	default:
		return fmt.Errorf("unknown dialect %q (want %q or %q)", dialect, Postgres, SQLite)
	}
	p, err := goose.NewProvider(gooseDialect, db, sub, popts...)
	if err != nil {
		return err
	}
	return fn(p)
}
