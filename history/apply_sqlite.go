package history

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"strings"
)

// The SQLite write path, with the values rows.go makes, so that what is
// stored is what gorm stored. The driver keeps a statement it prepared, so
// every statement here is prepared once on the writer's connection and run
// again with new arguments (sqliteConn): a batch's rows are inserted by one
// statement per kind (per sqliteStatementParams' worth of rows), with a
// VALUES list of them all, and the updates run once per row.
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

	// A message's row in a VALUES list. The driver binds an empty []byte
	// as NULL, so an empty capture's bytes are bound as empty text
	// (sqliteMessageValues) and made a blob here: an empty capture stores
	// an empty blob, as on PostgreSQL, and a message without bytes NULL.
	sqliteMessageRow = `(?, ?, ?, ?, ?, ?, ?, ?, CAST(? AS BLOB), ?, ?)`

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

// applySQLite writes p in one transaction on the writer's own connection
// (sqliteConn).
func (s *Store) applySQLite(ctx context.Context, p *writePlan) (err error) {
	st := &s.sqliteConn
	if err := st.begin(ctx, s.sqlDB); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			st.rollback()
		}
	}()
	if err := st.rows("history.InsertCommand", sqliteInsertCommands, sqliteCommandRow, "", len(p.cmds), func(i, _ int) []any {
		r := &p.cmds[i]
		return []any{r.CommandID, r.UserID, r.ClientID, r.ContextID, r.TaskID, r.Epoch, r.Name,
			r.Params, r.Target, r.Options, r.ResponseMode, r.Status, r.StatusRank, r.ErrorCode, r.ErrorMessage, r.ErrorData, r.TraceID,
			r.CallbackURL, r.CallbackKeyID, r.CreatedAt, r.DispatchedAt, r.AckedAt, r.FinishedAt,
			r.DeliveryAttempts, r.Delivered, r.DeliveryLastError, r.DeliveryNextAt}
	}); err != nil {
		return err
	}
	if err := st.each("history.SetStatus", sqliteSetStatus, len(p.statuses), func(i int) []any {
		c := &p.statuses[i]
		code, msg, data := c.errCols()
		return []any{c.commandID, c.status, c.rank, c.at[1], c.at[2], c.at[3], c.errRank, code, msg, data}
	}); err != nil {
		return err
	}
	// The messages of a command this batch inserts are its first: their
	// places are their seq. The others go after their command's stored
	// ones (sqliteAppendMessages).
	p.splitMessages()
	fresh, stored := p.freshMsgs, p.storedMsgs
	if err := st.rows("history.AppendMessage", sqliteInsertMessages, sqliteMessageRow, "", len(fresh), func(i, _ int) []any {
		return sqliteMessageValues(fresh[i], fresh[i].Seq)
	}); err != nil {
		return err
	}
	// A statement's MAX sees the messages of the statements before it: a
	// message's ord counts from its command's last one there.
	var before map[string]int64
	counted := 0
	if err := st.rows("history.AppendMessage", sqliteAppendMessages, sqliteMessageRow, sqliteAppendMessagesTail, len(stored), func(i, first int) []any {
		for ; counted < first; counted++ {
			if before == nil {
				before = make(map[string]int64)
			}
			before[stored[counted].CommandID] = stored[counted].Seq
		}
		r := stored[i]
		return sqliteMessageValues(r, r.Seq-before[r.CommandID])
	}); err != nil {
		return err
	}
	if err := st.each("history.SetDelivery", sqliteSetDelivery, len(p.deliveries), func(i int) []any {
		d := &p.deliveries[i]
		return []any{d.Attempts, d.Delivered, text(d.LastError), utcPtr(&d.NextAt), d.CommandID}
	}); err != nil {
		return err
	}
	if err := st.commit(); err != nil {
		return err // the commit's: apply says so
	}
	s.checkpoints.committed()
	return nil
}

// sqliteCommandRow is a command's row in a VALUES list: one parameter per
// column of sqliteInsertCommands.
var sqliteCommandRow = "(?" + strings.Repeat(", ?", 26) + ")"

// sqliteMessageValues are r's values for sqliteMessageRow, with seq in its
// place: an empty capture's bytes as empty text, which the row casts to an
// empty blob.
func sqliteMessageValues(r *messageRow, seq int64) []any {
	v := r.values(seq)
	if r.Blob != nil && len(r.Blob) == 0 {
		v[messageBlobCol] = ""
	}
	return v
}

// sqliteConn is the write path's connection, kept by the writer for its
// transactions, and its statements, each prepared on it once (a multi-row
// statement once per row count, at most sqliteStatementParams of them per
// kind). Everything runs under a context that is never done: the driver
// watches a context that can end with a goroutine per statement, and
// database/sql a transaction's with another, each one more wake-up on a
// round trip's path. SQLite bounds its own lock waits (busy_timeout), and a
// transaction that is running is not interrupted. Only the writer
// goroutine touches it; Close closes it.
type sqliteConn struct {
	conn   *sql.Conn
	byText map[string]*sql.Stmt
	byRows map[rowsKey]*sql.Stmt // the multi-row ones of byText again
	// autoCheckpoint, when set, is the connection's wal_autocheckpoint:
	// with a checkpointer beside the writer, only a bound on the log.
	autoCheckpoint int
}

// sqliteBegin takes the write lock at once, as the pool's transactions do
// (see sqliteDSN): a transaction that only later asked for it could fail
// with SQLITE_BUSY instead of waiting.
const sqliteBegin = "BEGIN IMMEDIATE"

// begin starts a transaction, on a connection of db's taken first if the
// writer holds none.
func (st *sqliteConn) begin(ctx context.Context, db *sql.DB) error {
	if st.conn == nil {
		conn, err := db.Conn(ctx)
		if err != nil {
			return fail("history.begin", err)
		}
		st.conn = conn
		if st.autoCheckpoint > 0 {
			if err := st.run("history.begin", fmt.Sprintf("PRAGMA wal_autocheckpoint = %d", st.autoCheckpoint)); err != nil {
				st.close()
				return err
			}
		}
	}
	if err := st.run("history.begin", sqliteBegin); err != nil {
		st.close() // broken, or its lock refused: the next batch takes another
		return err
	}
	return nil
}

// commit ends the transaction.
func (st *sqliteConn) commit() error { return st.run("history.commit", "COMMIT") }

// rollback ends a transaction that failed. A connection where that fails
// too (or that SQLite rolled back itself) is given up, with its statements.
func (st *sqliteConn) rollback() {
	if st.conn == nil {
		return
	}
	if err := st.run("history.rollback", "ROLLBACK"); err != nil {
		st.close()
	}
}

// run runs query, a statement without arguments.
func (st *sqliteConn) run(name, query string) error {
	return st.each(name, query, 1, func(int) []any { return nil })
}

// stmt returns query prepared on the connection, once.
func (st *sqliteConn) stmt(name, query string) (*sql.Stmt, error) {
	if stmt := st.byText[query]; stmt != nil {
		return stmt, nil
	}
	stmt, err := st.conn.PrepareContext(context.Background(), query)
	if err != nil {
		return nil, fail(name, err)
	}
	if st.byText == nil {
		st.byText = make(map[string]*sql.Stmt)
	}
	st.byText[query] = stmt
	return stmt, nil
}

// close closes every statement and gives the connection up: back to the
// pool's for closing, never to another user, since it may be inside a
// transaction.
func (st *sqliteConn) close() {
	for _, stmt := range st.byText {
		_ = stmt.Close()
	}
	st.byText, st.byRows = nil, nil
	if st.conn != nil {
		_ = st.conn.Raw(func(any) error { return driver.ErrBadConn })
		_ = st.conn.Close()
		st.conn = nil
	}
}

// each runs query with args(i) for each of n rows.
func (st *sqliteConn) each(name, query string, n int, args func(int) []any) error {
	if n == 0 {
		return nil
	}
	stmt, err := st.stmt(name, query)
	if err != nil {
		return err
	}
	for i := range n {
		if _, err := stmt.ExecContext(context.Background(), args(i)...); err != nil {
			return fail(name, err)
		}
	}
	return nil
}

// sqliteStatementParams bounds the parameters of one multi-row statement,
// and so the texts prepared per kind: one per row count up to it.
const sqliteStatementParams = 192

// rows runs head, a VALUES list of n rows (each rowSQL) and tail, in
// statements of at most sqliteStatementParams parameters (or one row);
// row(i, first) is the i-th row's values, in a statement whose first row is
// the first-th.
func (st *sqliteConn) rows(name, head, rowSQL, tail string, n int, row func(i, first int) []any) error {
	if n == 0 {
		return nil
	}
	width := strings.Count(rowSQL, "?")
	per := max(1, sqliteStatementParams/width)
	var args []any
	for start := 0; start < n; start += per {
		end := min(n, start+per)
		key := rowsKey{head, end - start}
		stmt := st.byRows[key]
		if stmt == nil {
			var q strings.Builder
			q.WriteString(head)
			for i := range end - start {
				if i > 0 {
					q.WriteString(", ")
				}
				q.WriteString(rowSQL)
			}
			q.WriteString(tail)
			var err error
			if stmt, err = st.stmt(name, q.String()); err != nil {
				return err
			}
			if st.byRows == nil {
				st.byRows = make(map[rowsKey]*sql.Stmt)
			}
			st.byRows[key] = stmt
		}
		args = args[:0]
		for i := start; i < end; i++ {
			args = append(args, row(i, start)...)
		}
		if _, err := stmt.ExecContext(context.Background(), args...); err != nil {
			return fail(name, err)
		}
	}
	return nil
}

// rowsKey names a multi-row statement: its head (each kind has its own)
// and its row count. Finding it so spares writing out its text per batch.
type rowsKey struct {
	head string
	rows int
}
