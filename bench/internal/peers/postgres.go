// Package peers reaches the systems Cheetah is measured against — NATS,
// Redis, PostgreSQL and a raw WebSocket echo — and tells their versions. A
// peer that cannot be reached is reported as such, never stood in for.
package peers

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// DialTimeout bounds every attempt to reach a peer.
const DialTimeout = 3 * time.Second

// Postgres is a reachable PostgreSQL server on which the harness makes its
// own databases.
type Postgres struct {
	AdminURL string
	Version  string
}

// DialPostgres checks that the server at adminURL answers and reads its
// version.
func DialPostgres(ctx context.Context, adminURL string) (*Postgres, error) {
	ctx, cancel := context.WithTimeout(ctx, DialTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	defer conn.Close(context.Background())
	var v string
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&v); err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return &Postgres{AdminURL: adminURL, Version: v}, nil
}

var dbSeq atomic.Int64

// CreateDB makes a fresh, empty database for one use and returns its URL and
// a function that drops it. Names carry the process id, so concurrent
// harnesses and tests never share one.
func (p *Postgres) CreateDB(ctx context.Context, prefix string) (string, func(), error) {
	name := fmt.Sprintf("cheetah_bench_%s_%d_%d", prefix, os.Getpid(), dbSeq.Add(1))
	if err := p.exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", nil, err
	}
	u, err := url.Parse(p.AdminURL)
	if err != nil {
		return "", nil, err
	}
	u.Path = "/" + name
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = p.exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	}
	return u.String(), drop, nil
}

func (p *Postgres) exec(ctx context.Context, sql string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.AdminURL)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("postgres: %s: %w", sql, err)
	}
	return nil
}
