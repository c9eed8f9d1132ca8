package history

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// pgStmt is a statement of the write path, with the name it is prepared
// under on every connection: made once from its text, so that a batch
// neither hashes nor looks up its texts.
type pgStmt struct {
	name, sql string
}

func newPGStmt(sql string) pgStmt {
	d := sha256.Sum256([]byte(sql))
	return pgStmt{name: "cheetah_" + hex.EncodeToString(d[:12]), sql: sql}
}

// pgBatch is a pipeline of the write path's statements, sent through
// pgconn with its parameters encoded into a buffer of the store's own.
//
// pgx's own batch encodes each statement's parameters into a buffer that
// it shrinks back to 256 bytes after every statement, so a statement over a
// few hundred rows grew it again by doubling, each batch: about a third of
// the bytes the store allocated per command, for the collector to reclaim.
// Here the parameters of the whole batch go into one pooled buffer, and
// only the Bind messages (pgconn's) are built per batch.
type pgBatch struct {
	queued []pgQueued
	// cells hold the statements' arguments until they are encoded; taken
	// from pgCells, given back by build. needed counts what they took.
	cells  *[]any
	needed int
}

type pgQueued struct {
	name string // what its error is named by
	stmt pgStmt
	args []any
}

// queue adds stmt with args, and name for its error.
func (b *pgBatch) queue(name string, stmt pgStmt, args ...any) {
	b.queued = append(b.queued, pgQueued{name: name, stmt: stmt, args: args})
}

func (b *pgBatch) len() int { return len(b.queued) }

// take returns n cells for arguments, from b's pooled slice while it has
// room; past it, from a slice of their own (and the pooled one comes back
// larger for the next batch).
func (b *pgBatch) take(n int) []any {
	if b.cells == nil {
		b.cells = pgCells.Get().(*[]any)
	}
	b.needed += n
	c := *b.cells
	if cap(c)-len(c) < n {
		return make([]any, n)
	}
	*b.cells = c[:len(c)+n]
	return c[len(c) : len(c)+n : len(c)+n]
}

// releaseCells gives b's cells back, emptied so that the pool keeps no row
// alive.
func (b *pgBatch) releaseCells() {
	if b.cells == nil {
		return
	}
	c := *b.cells
	clear(c)
	if b.needed > cap(c) && b.needed <= pgCellsMax {
		c = make([]any, 0, b.needed)
	}
	*b.cells = c[:0]
	pgCells.Put(b.cells)
	b.cells, b.needed = nil, 0
}

// pgParamBufs holds the buffers parameters are encoded into. One is handed
// back only below pgParamBufMax, so that a rare huge batch does not stay in
// memory.
var pgParamBufs = sync.Pool{New: func() any { b := make([]byte, 0, 8<<10); return &b }}

const pgParamBufMax = 4 << 20

// pgCells holds slices of argument cells (pgBatch.take).
var pgCells = sync.Pool{New: func() any { c := make([]any, 0, 512); return &c }}

const pgCellsMax = 1 << 18

// send sends b as one pipeline on pc, in the implicit transaction of its
// Sync (or the one pc is in), and reads the statements' results in order:
// the first that failed names the error; one after them all is the
// commit's.
func (b *pgBatch) send(ctx context.Context, pc *pgx.Conn) error {
	var pb pgconn.Batch
	if err := b.build(ctx, pc, &pb); err != nil {
		return err
	}
	mrr := pc.PgConn().ExecBatch(ctx, &pb)
	for _, q := range b.queued {
		if !mrr.NextResult() {
			err := mrr.Close()
			if err == nil {
				err = errors.New("the pipeline ended before its statements")
			}
			return fail(q.name, err)
		}
		if _, err := mrr.ResultReader().Close(); err != nil {
			_ = mrr.Close()
			return fail(q.name, err)
		}
	}
	return mrr.Close()
}

// build prepares b's statements on pc where they are not yet (one round
// trip each, once per connection), encodes their parameters, and appends
// them to pb.
func (b *pgBatch) build(ctx context.Context, pc *pgx.Conn, pb *pgconn.Batch) error {
	bufp := pgParamBufs.Get().(*[]byte)
	buf := (*bufp)[:0]
	defer func() {
		b.releaseCells()
		if cap(buf) <= pgParamBufMax {
			*bufp = buf[:0]
			pgParamBufs.Put(bufp)
		}
	}()
	sds := make([]*pgconn.StatementDescription, len(b.queued))
	total := 0
	for i, q := range b.queued {
		sd, err := pc.Prepare(ctx, q.stmt.name, q.stmt.sql)
		if err != nil {
			return fail(q.name, err)
		}
		if len(sd.ParamOIDs) != len(q.args) {
			return fail(q.name, fmt.Errorf("%d parameters for %d arguments", len(sd.ParamOIDs), len(q.args)))
		}
		sds[i] = sd
		total += len(q.args)
	}
	// Offsets first, slices after: the buffer moves as it grows.
	ends := make([]int, total)
	formats := make([]int16, total)
	m := pc.TypeMap()
	k := 0
	for i, q := range b.queued {
		for j, arg := range q.args {
			var err error
			if buf, formats[k], ends[k], err = encodeParam(m, sds[i].ParamOIDs[j], arg, buf); err != nil {
				return fail(q.name, fmt.Errorf("parameter %d: %w", j+1, err))
			}
			k++
		}
	}
	values := make([][]byte, total)
	start := 0
	for k, end := range ends {
		if end >= 0 {
			values[k] = buf[start:end:end]
			start = end
		}
	}
	k = 0
	for i, q := range b.queued {
		n := len(q.args)
		pb.ExecStatement(sds[i], values[k:k+n:k+n], formats[k:k+n:k+n], nil)
		k += n
	}
	// pb holds copies now: buf goes back to the pool.
	return nil
}

// encodeParam appends arg, encoded for a parameter of type oid, to buf, and
// returns the buffer, the format, and where the value ends in it (-1 for
// NULL). It chooses the format as pgx does: text for strings, else the
// type's preferred one, and the other where that one cannot encode arg.
func encodeParam(m *pgtype.Map, oid uint32, arg any, buf []byte) ([]byte, int16, int, error) {
	format := m.FormatCodeForOID(oid)
	switch arg.(type) {
	case string, *string:
		format = pgtype.TextFormatCode
	}
	out, err := m.Encode(oid, format, arg, buf)
	if err != nil {
		other := int16(pgtype.BinaryFormatCode)
		if format == pgtype.BinaryFormatCode {
			other = pgtype.TextFormatCode
		}
		if out, err = m.Encode(oid, other, arg, buf); err != nil {
			return buf, format, 0, err
		}
		format = other
	}
	if out == nil {
		return buf, format, -1, nil
	}
	return out, format, len(out), nil
}
