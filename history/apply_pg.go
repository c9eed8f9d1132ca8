package history

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/stdlib"
)

// copyThreshold is the number of new commands from which a PostgreSQL batch
// inserts them with COPY rather than with one INSERT. COPY streams rows
// without a statement per batch size, but costs an explicit transaction and
// a round trip of its own, which only pays for large batches.
const copyThreshold = 256

// The PostgreSQL write path. Each statement is written once, with %s where
// its rows come from (pgRows), so that a batch of any size is these few
// statements, pipelined (pgBatch), each text prepared once per connection.
var (
	pgInsertCommands = newPGRows("history.InsertCommand", `INSERT INTO commands (command_id, user_id, client_id, context_id, task_id, epoch, name,
	params, target, options, response_mode, status, status_rank, error_code, error_message, error_data, trace_id,
	callback_url, callback_key_id, created_at, dispatched_at, acked_at, finished_at, delivery_next_at)
SELECT * FROM %s AS v`, pgInsertCommandTypes...)

	// One row change per command: see statusChange. Each timestamp, the
	// error and the due delivery apply only where the stored rank is below
	// the rank that set them; c.* on the right are the row before the
	// change.
	pgSetStatuses = newPGRows("history.SetStatus", `UPDATE commands AS c SET
	status = v.status,
	status_rank = v.rank,
	dispatched_at = CASE WHEN v.dispatched_at IS NOT NULL AND c.status_rank < 1 THEN v.dispatched_at ELSE c.dispatched_at END,
	acked_at = CASE WHEN v.acked_at IS NOT NULL AND c.status_rank < 2 THEN v.acked_at ELSE c.acked_at END,
	finished_at = CASE WHEN v.finished_at IS NOT NULL AND c.status_rank < 3 THEN v.finished_at ELSE c.finished_at END,
	delivery_next_at = CASE WHEN v.finished_at IS NOT NULL AND c.status_rank < 3 AND c.callback_url IS NOT NULL
		THEN v.finished_at ELSE c.delivery_next_at END,
	error_code = CASE WHEN v.error_rank > c.status_rank THEN v.error_code ELSE c.error_code END,
	error_message = CASE WHEN v.error_rank > c.status_rank THEN v.error_message ELSE c.error_message END,
	error_data = CASE WHEN v.error_rank > c.status_rank THEN v.error_data ELSE c.error_data END
FROM %s AS v(command_id, status, rank, dispatched_at, acked_at, finished_at, error_rank, error_code, error_message, error_data)
WHERE c.command_id = v.command_id AND c.status_rank < v.rank`,
		"text", "text", "int2", "timestamptz", "timestamptz", "timestamptz", "int2", "text", "text", "text")

	// The messages of commands the batch inserts, whose seq is known
	// (writePlan.splitMessages): no look-up of a last seq.
	pgInsertMessages = newPGRows("history.AppendMessage", `INSERT INTO messages (command_id, seq, kind, name, data, code, message, mime, blob, late, at)
SELECT * FROM %s AS v`, pgMessageTypes...)

	// Other messages are numbered as appendMessages always has: after the
	// command's last stored seq, in enqueue order (ord). The statement does
	// not see its own rows, so MAX is the one before the batch.
	pgAppendMessages = newPGRows("history.AppendMessage", `INSERT INTO messages (command_id, seq, kind, name, data, code, message, mime, blob, late, at)
SELECT v.command_id, COALESCE((SELECT MAX(m.seq) FROM messages AS m WHERE m.command_id = v.command_id), 0) + v.ord,
	v.kind, v.name, v.data, v.code, v.message, v.mime, v.blob, v.late, v.at
FROM %s AS v(command_id, ord, kind, name, data, code, message, mime, blob, late, at)`, pgMessageTypes...)

	pgSetDeliveries = newPGRows("history.SetDelivery", `UPDATE commands AS c SET
	delivery_attempts = v.attempts, delivered = v.delivered, delivery_last_error = v.last_error, delivery_next_at = v.next_at
FROM %s AS v(command_id, attempts, delivered, last_error, next_at)
WHERE c.command_id = v.command_id`, "text", "int4", "bool", "text", "timestamptz")
)

// pgInsertCommandTypes are the types of a command's values (commandValues).
var pgInsertCommandTypes = []string{"text", "text", "text", "text", "text", "int8", "text",
	"text", "text", "text", "text", "text", "int2", "text", "text", "text", "text",
	"text", "text", "timestamptz", "timestamptz", "timestamptz", "timestamptz", "timestamptz"}

// pgMessageTypes are the types of a message's values (messageRow.values).
var pgMessageTypes = []string{"text", "int8", "text", "text", "text", "text", "text", "text", "bytea", "bool", "timestamptz"}

// pgKeyedPlans sets how the batch's statements are planned, for its own
// transaction only. Every row they touch is found by its key, so:
//
//   - They use their generic plans: a plan does not depend on how many rows
//     a batch has, and planning an unnest over two dozen arrays for each
//     batch costs more than running it.
//   - Their joins to a table are nested loops over its key's index. A plan
//     is made once per connection and kept, and one made while the table
//     was small (a new database) joined by hashing a sequential scan of it:
//     each batch then read the whole table, so a batch's cost grew with the
//     history (commands' rows read by sequential scans during a 40,000
//     command ingest: 17.8 million, against none with these settings).
var pgKeyedPlans = newPGStmt(`SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
	set_config('enable_seqscan', 'off', true), set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)`)

// pgValuesRows is the number of rows from which a statement reads them from
// arrays rather than from VALUES. Below it VALUES costs less: a batch of one
// command's insert and its two messages, commit included, 430 against
// 480 µs on PostgreSQL 15; at seven commands both take about 700 µs. Its
// texts (one per row count) stay few enough to keep prepared on every
// connection.
const pgValuesRows = 8

// pgRows is a statement over rows of typed columns, with its texts: one per
// row count below pgValuesRows, reading the rows from VALUES, and one
// reading any number of them from arrays, one per column. A statement never
// sees its own writes, so both mean the same.
//
// The arrays are unnested in a select list (a ProjectSet, which hands on
// one row at a time), not in FROM: a function in FROM first copies all its
// rows into a tuplestore, and making and freeing one per statement (a
// 16 KiB allocation, and the backend's heap trimmed back by brk when the
// executor's memory is released) cost PostgreSQL more than the rows: the
// history ingest ran a quarter faster without it (bench/RESULTS.md).
type pgRows struct {
	name   string // what an error names
	width  int    // the number of columns
	values [pgValuesRows]pgStmt
	arrays pgStmt
}

// pgRowsAll is every pgRows, as newPGRows made them: what a test of their
// texts goes through.
var pgRowsAll []*pgRows

func newPGRows(name, text string, types ...string) *pgRows {
	st := &pgRows{name: name, width: len(types)}
	pgRowsAll = append(pgRowsAll, st)
	var b strings.Builder
	b.WriteString("(SELECT ")
	for j, t := range types {
		if j > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "unnest($%d::%s[])", j+1, t)
	}
	b.WriteString(")")
	st.arrays = newPGStmt(fmt.Sprintf(text, b.String()))
	for n := 1; n < pgValuesRows; n++ {
		b.Reset()
		b.WriteString("(VALUES ")
		for i := range n {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("(")
			for j, t := range types {
				if j > 0 {
					b.WriteString(", ")
				}
				fmt.Fprintf(&b, "$%d::%s", i*len(types)+j+1, t)
			}
			b.WriteString(")")
		}
		b.WriteString(")")
		st.values[n] = newPGStmt(fmt.Sprintf(text, b.String()))
	}
	return st
}

// queue adds st for n rows to b; row(i, vals) puts the i-th row's values
// in vals, in the statement's column order. Nothing is queued for no rows.
func (st *pgRows) queue(b *pgBatch, n int, row func(i int, vals []any)) {
	if n == 0 {
		return
	}
	w := st.width
	if n < pgValuesRows {
		args := b.take(n * w)
		for i := range n {
			row(i, args[i*w:(i+1)*w:(i+1)*w])
		}
		b.queue(st.name, st.values[n], args...)
		return
	}
	// One array per column, cut from one slice of cells, column after
	// column; pgx encodes each element as its own type.
	cells, vals, args := b.take(n*w), b.take(w), b.take(w)
	for i := range n {
		row(i, vals)
		for j, v := range vals {
			cells[j*n+i] = v
		}
	}
	for j := range args {
		args[j] = pgtype.FlatArray[any](cells[j*n : (j+1)*n : (j+1)*n])
	}
	b.queue(st.name, st.arrays, args...)
}

// pgCommandCols are the commands columns COPY fills, in commandValues's order.
var pgCommandCols = []string{"command_id", "user_id", "client_id", "context_id", "task_id", "epoch", "name",
	"params", "target", "options", "response_mode", "status", "status_rank", "error_code", "error_message", "error_data", "trace_id",
	"callback_url", "callback_key_id", "created_at", "dispatched_at", "acked_at", "finished_at", "delivery_next_at"}

// applyPostgres writes p on one pooled connection, through pgx. Without
// COPY the whole batch is one pipeline in the implicit transaction of its
// Sync: one round trip, and its commit, before the results come back. With
// COPY it is an explicit transaction: BEGIN, COPY, the pipeline, COMMIT.
func (s *Store) applyPostgres(ctx context.Context, p *writePlan) error {
	conn, err := s.sqlDB.Conn(ctx)
	if err != nil {
		return fail("history.begin", err)
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		pc := dc.(*stdlib.Conn).Conn()
		if p.empty() {
			// Nothing to write (a Write used as a barrier) still asks the
			// database, so that it says whether the database answers.
			return pc.Ping(ctx)
		}
		if len(p.cmds) < copyThreshold {
			return pgPipeline(ctx, pc, p, true)
		}
		tx, err := pc.Begin(ctx)
		if err != nil {
			return fail("history.begin", err)
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		vals := make([]any, len(pgCommandCols)) // CopyFrom encodes a row before it asks for the next
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"commands"}, pgCommandCols, pgx.CopyFromSlice(len(p.cmds), func(i int) ([]any, error) {
			commandValues(&p.cmds[i], vals)
			return vals, nil
		})); err != nil {
			return fail("history.InsertCommand", err)
		}
		if err := pgPipeline(ctx, tx.Conn(), p, false); err != nil {
			return err
		}
		return tx.Commit(ctx) // a failure here is the commit's: apply says so
	})
}

// pgPipeline sends p's statements as one pipeline and reads their results
// in order: the first failing statement names the error.
func pgPipeline(ctx context.Context, pc *pgx.Conn, p *writePlan, withInserts bool) error {
	var b pgBatch
	arrays := max(len(p.cmds), len(p.statuses), len(p.msgs), len(p.deliveries), len(p.leases)) >= pgValuesRows
	if arrays || len(p.statuses)+len(p.deliveries)+len(p.leases) > 0 {
		// Some statement reads arrays, or finds rows to change by their key.
		// Inserts alone need neither: a VALUES list plans in no time, and a
		// message's seq comes from the index of its command's messages.
		b.queue("history.begin", pgKeyedPlans)
	}
	plans := b.len()
	if withInserts {
		pgInsertCommands.queue(&b, len(p.cmds), func(i int, vals []any) { commandValues(&p.cmds[i], vals) })
	}
	pgSetStatuses.queue(&b, len(p.statuses), func(i int, vals []any) { p.statuses[i].pgValues(vals) })
	p.splitMessages()
	fresh, stored := p.freshMsgs, p.storedMsgs
	pgInsertMessages.queue(&b, len(fresh), func(i int, vals []any) { fresh[i].pgValues(vals) })
	pgAppendMessages.queue(&b, len(stored), func(i int, vals []any) { stored[i].pgValues(vals) })
	pgSetDeliveries.queue(&b, len(p.deliveries), func(i int, vals []any) { deliveryValues(&p.deliveries[i], vals) })
	queueLeases(&b, p.leases)
	if b.len() == plans {
		return nil
	}
	// In the implicit transaction, the end of the pipeline is past its
	// commit: an error there is the commit's.
	return b.send(ctx, pc)
}

// commandValues puts a command row's values in vals, in pgInsertCommands's
// (and pgCommandCols's) column order.
func commandValues(r *commandRow, vals []any) {
	_ = vals[23]
	vals[0], vals[1], vals[2], vals[3], vals[4] = pgText{&r.CommandID}, pgText{&r.UserID}, pgText{&r.ClientID}, pgText{&r.ContextID}, pgText{&r.TaskID}
	vals[5], vals[6] = pgInt[int64]{&r.Epoch}, pgText{&r.Name}
	vals[7], vals[8], vals[9], vals[10], vals[11] = pgText{r.Params}, pgText{r.Target}, pgText{r.Options}, pgText{&r.ResponseMode}, pgText{&r.Status}
	vals[12], vals[13], vals[14], vals[15] = pgInt[int]{&r.StatusRank}, pgText{r.ErrorCode}, pgText{r.ErrorMessage}, pgText{r.ErrorData}
	vals[16], vals[17], vals[18] = pgText{&r.TraceID}, pgText{r.CallbackURL}, pgText{r.CallbackKeyID}
	vals[19], vals[20], vals[21], vals[22], vals[23] = pgTime{&r.CreatedAt}, pgTime{r.DispatchedAt}, pgTime{r.AckedAt}, pgTime{r.FinishedAt}, pgTime{r.DeliveryNextAt}
}

// pgValues puts c's values in vals, in pgSetStatuses's column order.
func (c *statusChange) pgValues(vals []any) {
	code, msg, data := c.errCols()
	_ = vals[9]
	vals[0], vals[1], vals[2] = pgText{&c.commandID}, pgText{&c.status}, pgInt[int]{&c.rank}
	vals[3], vals[4], vals[5] = pgTime{c.at[1]}, pgTime{c.at[2]}, pgTime{c.at[3]}
	vals[6], vals[7], vals[8], vals[9] = pgInt[int]{&c.errRank}, pgText{code}, pgText{msg}, pgText{data}
}

// messageBlobCol is the place of a message's bytes among its values.
const messageBlobCol = 8

// values are r's values in the column order of SQLite's messages
// statement, with seq in its place.
func (r *messageRow) values(seq int64) []any {
	// Keep messageBlobCol, and pgValues, in step with this order.
	return []any{r.CommandID, seq, r.Kind, r.Name, r.Data, r.Code, r.Message, r.Mime, r.Blob, r.Late, r.At}
}

// pgValues puts r's values in vals, in the column order of the PostgreSQL
// messages statements, with its Seq in its place: its seq, or its place in
// the batch (ord) for pgAppendMessages.
func (r *messageRow) pgValues(vals []any) {
	_ = vals[10]
	vals[0], vals[1], vals[2], vals[3], vals[4] = pgText{&r.CommandID}, pgInt[int64]{&r.Seq}, pgText{&r.Kind}, pgText{&r.Name}, pgText{r.Data}
	vals[5], vals[6], vals[7], vals[8], vals[9], vals[10] = pgText{&r.Code}, pgText{&r.Message}, pgText{&r.Mime}, r.Blob, r.Late, pgTime{&r.At}
}

func deliveryValues(d *SetDelivery, vals []any) {
	_ = vals[4]
	vals[0], vals[1], vals[2], vals[3], vals[4] = d.CommandID, int32(d.Attempts), d.Delivered, text(d.LastError), utcPtr(&d.NextAt)
}
