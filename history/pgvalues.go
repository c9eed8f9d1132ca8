package history

import (
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// The values the PostgreSQL write path hands pgx, one per column of a row.
// Each is a pointer to the row's own field in a struct of one pointer, so
// putting it in an interface allocates nothing, where a string, an int64 or
// a time.Time put in one is copied to the heap: two dozen allocations per
// command written, with pgx's own for each pointer it dereferences. pgx
// encodes them through pgtype's Valuer interfaces, to the same bytes as the
// fields themselves. A nil pointer is NULL.

// pgText is a text column.
type pgText struct{ p *string }

func (v pgText) TextValue() (pgtype.Text, error) {
	if v.p == nil {
		return pgtype.Text{}, nil
	}
	return pgtype.Text{String: *v.p, Valid: true}, nil
}

// pgTime is a timestamptz column.
type pgTime struct{ p *time.Time }

func (v pgTime) TimestamptzValue() (pgtype.Timestamptz, error) {
	if v.p == nil {
		return pgtype.Timestamptz{}, nil
	}
	return pgtype.Timestamptz{Time: *v.p, Valid: true}, nil
}

// pgInt is an integer column of any width: pgx checks the range of the
// column's type.
type pgInt[T int | int16 | int32 | int64] struct{ p *T }

func (v pgInt[T]) Int64Value() (pgtype.Int8, error) {
	if v.p == nil {
		return pgtype.Int8{}, nil
	}
	return pgtype.Int8{Int64: int64(*v.p), Valid: true}, nil
}
