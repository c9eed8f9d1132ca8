package history

import (
	"context"
	"database/sql"
	"strings"
)

// The SQLite write path, with the values rows.go makes, so that what is
// stored is what gorm stored. The driver parses every statement it runs
// again, prepared or not, so a batch's rows are inserted by one statement
// per kind (per sqliteStatementParams' worth of rows), with a VALUES list of
// them all; the updates run once per row, as database/sql statements
// prepared once per connection.
const (
	sqliteInsertCommands = `INSERT INTO commands (command_id, user_id, client_id, context_id, task_id, epoch, name,
	params, target, options, response_mode, status, status_rank, error_code, error_message, error_data, trace_id,
	callback_url, callback_key_id, created_at, dispatched_at, acked_at, finished_at,
	delivery_attempts, delivered, delivery_last_error, delivery_next_at)
VALUES `

	// See statusChange, and pgSetStatuses. The right-hand side reads the
	// row as it was before this UPDATE.
	sqliteSetStatus = `UPDATE commands SET
	status = ?2,
	status_rank = ?3,
	dispatched_at = CASE WHEN ?4 IS NOT NULL AND status_rank < 1 THEN ?4 ELSE dispatched_at END,
	acked_at = CASE WHEN ?5 IS NOT NULL AND status_rank < 2 THEN ?5 ELSE acked_at END,
	finished_at = CASE WHEN ?6 IS NOT NULL AND status_rank < 3 THEN ?6 ELSE finished_at END,
	delivery_next_at = CASE WHEN ?6 IS NOT NULL AND status_rank < 3 AND callback_url IS NOT NULL THEN ?6 ELSE delivery_next_at END,
	error_code = CASE WHEN ?7 > status_rank THEN ?8 ELSE error_code END,
	error_message = CASE WHEN ?7 > status_rank THEN ?9 ELSE error_message END,
	error_data = CASE WHEN ?7 > status_rank THEN ?10 ELSE error_data END
WHERE command_id = ?1 AND status_rank < ?3`

	// The messages of commands the batch inserts, whose seq is known.
	sqliteInsertMessages = `INSERT INTO messages (command_id, seq, kind, name, data, code, message, mime, blob, late, at)
VALUES `

	// Other messages are numbered as in pgAppendMessages: after the
	// command's last stored seq, in enqueue order (ord). The SELECT reads
	// the table it inserts into, so SQLite runs it to the end before
	// inserting: MAX is the one before the statement.
	sqliteAppendMessages     = `WITH v(command_id, ord, kind, name, data, code, message, mime, blob, late, at) AS (VALUES `
	sqliteAppendMessagesTail = `)
INSERT INTO messages (command_id, seq, kind, name, data, code, message, mime, blob, late, at)
SELECT v.command_id, COALESCE((SELECT MAX(m.seq) FROM messages AS m WHERE m.command_id = v.command_id), 0) + v.ord,
	v.kind, v.name, v.data, v.code, v.message, v.mime, v.blob, v.late, v.at
FROM v`

	sqliteSetDelivery = `UPDATE commands SET delivery_attempts = ?, delivered = ?, delivery_last_error = ?, delivery_next_at = ?
WHERE command_id = ?`
)

// applySQLite writes p in one transaction (BEGIN IMMEDIATE: see sqliteDSN).
func (s *Store) applySQLite(ctx context.Context, p *writePlan) (err error) {
	tx, err := s.sqlDB.BeginTx(ctx, nil)
	if err != nil {
		return fail("history.begin", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	st := &s.sqliteStmts
	if err := sqliteRows(ctx, tx, "history.InsertCommand", sqliteInsertCommands, "", len(p.cmds), func(i, _ int) []any {
		r := &p.cmds[i]
		return []any{r.CommandID, r.UserID, r.ClientID, r.ContextID, r.TaskID, r.Epoch, r.Name,
			r.Params, r.Target, r.Options, r.ResponseMode, r.Status, r.StatusRank, r.ErrorCode, r.ErrorMessage, r.ErrorData, r.TraceID,
			r.CallbackURL, r.CallbackKeyID, r.CreatedAt, r.DispatchedAt, r.AckedAt, r.FinishedAt,
			r.DeliveryAttempts, r.Delivered, r.DeliveryLastError, r.DeliveryNextAt}
	}); err != nil {
		return err
	}
	if err := sqliteEach(ctx, s.sqlDB, tx, &st.setStatus, "history.SetStatus", sqliteSetStatus, len(p.statuses), func(i int) []any {
		c := &p.statuses[i]
		code, msg, data := c.errCols()
		return []any{c.commandID, c.status, c.rank, c.at[1], c.at[2], c.at[3], c.errRank, code, msg, data}
	}); err != nil {
		return err
	}
	// The messages of a command this batch inserts are its first: their
	// places are their seq. The others go after their command's stored
	// ones (sqliteAppendMessages).
	var fresh, stored []*messageRow
	for i := range p.msgs {
		if r := &p.msgs[i]; p.isInserted(r.CommandID) {
			fresh = append(fresh, r)
		} else {
			stored = append(stored, r)
		}
	}
	if err := sqliteRows(ctx, tx, "history.AppendMessage", sqliteInsertMessages, "", len(fresh), func(i, _ int) []any {
		return fresh[i].values(fresh[i].Seq)
	}); err != nil {
		return err
	}
	// A statement's MAX sees the messages of the statements before it: a
	// message's ord counts from its command's last one there.
	var before map[string]int64
	counted := 0
	if err := sqliteRows(ctx, tx, "history.AppendMessage", sqliteAppendMessages, sqliteAppendMessagesTail, len(stored), func(i, first int) []any {
		for ; counted < first; counted++ {
			if before == nil {
				before = make(map[string]int64)
			}
			before[stored[counted].CommandID] = stored[counted].Seq
		}
		r := stored[i]
		return r.values(r.Seq - before[r.CommandID])
	}); err != nil {
		return err
	}
	if err := sqliteEach(ctx, s.sqlDB, tx, &st.setDelivery, "history.SetDelivery", sqliteSetDelivery, len(p.deliveries), func(i int) []any {
		d := &p.deliveries[i]
		return []any{d.Attempts, d.Delivered, text(d.LastError), utcPtr(&d.NextAt), d.CommandID}
	}); err != nil {
		return err
	}
	return tx.Commit() // a failure here is the commit's: apply says so
}

// sqliteStmts are the write path's statements, prepared on first use. Only
// the writer goroutine touches them.
type sqliteStmts struct {
	setStatus, setDelivery *sql.Stmt
}

// sqliteEach runs query in tx with args(i) for each of n rows. *stmt is
// query prepared on db, prepared here on first use; in tx it runs as the
// statement already prepared on tx's connection, or is prepared there once.
func sqliteEach(ctx context.Context, db *sql.DB, tx *sql.Tx, stmt **sql.Stmt, name, query string, n int, args func(int) []any) error {
	if n == 0 {
		return nil
	}
	if *stmt == nil {
		prepared, err := db.PrepareContext(ctx, query)
		if err != nil {
			return fail(name, err)
		}
		*stmt = prepared
	}
	txStmt := tx.StmtContext(ctx, *stmt)
	defer txStmt.Close()
	for i := range n {
		if _, err := txStmt.ExecContext(ctx, args(i)...); err != nil {
			return fail(name, err)
		}
	}
	return nil
}

// sqliteStatementParams bounds the parameters of one multi-row statement.
// The driver looks each parameter's argument up by scanning them all, so a
// statement's binding costs the square of its parameters: a hundred
// commands in one statement took longer to bind than a hundred statements
// took to parse. A few hundred parameters keep both small.
const sqliteStatementParams = 192

// sqliteRows runs head, a VALUES list of rows and tail in tx, for n rows in
// statements of at most sqliteStatementParams parameters (or one row);
// row(i, first) is the i-th row's values, in a statement whose first row is
// the first-th.
func sqliteRows(ctx context.Context, tx *sql.Tx, name, head, tail string, n int, row func(i, first int) []any) error {
	if n == 0 {
		return nil
	}
	width := len(row(0, 0))
	per := max(1, sqliteStatementParams/width)
	var q strings.Builder
	var args []any
	for start := 0; start < n; start += per {
		end := min(n, start+per)
		q.Reset()
		q.WriteString(head)
		args = args[:0]
		for i := start; i < end; i++ {
			if i > start {
				q.WriteString(", ")
			}
			q.WriteString("(?")
			q.WriteString(strings.Repeat(", ?", width-1))
			q.WriteString(")")
			args = append(args, row(i, start)...)
		}
		q.WriteString(tail)
		if _, err := tx.ExecContext(ctx, q.String(), args...); err != nil {
			return fail(name, err)
		}
	}
	return nil
}
