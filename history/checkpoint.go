package history

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
)

// The SQLite writer commits into the write-ahead log; a checkpoint copies
// the log's pages into the database file and fsyncs it, so that the log can
// start again from its beginning. SQLite runs one inside the COMMIT that
// takes the log past 1,000 pages, on the committing connection: the
// writer's, whose every commit a caller waits for. In the throughput
// benchmark that was a fifth of the writer's CPU, and an fsync of the
// database file on its path. A checkpointer runs them on a connection of
// its own instead, beside the writer.
const (
	// checkpointEvery spaces the checkpointer's runs: at most one per
	// interval, and only after commits. Under load a checkpoint copies a
	// few hundred to a few thousand pages, as SQLite's own would.
	checkpointEvery = 100 * time.Millisecond

	// writerAutoCheckpoint is the log's size, in pages, past which the
	// writer's own commits still checkpoint (SQLite's default is 1,000): a
	// bound on the log should the checkpointer fall behind, as it does
	// while a long read holds an old snapshot.
	writerAutoCheckpoint = 10000
)

// checkpointer runs SQLite's passive checkpoints off the writer's path.
// A passive checkpoint takes no lock that commits or reads wait for.
type checkpointer struct {
	db   *sql.DB
	conn *sql.Conn // its own, as the writer has: kept between runs; nil after a failure
	log  *slog.Logger
	due  chan struct{} // a commit since the last checkpoint
	stop chan struct{}
	done chan struct{}
	runs atomic.Int64 // checkpoints that ran to their end
	// failing is set from a failed run to the next that works, so that a
	// failure is logged once, not at every commit. Only loop touches it.
	failing bool
}

// sqliteAutoCheckpoint is SQLite's own wal_autocheckpoint.
const sqliteAutoCheckpoint = 1000

// startCheckpointer starts a checkpointer on a connection of db's. When
// the database URL set wal_autocheckpoint itself (its connections have
// another than SQLite's), checkpoints are as it says: there is none, and
// nil is returned.
func startCheckpointer(ctx context.Context, db *sql.DB, log *slog.Logger) (*checkpointer, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fail("history.Open", err)
	}
	var pages int
	if err := conn.QueryRowContext(ctx, "PRAGMA wal_autocheckpoint").Scan(&pages); err != nil {
		_ = conn.Close()
		return nil, fail("history.Open", err)
	}
	if pages != sqliteAutoCheckpoint {
		return nil, conn.Close()
	}
	c := &checkpointer{db: db, conn: conn, log: log, due: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go c.loop()
	return c, nil
}

// committed tells the checkpointer that the log grew. It never blocks,
// and does nothing without a checkpointer.
func (c *checkpointer) committed() {
	if c == nil {
		return
	}
	select {
	case c.due <- struct{}{}:
	default:
	}
}

func (c *checkpointer) loop() {
	defer close(c.done)
	pause := time.NewTimer(checkpointEvery)
	pause.Stop()
	defer pause.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-c.due:
		}
		c.run()
		pause.Reset(checkpointEvery)
		select {
		case <-c.stop:
			return
		case <-pause.C:
		}
	}
}

// run runs one passive checkpoint. A connection it fails on is given up
// for another of the pool's at the next run; meanwhile the writer's own
// bound holds the log.
func (c *checkpointer) run() {
	// The context never ends: the driver would watch one that can with a
	// goroutine, and a checkpoint is bounded by the log's size.
	ctx := context.Background()
	err := c.checkpoint(ctx)
	switch {
	case err != nil && !c.failing:
		c.failing = true
		c.log.Warn("history: WAL checkpoint failed; the writer's commits checkpoint past a longer log until one works",
			"err", fmt.Errorf("history.checkpoint: %w", err), "writer_autocheckpoint_pages", writerAutoCheckpoint)
	case err == nil && c.failing:
		c.failing = false
		c.log.Info("history: WAL checkpoints work again")
	}
}

func (c *checkpointer) checkpoint(ctx context.Context) error {
	if c.conn == nil {
		conn, err := c.db.Conn(ctx)
		if err != nil {
			return err
		}
		c.conn = conn
	}
	var busy, logPages, copied int
	if err := c.conn.QueryRowContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &logPages, &copied); err != nil {
		_ = c.conn.Close()
		c.conn = nil
		return err
	}
	c.runs.Add(1)
	return nil
}

// count returns the checkpoints run; none without a checkpointer.
func (c *checkpointer) count() int64 {
	if c == nil {
		return 0
	}
	return c.runs.Load()
}

// close stops the checkpointer and waits for it; nothing without one.
// SQLite checkpoints the log one last time when the store closes its last
// connection.
func (c *checkpointer) close() {
	if c == nil {
		return
	}
	close(c.stop)
	<-c.done
	if c.conn != nil {
		_ = c.conn.Close()
	}
}
