package history

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"
)

func fullCommandRow() commandRow {
	s := func(v string) *string { return &v }
	at := time.Date(2026, 12, 5, 10, 0, 0, 123456000, time.UTC)
	t := func(d time.Duration) *time.Time { v := at.Add(d); return &v }
	return commandRow{CommandID: "c1", UserID: "u", ClientID: "cl", ContextID: "x", TaskID: "t", Epoch: 7, Name: "echo",
		Params: s(`{"a":1}`), Target: s(`{"url":"x"}`), Options: s(`{}`), ResponseMode: "result", Status: "done", StatusRank: 3,
		ErrorCode: s("failed"), ErrorMessage: s("it broke"), ErrorData: s(`[1]`), TraceID: "abc",
		CallbackURL: s("https://example.test/cb"), CallbackKeyID: s("k1"),
		CreatedAt: at, DispatchedAt: t(time.Millisecond), AckedAt: t(2 * time.Millisecond), FinishedAt: t(3 * time.Millisecond),
		DeliveryNextAt: t(4 * time.Millisecond)}
}

// plainCommandValues are r's values as the fields themselves, which pgx
// encodes as it always has.
func plainCommandValues(r *commandRow) []any {
	return []any{r.CommandID, r.UserID, r.ClientID, r.ContextID, r.TaskID, r.Epoch, r.Name,
		r.Params, r.Target, r.Options, r.ResponseMode, r.Status, int16(r.StatusRank), r.ErrorCode, r.ErrorMessage, r.ErrorData, r.TraceID,
		r.CallbackURL, r.CallbackKeyID, r.CreatedAt, r.DispatchedAt, r.AckedAt, r.FinishedAt, r.DeliveryNextAt}
}

// The write path's values encode to the bytes the fields themselves do,
// NULL included, in both formats, so that what is stored does not depend on
// which of the two was handed to pgx.
func TestPostgresValuesEncodeAsTheirFields(t *testing.T) {
	t.Parallel()
	m := pgtype.NewMap()
	full, empty := fullCommandRow(), commandRow{CommandID: "c2", CreatedAt: time.Unix(0, 0).UTC()}
	for _, r := range []*commandRow{&full, &empty} {
		vals := make([]any, len(pgCommandCols))
		commandValues(r, vals)
		plain := plainCommandValues(r)
		for j, typ := range pgInsertCommandTypes {
			dt, ok := m.TypeForName(typ)
			require.True(t, ok, typ)
			for _, format := range []int16{pgtype.BinaryFormatCode, pgtype.TextFormatCode} {
				want, err := m.Encode(dt.OID, format, plain[j], nil)
				require.NoError(t, err, pgCommandCols[j])
				got, err := m.Encode(dt.OID, format, vals[j], nil)
				require.NoError(t, err, pgCommandCols[j])
				require.Equal(t, want, got, "%s (%s), format %d", pgCommandCols[j], typ, format)
			}
		}
	}
}

// A batch's rows go to pgx as arrays of values that cost no allocation
// each: what encoding a batch allocates (its arrays, pgx's headers) does
// not grow with its rows.
func TestPostgresValuesEncodeWithoutAllocatingPerValue(t *testing.T) {
	m := pgtype.NewMap()
	oids := make([]uint32, len(pgInsertCommandTypes))
	for j, typ := range pgInsertCommandTypes {
		dt, ok := m.TypeForName("_" + typ)
		require.True(t, ok, typ)
		oids[j] = dt.OID
	}
	rows := make([]commandRow, 256)
	for i := range rows {
		rows[i] = fullCommandRow()
	}
	var buf []byte
	allocs := func(n int) float64 {
		return testing.AllocsPerRun(20, func() {
			var b pgBatch
			pgInsertCommands.queue(&b, n, func(i int, vals []any) { commandValues(&rows[i], vals) })
			for j, arg := range b.queued[0].args {
				var err error
				if buf, err = m.Encode(oids[j], pgtype.BinaryFormatCode, arg, buf[:0]); err != nil {
					panic(err)
				}
			}
		})
	}
	allocs(len(rows)) // plans each column's encoding once, and grows buf
	small, large := allocs(pgValuesRows), allocs(len(rows))
	perRow := (large - small) / float64(len(rows)-pgValuesRows)
	// The fields themselves cost two allocations per value and row: one to
	// put each in an interface, one where pgx takes it out again.
	require.Less(t, perRow, 0.1, "allocations per row encoded (%v for %d rows, %v for %d)", large, len(rows), small, pgValuesRows)
}
