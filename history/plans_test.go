package history_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/history/historytest"
)

// The writer's plans are made on a new, nearly empty database and kept on
// its connections. Status changes made once the history has grown must
// still find their rows by key, not by reading the whole table: PostgreSQL
// counts the rows its sequential scans of commands read.
func TestPostgresStatusChangesFindRowsByKeyAsHistoryGrows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := historytest.NewPostgres(t)
	db := historytest.DB(t, s)

	var recs []cheetah.CommandRecord
	insert := func(n int) {
		t.Helper()
		ops := make([]history.Op, n)
		for i := range ops {
			rec := cheetah.CommandRecord{
				CommandID: fmt.Sprintf("cmd-%06d", len(recs)), UserID: "u1", ClientID: "c1", ContextID: "x1", TaskID: "t1",
				Epoch: 1, Name: "echo", ResponseMode: cheetah.ModeRPC, TraceID: "0123456789abcdef0123456789abcdef",
				CreatedAt: time.Now().UTC(),
			}
			recs = append(recs, rec)
			ops[i] = history.InsertCommand{Rec: rec}
		}
		require.NoError(t, s.Write(ctx, ops...))
	}
	updates := 0
	// advance moves recs[from:from+n] to st in one batch: with 8 rows or
	// more the batch reads them from arrays, with fewer from VALUES.
	advance := func(from, n int, st cheetah.Status) {
		t.Helper()
		ops := make([]history.Op, n)
		for i := range ops {
			ops[i] = history.SetStatus{CommandID: recs[from+i].CommandID, Status: st}
		}
		require.NoError(t, s.Write(ctx, ops...))
		updates += n
	}

	// Plans made while the table holds a few rows.
	insert(10)
	advance(0, 10, cheetah.StatusDispatched)
	advance(0, 3, cheetah.StatusAcknowledged)
	advance(3, 3, cheetah.StatusAcknowledged)

	// The history grows, and status changes go on.
	const grown = 3000
	for len(recs) < grown {
		insert(500)
	}
	for i := range 20 {
		advance(1000+10*i, 10, cheetah.StatusDispatched)
		advance(2000+3*i, 3, cheetah.StatusDispatched)
	}
	// The store's sessions report their counts as they end.
	require.NoError(t, s.Close())

	var upd, seqRead int64
	require.Eventually(t, func() bool {
		require.NoError(t, db.QueryRow(`SELECT n_tup_upd, seq_tup_read FROM pg_stat_user_tables WHERE relname = 'commands'`).Scan(&upd, &seqRead))
		return upd >= int64(updates)
	}, 20*time.Second, 20*time.Millisecond)
	require.EqualValues(t, updates, upd)
	// One sequential scan of the grown table alone would read 3,000 rows.
	require.Less(t, seqRead, int64(grown), "rows of commands read by sequential scans")
}

// Retention finds the old commands by a range of the primary key, not by
// reading the whole table: there is no index on created_at for it.
func TestPostgresPurgeFindsRowsByKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := historytest.NewPostgres(t)
	db := historytest.DB(t, s)

	const recent, old = 3000, 10
	now := time.Now()
	for batch := range recent / 500 {
		ops := make([]history.Op, 500)
		for i := range ops {
			ops[i] = history.InsertCommand{Rec: cheetah.CommandRecord{
				CommandID: historytest.CommandIDAt(now), UserID: "u1", ClientID: "c1", ContextID: "x1",
				TaskID: fmt.Sprintf("t%d", batch), Epoch: 1, Name: "echo", ResponseMode: cheetah.ModeAsync,
				Status: cheetah.StatusCompleted, TraceID: "0123456789abcdef0123456789abcdef", CreatedAt: now,
			}}
		}
		require.NoError(t, s.Write(ctx, ops...))
	}
	ops := make([]history.Op, old)
	for i := range ops {
		at := now.Add(-48 * time.Hour)
		ops[i] = history.InsertCommand{Rec: cheetah.CommandRecord{
			CommandID: historytest.CommandIDAt(at), UserID: "u1", ClientID: "c1", ContextID: "x1",
			TaskID: "t", Epoch: 1, Name: "echo", ResponseMode: cheetah.ModeAsync,
			Status: cheetah.StatusCompleted, TraceID: "0123456789abcdef0123456789abcdef", CreatedAt: at,
		}}
	}
	require.NoError(t, s.Write(ctx, ops...))
	// As autovacuum would have by now on a table this size.
	_, err := db.ExecContext(ctx, "ANALYZE commands")
	require.NoError(t, err)
	var before int64
	require.NoError(t, db.QueryRow(`SELECT seq_tup_read FROM pg_stat_user_tables WHERE relname = 'commands'`).Scan(&before))

	n, err := s.PurgeBefore(ctx, now.Add(-24*time.Hour))
	require.NoError(t, err)
	require.EqualValues(t, old, n)
	// The store's sessions report their counts as they end.
	require.NoError(t, s.Close())

	var deleted, seqRead int64
	require.Eventually(t, func() bool {
		require.NoError(t, db.QueryRow(`SELECT n_tup_del, seq_tup_read FROM pg_stat_user_tables WHERE relname = 'commands'`).Scan(&deleted, &seqRead))
		return deleted >= old
	}, 20*time.Second, 20*time.Millisecond)
	require.Less(t, seqRead-before, int64(recent), "rows of commands read by sequential scans")
}

// A message of a command its batch inserts is its command's first, so its
// seq is known: the writer looks up no last seq for it, on either path
// (VALUES below eight rows, arrays above). A message for a stored command
// does look it up, in the index of its command's messages.
func TestPostgresFreshMessagesLookUpNoSeq(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := historytest.NewPostgres(t)
	db := historytest.DB(t, s)

	now := time.Now().UTC()
	insert := func(id string) history.Op {
		return history.InsertCommand{Rec: cheetah.CommandRecord{
			CommandID: id, UserID: "u1", ClientID: "c1", ContextID: "x1", TaskID: "t", Epoch: 1, Name: "echo",
			ResponseMode: cheetah.ModeRPC, TraceID: "0123456789abcdef0123456789abcdef", CreatedAt: now,
		}}
	}
	// n commands, each inserted with its two messages and its end.
	lifecycle := func(n int) []history.Op {
		var ops []history.Op
		for range n {
			id := historytest.CommandIDAt(now)
			ops = append(ops, insert(id),
				history.AppendMessage{CommandID: id, Msg: cheetah.Message{Kind: cheetah.KindAck, At: now}},
				history.AppendMessage{CommandID: id, Msg: cheetah.Message{Kind: cheetah.KindResult, At: now}},
				history.SetStatus{CommandID: id, Status: cheetah.StatusCompleted, At: now},
			)
		}
		return ops
	}
	for range 5 {
		require.NoError(t, s.Write(ctx, lifecycle(1)...))
	}
	require.NoError(t, s.Write(ctx, lifecycle(10)...))
	const fresh = 2 * (5 + 10)
	last := historytest.CommandIDAt(now)
	require.NoError(t, s.Write(ctx, insert(last)))
	require.NoError(t, s.Write(ctx, history.AppendMessage{CommandID: last, Msg: cheetah.Message{Kind: cheetah.KindProgress, At: now}}))
	// The store's sessions report their counts as they end.
	require.NoError(t, s.Close())

	inserted := int64(fresh + 1)
	var ins, scans int64
	require.Eventually(t, func() bool {
		require.NoError(t, db.QueryRow(`SELECT t.n_tup_ins, i.idx_scan FROM pg_stat_user_tables AS t, pg_stat_user_indexes AS i
WHERE t.relname = 'messages' AND i.indexrelname = 'messages_pkey'`).Scan(&ins, &scans))
		return ins >= inserted
	}, 20*time.Second, 20*time.Millisecond)
	require.EqualValues(t, inserted, ins)
	require.Positive(t, scans, "the stored command's message looks up its last seq")
	require.Less(t, scans, int64(fresh), "look-ups in the index of messages")

	// Numbered all the same: 1 and 2 for each command, 1 for the stored
	// command's message.
	var bad int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM messages
WHERE seq <> CASE kind WHEN 'result' THEN 2 ELSE 1 END`).Scan(&bad))
	require.Zero(t, bad, "messages out of their seq")
}

// A statement reading its rows from arrays hands them on one at a time
// (ProjectSet) instead of copying them first into a tuplestore (a Function
// Scan): making and freeing one per statement cost PostgreSQL more than the
// rows. Checked on each statement's generic plan, the one the writer runs.
func TestPostgresArrayRowsAreNotMaterialized(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := historytest.NewPostgres(t)
	conn, err := historytest.DB(t, s).Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.ExecContext(ctx, "SET plan_cache_mode = force_generic_plan")
	require.NoError(t, err)

	stmts := history.PGArrayStatements()
	require.NotEmpty(t, stmts)
	for i, st := range stmts {
		name := fmt.Sprintf("arrays_%d", i)
		_, err := conn.ExecContext(ctx, fmt.Sprintf("PREPARE %s AS %s", name, st.SQL))
		require.NoError(t, err, st.SQL)
		rows, err := conn.QueryContext(ctx, fmt.Sprintf("EXPLAIN EXECUTE %s(%s)", name, strings.TrimSuffix(strings.Repeat("NULL, ", st.Width), ", ")))
		require.NoError(t, err, st.SQL)
		var plan strings.Builder
		for rows.Next() {
			var line string
			require.NoError(t, rows.Scan(&line))
			plan.WriteString(line + "\n")
		}
		require.NoError(t, rows.Err())
		require.Contains(t, plan.String(), "ProjectSet", "%s:\n%s\n%s", st.Name, st.SQL, plan.String())
		require.NotContains(t, plan.String(), "Function Scan", "%s:\n%s\n%s", st.Name, st.SQL, plan.String())
	}
}

// A batch's parameters are encoded once, into a buffer the store keeps
// from batch to batch: pgx's own batch encoded each statement's parameters
// into a buffer that it grew from 256 bytes again for every statement, so
// a batch allocated about twice what it had to send (once for that buffer,
// once for the wire message). Bytes allocated by a Write of 64 commands
// with 2 KiB of params and 2 KiB of result each, against those 256 KiB:
// 9.3 times them with pgx's batch, 3.8 with the store's buffer.
func TestPostgresBatchEncodesParametersOnce(t *testing.T) {
	ctx := context.Background()
	s := historytest.NewPostgres(t)
	payload := json.RawMessage(`{"pad":"` + strings.Repeat("x", 2040) + `"}`)
	now := time.Now().UTC()
	const n = 64
	batch := func() []history.Op {
		var ops []history.Op
		for range n {
			id := historytest.CommandIDAt(now)
			ops = append(ops, history.InsertCommand{Rec: cheetah.CommandRecord{
				CommandID: id, UserID: "u1", ClientID: "c1", ContextID: "x1", TaskID: "t", Epoch: 1, Name: "echo",
				Params: payload, ResponseMode: cheetah.ModeRPC, TraceID: "0123456789abcdef0123456789abcdef", CreatedAt: now,
			}},
				history.AppendMessage{CommandID: id, Msg: cheetah.Message{Kind: cheetah.KindAck, At: now}},
				history.AppendMessage{CommandID: id, Msg: cheetah.Message{Kind: cheetah.KindResult, Data: payload, At: now}},
				history.SetStatus{CommandID: id, Status: cheetah.StatusCompleted, At: now},
			)
		}
		return ops
	}
	require.NoError(t, s.Write(ctx, batch()...)) // prepares the statements
	sent := float64(2 * n * len(payload))
	least := math.Inf(1)
	// A collection empties the pools, and under the race detector a pool
	// drops a quarter of what it is given: no collection while measuring,
	// and the least of ten.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	for range 10 {
		ops := batch()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		require.NoError(t, s.Write(ctx, ops...))
		runtime.ReadMemStats(&after)
		least = min(least, float64(after.TotalAlloc-before.TotalAlloc))
	}
	t.Logf("%.1f bytes allocated per byte of parameters (%.0f for %.0f)", least/sent, least, sent)
	require.Less(t, least/sent, 6.0, "bytes allocated per byte of parameters")
}
