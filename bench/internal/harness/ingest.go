package harness

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/bench/internal/report"
	"github.com/cheetahbroker/cheetah/history"
)

const (
	peerCopyFrom        = "pgx CopyFrom of the same rows (floor)"
	peerHistoryPostgres = "Cheetah history store on PostgreSQL"
	peerHistorySQLite   = "Cheetah history store on SQLite"
)

// ingest is scenario 4: how fast commands become durable history.
func (e *env) ingest() *report.Scenario {
	c := e.cfg
	s := &report.Scenario{
		Number: 4, Key: "ingest", Title: "History ingest",
		Detail: fmt.Sprintf("%s per run (%s excluded) written by %s into a fresh, migrated database, %s. "+
			"Lifecycle: what the broker writes for one echo command, in its order — the insert (waited for), dispatched, the ack message with acknowledged, "+
			"then the result message (%d bytes) with completed (waited for); the floor copies the same rows, final state, with one COPY per table. "+
			"Insert only: the command row alone, against a COPY of the same rows. Records are built before the clock starts.",
			report.Count(c.IngestCommands, "command"), report.Count(c.IngestWarmup, "warm-up command"), report.Count(c.IngestProducers, "concurrent producer"), report.Count(c.Repeats, "run"), c.PayloadBytes),
		Columns: []report.Column{
			{Key: "lifecycle", Label: "lifecycle commands", Unit: "/s", Better: report.Higher},
			{Key: "insert", Label: "insert-only commands", Unit: "/s", Better: report.Higher},
			{Key: "ops_per_commit", Label: "lifecycle ops per commit", Unit: "ops", Better: report.Higher},
		},
	}
	s.Rows = append(s.Rows,
		e.row(s.Key, peerCopyFrom, false, e.copyIngest),
		e.row(s.Key, peerHistoryPostgres, true, e.historyIngest(true)),
		e.row(s.Key, peerHistorySQLite, true, e.historyIngest(false)),
	)
	return s
}

// ingestRecords builds n command records, as the registry would admit them.
func (e *env) ingestRecords(n int, rng *rand.Rand) []cheetah.CommandRecord {
	recs := make([]cheetah.CommandRecord, n)
	target := json.RawMessage(`{"tab_id":"1"}`)
	now := time.Now().UTC()
	var trace [16]byte
	for i := range recs {
		id := uuid.Must(uuid.NewV7())
		for j := range trace {
			trace[j] = byte(rng.UintN(256))
		}
		recs[i] = cheetah.CommandRecord{
			CommandID: id.String(), UserID: "usr_bench", ClientID: fmt.Sprintf("ingest-%d", i%16),
			ContextID: "flow-1", TaskID: "ingest", Epoch: int64(i + 1), Name: "echo",
			Params: e.payload, Target: target, ResponseMode: cheetah.ModeRPC,
			Status: cheetah.StatusAdmitted, TraceID: hex.EncodeToString(trace[:]), CreatedAt: now,
		}
	}
	return recs
}

// historyIngest measures the history store's writer on a fresh database
// per variant and run.
func (e *env) historyIngest(postgres bool) runner {
	return func() (func(*trial) (map[string]float64, error), func(), error) {
		if postgres && e.pgErr != nil {
			return nil, nil, absent(e.pgErr)
		}
		open := func(ctx context.Context) (*history.Store, func(), error) {
			if postgres {
				url, drop, err := e.pg.CreateDB(ctx, "ingest")
				if err != nil {
					return nil, nil, err
				}
				st, err := history.Open(ctx, history.Config{DatabaseURL: url})
				if err != nil {
					drop()
					return nil, nil, err
				}
				return st, func() { st.Close(); drop() }, nil
			}
			dir, err := os.MkdirTemp("", "cheetah-bench-ingest-*")
			if err != nil {
				return nil, nil, err
			}
			st, err := history.Open(ctx, history.Config{DataDir: dir})
			if err != nil {
				os.RemoveAll(dir)
				return nil, nil, err
			}
			return st, func() { st.Close(); os.RemoveAll(dir) }, nil
		}
		run := func(t *trial) (map[string]float64, error) {
			out := map[string]float64{}
			for _, lifecycle := range []bool{true, false} {
				rng := rand.New(rand.NewPCG(e.cfg.Seed, uint64(t.i)))
				warm := e.ingestRecords(e.cfg.IngestWarmup, rng)
				recs := e.ingestRecords(e.cfg.IngestCommands, rng)
				st, closeStore, err := open(t.ctx)
				if err != nil {
					return nil, err
				}
				if _, err := e.writeHistory(t.ctx, st, warm, lifecycle); err != nil {
					closeStore()
					return nil, fmt.Errorf("warm-up: %w", err)
				}
				before := st.Stats()
				var stop func()
				if lifecycle {
					stop = t.measuring()
				}
				d, err := e.writeHistory(t.ctx, st, recs, lifecycle)
				if stop != nil {
					stop()
				}
				after := st.Stats()
				closeStore()
				if err != nil {
					return nil, err
				}
				rate := float64(len(recs)) / d.Seconds()
				if lifecycle {
					out["lifecycle"] = rate
					if n := after.Batches - before.Batches; n > 0 {
						out["ops_per_commit"] = float64(after.Ops-before.Ops) / float64(n)
					}
				} else {
					out["insert"] = rate
				}
			}
			return out, nil
		}
		return run, nil, nil
	}
}

// writeHistory writes recs through the store with IngestProducers
// concurrent producers, and returns how long it took until the last was
// durable.
func (e *env) writeHistory(ctx context.Context, st *history.Store, recs []cheetah.CommandRecord, lifecycle bool) (time.Duration, error) {
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for range e.cfg.IngestProducers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(recs) || ctx.Err() != nil {
					return
				}
				if err := writeCommand(ctx, st, recs[i], e.payload, lifecycle); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	d := time.Since(start)
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return d, firstErr
}

// writeCommand writes one command the way the registry does: the insert
// waited for, the progress asynchronously, the end waited for.
func writeCommand(ctx context.Context, st *history.Store, rec cheetah.CommandRecord, result []byte, lifecycle bool) error {
	if err := st.Write(ctx, history.InsertCommand{Rec: rec}); err != nil {
		return err
	}
	if !lifecycle {
		return nil
	}
	id := rec.CommandID
	now := time.Now()
	st.WriteAsync(nil, history.SetStatus{CommandID: id, Status: cheetah.StatusDispatched, At: now})
	st.WriteAsync(nil,
		history.AppendMessage{CommandID: id, Msg: cheetah.Message{Kind: cheetah.KindAck, At: now}},
		history.SetStatus{CommandID: id, Status: cheetah.StatusAcknowledged, At: now})
	return st.Write(ctx,
		history.AppendMessage{CommandID: id, Msg: cheetah.Message{Kind: cheetah.KindResult, Data: result, At: now}},
		history.SetStatus{CommandID: id, Status: cheetah.StatusCompleted, At: now})
}

// copyIngest is the floor: the same rows by COPY, into the same schema.
func (e *env) copyIngest() (func(*trial) (map[string]float64, error), func(), error) {
	if e.pgErr != nil {
		return nil, nil, absent(e.pgErr)
	}
	run := func(t *trial) (map[string]float64, error) {
		out := map[string]float64{}
		for _, lifecycle := range []bool{true, false} {
			rng := rand.New(rand.NewPCG(e.cfg.Seed, uint64(t.i)))
			warm := e.ingestRecords(e.cfg.IngestWarmup, rng)
			recs := e.ingestRecords(e.cfg.IngestCommands, rng)
			d, err := e.copyOnce(t.ctx, warm, recs, lifecycle)
			if err != nil {
				return nil, err
			}
			key := "insert"
			if lifecycle {
				key = "lifecycle"
			}
			out[key] = float64(len(recs)) / d.Seconds()
		}
		return out, nil
	}
	return run, nil, nil
}

var commandColumns = []string{"command_id", "user_id", "client_id", "context_id", "task_id", "epoch", "name", "params", "target",
	"response_mode", "status", "status_rank", "trace_id", "created_at", "dispatched_at", "acked_at", "finished_at"}

var messageColumns = []string{"command_id", "seq", "kind", "data", "at"}

// copyOnce makes a fresh database with Cheetah's schema, copies the warm-up
// rows, then times the copy of recs.
func (e *env) copyOnce(ctx context.Context, warm, recs []cheetah.CommandRecord, lifecycle bool) (time.Duration, error) {
	url, drop, err := e.pg.CreateDB(ctx, "copy")
	if err != nil {
		return 0, err
	}
	defer drop()
	st, err := history.Open(ctx, history.Config{DatabaseURL: url}) // the schema, migrated
	if err != nil {
		return 0, err
	}
	st.Close()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	rows := func(recs []cheetah.CommandRecord) (cmds, msgs [][]any) {
		now := time.Now().UTC()
		cmds = make([][]any, len(recs))
		for i, r := range recs {
			status, rank := cheetah.StatusAdmitted, 0
			var dispatched, acked, finished any
			if lifecycle {
				status, rank = cheetah.StatusCompleted, 3
				dispatched, acked, finished = now, now, now
			}
			cmds[i] = []any{r.CommandID, r.UserID, r.ClientID, r.ContextID, r.TaskID, r.Epoch, r.Name, string(r.Params), string(r.Target),
				string(r.ResponseMode), string(status), rank, r.TraceID, r.CreatedAt, dispatched, acked, finished}
			if lifecycle {
				msgs = append(msgs,
					[]any{r.CommandID, int64(1), string(cheetah.KindAck), nil, now},
					[]any{r.CommandID, int64(2), string(cheetah.KindResult), string(e.payload), now})
			}
		}
		return cmds, msgs
	}
	copyRows := func(cmds, msgs [][]any) error {
		if _, err := conn.CopyFrom(ctx, pgx.Identifier{"commands"}, commandColumns, pgx.CopyFromRows(cmds)); err != nil {
			return err
		}
		if len(msgs) > 0 {
			if _, err := conn.CopyFrom(ctx, pgx.Identifier{"messages"}, messageColumns, pgx.CopyFromRows(msgs)); err != nil {
				return err
			}
		}
		return nil
	}
	if err := copyRows(rows(warm)); err != nil {
		return 0, fmt.Errorf("warm-up copy: %w", err)
	}
	cmds, msgs := rows(recs)
	start := time.Now()
	if err := copyRows(cmds, msgs); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}
