package history

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// copyThreshold is the number of new commands from which a PostgreSQL batch
// inserts them with COPY rather than with one INSERT. COPY streams rows
// without a statement per batch size, but costs an explicit transaction and
// a round trip of its own, which only pays for large batches.
const copyThreshold = 256

// The PostgreSQL write path. Every statement takes its rows as arrays, so
// its text does not depend on the batch: pgx prepares each once per
// connection and a batch of any size is these few statements, pipelined.
const (
	pgInsertCommands = `INSERT INTO commands (command_id, user_id, client_id, context_id, task_id, epoch, name,
	params, target, options, response_mode, status, status_rank, error_code, error_message, error_data, trace_id,
	callback_url, callback_key_id, created_at, dispatched_at, acked_at, finished_at, delivery_next_at)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int8[], $7::text[],
	$8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::int2[], $14::text[], $15::text[], $16::text[], $17::text[],
	$18::text[], $19::text[], $20::timestamptz[], $21::timestamptz[], $22::timestamptz[], $23::timestamptz[], $24::timestamptz[])`

	// One row change per command: see statusChange. Each timestamp, the
	// error and the due delivery apply only where the stored rank is below
	// the rank that set them; c.* on the right are the row before the
	// change.
	pgSetStatuses = `UPDATE commands AS c SET
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
FROM unnest($1::text[], $2::text[], $3::int2[], $4::timestamptz[], $5::timestamptz[], $6::timestamptz[],
	$7::int2[], $8::text[], $9::text[], $10::text[])
	AS v(command_id, status, rank, dispatched_at, acked_at, finished_at, error_rank, error_code, error_message, error_data)
WHERE c.command_id = v.command_id AND c.status_rank < v.rank`

	// Messages are numbered as appendMessages always has: after the
	// command's last stored seq, in enqueue order (ord). The statement does
	// not see its own rows, so MAX is the one before the batch.
	pgAppendMessages = `INSERT INTO messages (command_id, seq, kind, name, data, code, message, mime, blob, late, at)
SELECT v.command_id, COALESCE((SELECT MAX(m.seq) FROM messages AS m WHERE m.command_id = v.command_id), 0) + v.ord,
	v.kind, v.name, v.data, v.code, v.message, v.mime, v.blob, v.late, v.at
FROM unnest($1::text[], $2::int8[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
	$9::bytea[], $10::bool[], $11::timestamptz[])
	AS v(command_id, ord, kind, name, data, code, message, mime, blob, late, at)`

	pgSetDeliveries = `UPDATE commands AS c SET
	delivery_attempts = v.attempts, delivered = v.delivered, delivery_last_error = v.last_error, delivery_next_at = v.next_at
FROM unnest($1::text[], $2::int4[], $3::bool[], $4::text[], $5::timestamptz[])
	AS v(command_id, attempts, delivered, last_error, next_at)
WHERE c.command_id = v.command_id`
)

// pgCommandCols are the commands columns COPY fills, in copyRow's order.
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
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"commands"}, pgCommandCols, pgx.CopyFromSlice(len(p.cmds), func(i int) ([]any, error) {
			return copyRow(&p.cmds[i]), nil
		})); err != nil {
			return fail("history.InsertCommand", err)
		}
		if err := pgPipeline(ctx, tx.Conn(), p, false); err != nil {
			return err
		}
		return tx.Commit(ctx) // a failure here is the commit's: apply says so
	})
}

// pgPipeline sends p's statements as one batch and reads their results in
// order: the first failing statement names the error.
func pgPipeline(ctx context.Context, pc *pgx.Conn, p *writePlan, withInserts bool) error {
	var b pgx.Batch
	var names []string
	if withInserts && len(p.cmds) > 0 {
		b.Queue(pgInsertCommands, commandArrays(p.cmds)...)
		names = append(names, "history.InsertCommand")
	}
	if len(p.statuses) > 0 {
		b.Queue(pgSetStatuses, statusArrays(p.statuses)...)
		names = append(names, "history.SetStatus")
	}
	if len(p.msgs) > 0 {
		b.Queue(pgAppendMessages, messageArrays(p.msgs)...)
		names = append(names, "history.AppendMessage")
	}
	if len(p.deliveries) > 0 {
		b.Queue(pgSetDeliveries, deliveryArrays(p.deliveries)...)
		names = append(names, "history.SetDelivery")
	}
	news, expiries, claims, del := leaseArrays(p.leases)
	for _, st := range []struct {
		sql, name string
		args      []any
	}{{pgNewLeases, "history.PutLease", news}, {pgLeaseExpiries, "history.PutLease", expiries},
		{pgClaimLeases, "history.PutLease", claims}, {pgDeleteLeases, "history.DeleteLease", del}} {
		if st.args != nil {
			b.Queue(st.sql, st.args...)
			names = append(names, st.name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	br := pc.SendBatch(ctx, &b)
	for _, name := range names {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return fail(name, err)
		}
	}
	// Close reads to the end of the pipeline: in the implicit transaction,
	// past its commit. An error there is the commit's.
	return br.Close()
}

func copyRow(r *commandRow) []any {
	return []any{r.CommandID, r.UserID, r.ClientID, r.ContextID, r.TaskID, r.Epoch, r.Name,
		r.Params, r.Target, r.Options, r.ResponseMode, r.Status, int16(r.StatusRank), r.ErrorCode, r.ErrorMessage, r.ErrorData, r.TraceID,
		r.CallbackURL, r.CallbackKeyID, r.CreatedAt, r.DispatchedAt, r.AckedAt, r.FinishedAt, r.DeliveryNextAt}
}

func commandArrays(rows []commandRow) []any {
	n := len(rows)
	var (
		id, user, client, ctxID, task, name, mode, status, trace = make([]string, n), make([]string, n), make([]string, n),
			make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		epoch                                             = make([]int64, n)
		rank                                              = make([]int16, n)
		params, target, options, errCode, errMsg, errData = make([]*string, n), make([]*string, n), make([]*string, n), make([]*string, n), make([]*string, n), make([]*string, n)
		callback, callbackKey                             = make([]*string, n), make([]*string, n)
		created                                           = make([]time.Time, n)
		dispatched, acked, finished, due                  = make([]*time.Time, n), make([]*time.Time, n), make([]*time.Time, n), make([]*time.Time, n)
	)
	for i := range rows {
		r := &rows[i]
		id[i], user[i], client[i], ctxID[i], task[i], epoch[i], name[i] = r.CommandID, r.UserID, r.ClientID, r.ContextID, r.TaskID, r.Epoch, r.Name
		params[i], target[i], options[i], mode[i], status[i], rank[i] = r.Params, r.Target, r.Options, r.ResponseMode, r.Status, int16(r.StatusRank)
		errCode[i], errMsg[i], errData[i], trace[i] = r.ErrorCode, r.ErrorMessage, r.ErrorData, r.TraceID
		callback[i], callbackKey[i], created[i] = r.CallbackURL, r.CallbackKeyID, r.CreatedAt
		dispatched[i], acked[i], finished[i], due[i] = r.DispatchedAt, r.AckedAt, r.FinishedAt, r.DeliveryNextAt
	}
	return []any{id, user, client, ctxID, task, epoch, name, params, target, options, mode, status, rank,
		errCode, errMsg, errData, trace, callback, callbackKey, created, dispatched, acked, finished, due}
}

func statusArrays(cs []statusChange) []any {
	n := len(cs)
	var (
		id, status                  = make([]string, n), make([]string, n)
		rank, errRank               = make([]int16, n), make([]int16, n)
		dispatched, acked, finished = make([]*time.Time, n), make([]*time.Time, n), make([]*time.Time, n)
		errCode, errMsg, errData    = make([]*string, n), make([]*string, n), make([]*string, n)
	)
	for i := range cs {
		c := &cs[i]
		id[i], status[i], rank[i], errRank[i] = c.commandID, c.status, int16(c.rank), int16(c.errRank)
		dispatched[i], acked[i], finished[i] = c.at[1], c.at[2], c.at[3]
		errCode[i], errMsg[i], errData[i] = c.errCols()
	}
	return []any{id, status, rank, dispatched, acked, finished, errRank, errCode, errMsg, errData}
}

func messageArrays(rows []messageRow) []any {
	n := len(rows)
	var (
		id, kind, name, code, message, mime = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		ord                                 = make([]int64, n)
		data                                = make([]*string, n)
		blob                                = make([][]byte, n)
		late                                = make([]bool, n)
		at                                  = make([]time.Time, n)
	)
	for i := range rows {
		r := &rows[i]
		id[i], ord[i], kind[i], name[i], data[i], code[i] = r.CommandID, r.Seq, r.Kind, r.Name, r.Data, r.Code
		message[i], mime[i], blob[i], late[i], at[i] = r.Message, r.Mime, r.Blob, r.Late, r.At
	}
	return []any{id, ord, kind, name, data, code, message, mime, blob, late, at}
}

func deliveryArrays(ds []SetDelivery) []any {
	n := len(ds)
	var (
		id        = make([]string, n)
		attempts  = make([]int32, n)
		delivered = make([]bool, n)
		lastErr   = make([]*string, n)
		next      = make([]*time.Time, n)
	)
	for i := range ds {
		d := &ds[i]
		id[i], attempts[i], delivered[i], lastErr[i], next[i] = d.CommandID, int32(d.Attempts), d.Delivered, text(d.LastError), utcPtr(&d.NextAt)
	}
	return []any{id, attempts, delivered, lastErr, next}
}
