package harness

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/bench/internal/broker"
	"github.com/cheetahbroker/cheetah/bench/internal/peers"
	"github.com/cheetahbroker/cheetah/bench/internal/report"
	"github.com/cheetahbroker/cheetah/history"
)

// Peer names, shared by the scenarios and the targets.
const (
	peerEcho         = "raw coder/websocket echo (floor)"
	peerNATS         = "NATS request-reply"
	peerNATSQueue    = "NATS request-reply, queue group"
	peerCheetahSQL   = "Cheetah on SQLite"
	peerCheetahPG    = "Cheetah on PostgreSQL"
	peerCheetahPGAPI = "Cheetah on PostgreSQL, over HTTP (remote SDK)"
	peerPGCommit     = "PostgreSQL one-row INSERT, its own commit (durability floor)"
	peerSQLiteCommit = "SQLite one-row INSERT, its own commit (durability floor)"
	peerPGRows       = "PostgreSQL, a round trip's rows in Cheetah's schema, one commit, pgx alone"
	peerSQLiteRows   = "SQLite, a round trip's rows in Cheetah's schema, one commit, the driver alone"
)

func latencyColumns() []report.Column {
	return []report.Column{
		{Key: "p50", Label: "p50", Unit: "µs", Better: report.Lower},
		{Key: "p99", Label: "p99", Unit: "µs", Better: report.Lower},
		{Key: "p999", Label: "p99.9", Unit: "µs", Better: report.Lower},
		{Key: "commits", Label: "store commits per round trip", Unit: "", Better: report.Lower},
		cpuColumn,
	}
}

// cpuColumn is Cheetah's CPU time per command: this process's user and
// system time over the measured phase (getrusage) divided by the commands
// completed in it. The agents that answer run in this process too, so it
// counts them, and the callers; not the PostgreSQL server's.
var cpuColumn = report.Column{Key: "cpu_us", Label: "CPU per command (process)", Unit: "µs", Better: report.Lower}

// latency is scenario 1: one context, sequential round trips with a
// payload-sized params object.
func (e *env) latency() *report.Scenario {
	c := e.cfg
	s := &report.Scenario{
		Number: 1, Key: "latency", Title: "Round-trip latency",
		Detail: fmt.Sprintf("One context, %s per run (%s excluded), %d-byte params object echoed back, %s. "+
			"Cheetah: SendAndWait in process through a console agent on a real WebSocket, every command and message durable before the caller hears. "+
			"The durability floors time one durable commit of a one-row INSERT of the payload: a Cheetah round trip waits for one, which holds the command's record, its ack and its result. "+
			"The rows in Cheetah's schema are what that commit writes (the command's row and its two messages, in the tables and indexes of the history store), written by the database driver alone in one transaction: "+
			"what the durable part of a round trip costs without the broker around it (no goal; it shows how much of the ratio is the data and how much the path).",
			report.Count(c.RoundTrips, "sequential round trip"), report.Count(c.WarmupRoundTrips, "warm-up round trip"), c.PayloadBytes, report.Count(c.Repeats, "run")),
		Columns: latencyColumns(),
	}
	s.Rows = append(s.Rows,
		e.row(s.Key, peerEcho, false, e.echoRoundTrips),
		e.row(s.Key, peerNATS, false, e.natsRoundTrips),
		e.row(s.Key, peerCheetahSQL, true, e.cheetahRoundTrips(broker.SQLite, false)),
		e.row(s.Key, peerCheetahPG, true, e.cheetahRoundTrips(broker.Postgres, false)),
		e.row(s.Key, peerCheetahPGAPI, true, e.cheetahRoundTrips(broker.Postgres, true)),
		e.row(s.Key, peerPGCommit, false, e.pgCommits),
		e.row(s.Key, peerSQLiteCommit, false, e.sqliteCommits),
		e.row(s.Key, peerPGRows, false, e.pgRoundTripRows),
		e.row(s.Key, peerSQLiteRows, false, e.sqliteRoundTripRows),
	)
	return s
}

// roundTripRows are the rows one Cheetah round trip commits: the command,
// already completed, and its ack and result.
type roundTripRows struct {
	id      string
	params  string
	created time.Time
}

func (e *env) newRoundTripRows() roundTripRows {
	return roundTripRows{id: uuid.Must(uuid.NewV7()).String(), params: string(e.payload), created: time.Now().UTC()}
}

const (
	rowsInsertCommand = `INSERT INTO commands (command_id, user_id, client_id, context_id, task_id, epoch, name, params, target,
	response_mode, status, status_rank, trace_id, created_at, dispatched_at, acked_at, finished_at)
VALUES ($1, 'usr_bench', 'rt-0', 'flow-1', 'latency', 1, 'echo', $2, '{"tab_id":"flow-1"}', 'rpc', 'completed', 3, '', $3, $3, $3, $3)`
	rowsInsertMessages = `INSERT INTO messages (command_id, seq, kind, data, at) VALUES ($1, 1, 'ack', NULL, $3), ($1, 2, 'result', $2, $3)`
)

// pgRoundTripRows commits a round trip's rows through pgx, in one pipeline
// (one round trip to the server, one commit), as the store's writer does.
func (e *env) pgRoundTripRows() (func(*trial) (map[string]float64, error), func(), error) {
	if e.pgErr != nil {
		return nil, nil, absent(e.pgErr)
	}
	url, drop, err := e.pg.CreateDB(e.ctx, "rows")
	if err != nil {
		return nil, nil, absent(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	// The schema is the store's own: opened once, then closed.
	st, err := history.Open(ctx, history.Config{DatabaseURL: url})
	if err != nil {
		drop()
		return nil, nil, err
	}
	st.Close()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		drop()
		return nil, nil, absent(err)
	}
	cleanup := func() { conn.Close(context.Background()); drop() }
	op := func(ctx context.Context) error {
		r := e.newRoundTripRows()
		var b pgx.Batch
		b.Queue(rowsInsertCommand, r.id, r.params, r.created)
		b.Queue(rowsInsertMessages, r.id, r.params, r.created)
		return conn.SendBatch(ctx, &b).Close()
	}
	return func(t *trial) (map[string]float64, error) { return e.roundTrips(t, op) }, cleanup, nil
}

// sqliteRoundTripRows commits a round trip's rows in one SQLite
// transaction, with the store's pragmas.
func (e *env) sqliteRoundTripRows() (func(*trial) (map[string]float64, error), func(), error) {
	dir, err := os.MkdirTemp("", "cheetah-bench-rows-*")
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	st, err := history.Open(ctx, history.Config{DataDir: dir})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	st.Close()
	// The store's file and pragmas (history.sqliteDSN).
	db, err := sql.Open("sqlite", filepath.Join(dir, "cheetah.db")+
		"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=foreign_keys(ON)&_txlock=immediate")
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	db.SetMaxOpenConns(1)
	cleanup := func() { db.Close(); os.RemoveAll(dir) }
	op := func(ctx context.Context) error {
		r := e.newRoundTripRows()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, rowsInsertCommand, r.id, r.params, r.created); err != nil {
			_ = tx.Rollback()
			return err
		}
		if _, err := tx.ExecContext(ctx, rowsInsertMessages, r.id, r.params, r.created); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
	return func(t *trial) (map[string]float64, error) { return e.roundTrips(t, op) }, cleanup, nil
}

// roundTrips is the measured part shared by every peer of scenario 1.
func (e *env) roundTrips(t *trial, op func(ctx context.Context) error) (map[string]float64, error) {
	lat, err := sequential(t.ctx, t, e.cfg.WarmupRoundTrips, e.cfg.RoundTrips, op)
	if err != nil {
		return nil, err
	}
	p := lat.Percentiles(50, 99, 99.9)
	return map[string]float64{"p50": p[0], "p99": p[1], "p999": p[2]}, nil
}

func (e *env) echoRoundTrips() (func(*trial) (map[string]float64, error), func(), error) {
	srv, err := peers.StartEcho()
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(e.ctx, peers.DialTimeout)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, srv.URL, nil)
	if err != nil {
		srv.Close()
		return nil, nil, err
	}
	conn.SetReadLimit(4 << 20)
	cleanup := func() { conn.CloseNow(); srv.Close() }
	op := func(ctx context.Context) error {
		if err := conn.Write(ctx, websocket.MessageText, e.payload); err != nil {
			return err
		}
		_, b, err := conn.Read(ctx)
		if err != nil {
			return err
		}
		if len(b) != len(e.payload) {
			return fmt.Errorf("echo: %d bytes back, sent %d", len(b), len(e.payload))
		}
		return nil
	}
	return func(t *trial) (map[string]float64, error) { return e.roundTrips(t, op) }, cleanup, nil
}

func (e *env) natsRoundTrips() (func(*trial) (map[string]float64, error), func(), error) {
	if e.natsErr != nil {
		return nil, nil, absent(e.natsErr)
	}
	responder, err := peers.DialNATS(e.cfg.NATSURL, "cheetah-bench-responder")
	if err != nil {
		return nil, nil, absent(err)
	}
	requester, err := peers.DialNATS(e.cfg.NATSURL, "cheetah-bench-requester")
	if err != nil {
		responder.Close()
		return nil, nil, absent(err)
	}
	cleanup := func() { requester.Close(); responder.Close() }
	subject := fmt.Sprintf("cheetah.bench.%d.rt", os.Getpid())
	if _, err := responder.Subscribe(subject, func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		return nil, cleanup, err
	}
	if err := responder.Flush(); err != nil {
		return nil, cleanup, err
	}
	op := func(ctx context.Context) error {
		m, err := requester.RequestWithContext(ctx, subject, e.payload)
		if err != nil {
			return err
		}
		if len(m.Data) != len(e.payload) {
			return fmt.Errorf("nats: %d bytes back, sent %d", len(m.Data), len(e.payload))
		}
		return nil
	}
	return func(t *trial) (map[string]float64, error) { return e.roundTrips(t, op) }, cleanup, nil
}

// startBroker starts a broker on a store, making its PostgreSQL database
// when it needs one. The cleanup stops the broker and drops the database.
func (e *env) startBroker(store broker.Store) (*broker.Broker, func(), error) {
	o := broker.Options{Store: store, Log: brokerLog(e.log)}
	var drop func()
	if store == broker.Postgres {
		if e.pgErr != nil {
			return nil, nil, absent(e.pgErr)
		}
		url, d, err := e.pg.CreateDB(e.ctx, "broker")
		if err != nil {
			return nil, nil, absent(err)
		}
		o.DatabaseURL, drop = url, d
	}
	b, err := broker.Start(e.ctx, o)
	if err != nil {
		if drop != nil {
			drop()
		}
		return nil, nil, err
	}
	return b, func() {
		b.Close()
		if drop != nil {
			drop()
		}
	}, nil
}

func (e *env) cheetahRoundTrips(store broker.Store, overHTTP bool) runner {
	return func() (func(*trial) (map[string]float64, error), func(), error) {
		b, cleanup, err := e.startBroker(store)
		if err != nil {
			return nil, cleanup, err
		}
		ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
		defer cancel()
		if err := b.AddAgents(ctx, "rt", 1, 1); err != nil {
			return nil, cleanup, err
		}
		if err := b.WaitIdle(ctx, 1); err != nil {
			return nil, cleanup, err
		}
		mgr := b.Manager()
		if overHTTP {
			mgr = b.Remote(4)
		}
		h, err := mgr.Acquire(ctx, cheetah.AcquireRequest{UserID: broker.User, TaskID: "latency", ClientType: cheetah.Console})
		if err != nil {
			return nil, cleanup, err
		}
		cmd := cheetah.Command{Name: "echo", Params: json.RawMessage(e.payload)}
		op := func(ctx context.Context) error { return sendAndWait(ctx, h, cmd) }
		return func(t *trial) (map[string]float64, error) {
			before := b.B.Store.Stats()
			out, err := e.roundTrips(t, op)
			after := b.B.Store.Stats()
			if err == nil {
				// Warm-up included: commits are counted by the store, not per call.
				n := float64(e.cfg.RoundTrips + e.cfg.WarmupRoundTrips)
				out["commits"] = float64(after.Batches-before.Batches) / n
				if cpu, ok := t.cpuPerOp(int64(e.cfg.RoundTrips)); ok {
					out["cpu_us"] = cpu
				}
			}
			return out, err
		}, cleanup, nil
	}
}

// sendAndWait sends cmd and checks that it completed. The echo's result is
// in history; the resolution carries only the status.
func sendAndWait(ctx context.Context, h *cheetah.Handle, cmd cheetah.Command) error {
	res, err := h.SendAndWait(ctx, cmd)
	if err != nil {
		return err
	}
	if res.Status != cheetah.StatusCompleted {
		msg := string(res.Status)
		if res.Error != nil {
			msg += ": " + res.Error.Code + " " + res.Error.Message
		}
		return errors.New("send_and_wait: " + msg)
	}
	return nil
}

// brokerLog is where in-process brokers log: nowhere, unless
// CHEETAH_BENCH_BROKER_LOG names a level (debug, info, warn, error), and
// then to the harness's log.
func brokerLog(w io.Writer) *slog.Logger {
	var level slog.Level
	if v := os.Getenv("CHEETAH_BENCH_BROKER_LOG"); v == "" || level.UnmarshalText([]byte(v)) != nil {
		return nil
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

func (e *env) pgCommits() (func(*trial) (map[string]float64, error), func(), error) {
	if e.pgErr != nil {
		return nil, nil, absent(e.pgErr)
	}
	url, drop, err := e.pg.CreateDB(e.ctx, "commit")
	if err != nil {
		return nil, nil, absent(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, peers.DialTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		drop()
		return nil, nil, absent(err)
	}
	cleanup := func() { conn.Close(context.Background()); drop() }
	if _, err := conn.Exec(ctx, `CREATE TABLE rows (id bigserial PRIMARY KEY, data text NOT NULL)`); err != nil {
		return nil, cleanup, err
	}
	data := string(e.payload)
	op := func(ctx context.Context) error {
		_, err := conn.Exec(ctx, `INSERT INTO rows (data) VALUES ($1)`, data)
		return err
	}
	return func(t *trial) (map[string]float64, error) { return e.roundTrips(t, op) }, cleanup, nil
}

func (e *env) sqliteCommits() (func(*trial) (map[string]float64, error), func(), error) {
	dir, err := os.MkdirTemp("", "cheetah-bench-commit-*")
	if err != nil {
		return nil, nil, err
	}
	// The pragmas of the history store: WAL, synchronous=FULL.
	db, err := sql.Open("sqlite", filepath.Join(dir, "commit.db")+"?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=busy_timeout(10000)")
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	db.SetMaxOpenConns(1)
	cleanup := func() { db.Close(); os.RemoveAll(dir) }
	if _, err := db.ExecContext(e.ctx, `CREATE TABLE rows (id INTEGER PRIMARY KEY, data TEXT NOT NULL)`); err != nil {
		return nil, cleanup, err
	}
	data := string(e.payload)
	op := func(ctx context.Context) error {
		_, err := db.ExecContext(ctx, `INSERT INTO rows (data) VALUES (?)`, data)
		return err
	}
	return func(t *trial) (map[string]float64, error) { return e.roundTrips(t, op) }, cleanup, nil
}
