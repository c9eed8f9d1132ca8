package history

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"gorm.io/gorm"

	cheetah "github.com/cheetahbroker/cheetah"
)

// List page sizes.
const (
	DefaultListLimit = 50
	MaxListLimit     = 500
)

// Get returns a command of userID with its messages in seq order (an empty
// slice when there are none). A command of another user answers not_found,
// exactly as a missing one does. Delivery is set only when the command was
// sent with a callback URL.
func (s *Store) Get(ctx context.Context, userID, commandID string) (cheetah.CommandRecord, error) {
	var row commandRow
	err := s.db.WithContext(ctx).Where("command_id = ? AND user_id = ?", commandID, userID).Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return cheetah.CommandRecord{}, cheetah.NotFoundf("command %s not found", commandID)
	}
	if err != nil {
		return cheetah.CommandRecord{}, fail("history.Get", err)
	}
	// Reading the messages after the command is enough for "read your
	// result": messages only grow, and a terminal message is committed in
	// the same or an earlier transaction than the status that it ends.
	var msgs []messageRow
	if err := s.db.WithContext(ctx).Where("command_id = ?", commandID).Order("seq").Find(&msgs).Error; err != nil {
		return cheetah.CommandRecord{}, fail("history.Get", err)
	}
	rec := row.record()
	rec.Messages = make([]cheetah.Message, 0, len(msgs))
	for _, m := range msgs {
		rec.Messages = append(rec.Messages, m.message())
	}
	return rec, nil
}

// CommandRef is what the broker needs to check a client's frame about a
// command: whose it is, where it went, and how far it got.
type CommandRef struct {
	UserID       string
	ClientID     string
	ContextID    string
	Status       cheetah.Status
	ResponseMode cheetah.ResponseMode
}

// Lookup returns the owner and state of any user's command.
func (s *Store) Lookup(ctx context.Context, commandID string) (CommandRef, error) {
	var row commandRow
	err := s.db.WithContext(ctx).
		Select("user_id", "client_id", "context_id", "status", "response_mode").
		Where("command_id = ?", commandID).Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return CommandRef{}, cheetah.NotFoundf("command %s not found", commandID)
	}
	if err != nil {
		return CommandRef{}, fail("history.Lookup", err)
	}
	return CommandRef{
		UserID:       row.UserID,
		ClientID:     row.ClientID,
		ContextID:    row.ContextID,
		Status:       cheetah.Status(row.Status),
		ResponseMode: cheetah.ResponseMode(row.ResponseMode),
	}, nil
}

// List pages through a user's commands, newest first (command ids are
// UUIDv7, so id order is creation order), optionally only those of one task.
// Limit defaults to 50 and may be 1 to 500. The cursor is opaque; NextCursor
// is "" on the last page.
//
// List entries carry no messages (Messages is nil): a page of 500 commands
// with their screenshots would be enormous. Read one command with Get for
// its messages.
func (s *Store) List(ctx context.Context, userID string, q cheetah.ListQuery) (cheetah.CommandPage, error) {
	limit := q.Limit
	if limit == 0 {
		limit = DefaultListLimit
	}
	if limit < 1 || limit > MaxListLimit {
		return cheetah.CommandPage{}, cheetah.Invalidf("limit must be between 1 and %d", MaxListLimit)
	}
	db := s.db.WithContext(ctx).Where("user_id = ?", userID)
	if q.TaskID != "" {
		db = db.Where("task_id = ?", q.TaskID)
	}
	if q.Cursor != "" {
		after, err := decodeCursor(q.Cursor)
		if err != nil {
			return cheetah.CommandPage{}, err
		}
		db = db.Where("command_id < ?", after)
	}
	// One row more than asked says whether another page follows.
	var rows []commandRow
	if err := db.Order("command_id DESC").Limit(limit + 1).Find(&rows).Error; err != nil {
		return cheetah.CommandPage{}, fail("history.List", err)
	}
	page := cheetah.CommandPage{Commands: make([]cheetah.CommandRecord, 0, min(len(rows), limit))}
	for i, r := range rows {
		if i == limit {
			page.NextCursor = encodeCursor(rows[limit-1].CommandID)
			break
		}
		page.Commands = append(page.Commands, r.record())
	}
	return page, nil
}

func encodeCursor(commandID string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(commandID))
}

// decodeCursor refuses anything List could not have produced, so a mangled
// cursor is the caller's invalid_request and never a database error.
func decodeCursor(c string) (string, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil || len(b) == 0 || len(b) > 128 || !utf8.Valid(b) || strings.ContainsRune(string(b), 0) {
		return "", cheetah.Invalidf("malformed cursor")
	}
	return string(b), nil
}

// MarkInterrupted ends every command still in flight, except those of
// response mode none (they end at dispatched or acknowledged by design), as
// interrupted at at. The broker calls it at start: whatever was in flight
// when it stopped will never get its answer through this process.
func (s *Store) MarkInterrupted(ctx context.Context, at time.Time) (int64, error) {
	return s.markInterrupted(s.db.WithContext(ctx), at, "history.MarkInterrupted")
}

// orphaned selects the commands of replicas that are no longer members
// (their rows are gone from replicas): the only ones a replica may end
// without ending another live replica's work.
// A broker on the database that is no replica leaves replica_id empty (it
// ends its own commands at its start).
const orphaned = "replica_id <> '' AND replica_id NOT IN (SELECT id FROM replicas)"

// MarkOrphansInterrupted is MarkInterrupted for the replicas of one
// PostgreSQL (DESIGN §9): it ends as interrupted the commands in flight of
// replicas no longer members, and arms their webhook deliveries first, in
// one transaction. Any replica may call it at any time, as often as it
// likes; a command of a live replica is never touched.
func (s *Store) MarkOrphansInterrupted(ctx context.Context, at time.Time) (int64, error) {
	var n int64
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := s.armInterrupted(tx.Where(orphaned), at, "history.MarkOrphansInterrupted"); err != nil {
			return err
		}
		var err error
		n, err = s.markInterrupted(tx.Where(orphaned), at, "history.MarkOrphansInterrupted")
		return err
	})
	return n, err
}

func (s *Store) markInterrupted(db *gorm.DB, at time.Time, op string) (int64, error) {
	res := db.Model(&commandRow{}).
		Where("status_rank < 3 AND response_mode <> ?", string(cheetah.ModeNone)).
		Updates(map[string]any{
			"status":        string(cheetah.StatusInterrupted),
			"status_rank":   cheetah.StatusInterrupted.Rank(),
			"finished_at":   utc(at),
			"error_code":    string(cheetah.StatusInterrupted),
			"error_message": "the broker stopped before the command finished",
		})
	if res.Error != nil {
		return 0, fail(op, res.Error)
	}
	return res.RowsAffected, nil
}

// PurgeBefore deletes the commands created before t that are over, and
// their messages: history retention. A command is over when it has a
// terminal status, or when its response mode is none (it never gets one).
//
// Command ids are UUIDv7, minted as the command is admitted, so the rows
// created before t are found by a range of the primary key, below the
// first id of t's millisecond, with no index on created_at for every
// command to write. A command whose id's time is not before t's
// millisecond (one admitted in the same millisecond, or after the wall
// clock stepped back) waits for a later pass.
func (s *Store) PurgeBefore(ctx context.Context, t time.Time) (int64, error) {
	res := s.db.WithContext(ctx).
		Where("command_id < ? AND created_at < ? AND (status_rank = 3 OR response_mode = ?)",
			firstCommandIDOf(t), utc(t), string(cheetah.ModeNone)).
		Delete(&commandRow{})
	if res.Error != nil {
		return 0, fail("history.PurgeBefore", res.Error)
	}
	return res.RowsAffected, nil
}

// firstCommandIDOf returns the least UUIDv7, in its text form, of t's
// millisecond: every id minted before that millisecond sorts below it, in
// text order as in byte order (PostgreSQL compares ids in the "C"
// collation, SQLite by bytes).
func firstCommandIDOf(t time.Time) string {
	ms := uint64(max(t.UnixMilli(), 0)) & (1<<48 - 1)
	return fmt.Sprintf("%08x-%04x-7000-8000-000000000000", ms>>16, ms&0xffff)
}

// EpochHighWater returns the highest epoch reserved so far, by any broker
// on the database.
func (s *Store) EpochHighWater(ctx context.Context) (int64, error) {
	var high int64
	if err := s.db.WithContext(ctx).Raw("SELECT high_water FROM epochs WHERE id = 1").Scan(&high).Error; err != nil {
		return 0, fail("history.EpochHighWater", err)
	}
	return high, nil
}

// ReserveEpochs advances the persisted high-water mark by n and returns the
// first of n epochs never issued before, by this process or any other, also
// across restarts. One UPDATE … RETURNING makes it atomic on both dialects.
func (s *Store) ReserveEpochs(ctx context.Context, n int64) (first int64, err error) {
	if n < 1 {
		return 0, cheetah.Invalidf("history: reserve at least one epoch, not %d", n)
	}
	var high int64
	res := s.db.WithContext(ctx).
		Raw("UPDATE epochs SET high_water = high_water + ? WHERE id = 1 RETURNING high_water", n).
		Scan(&high)
	if res.Error != nil {
		err := fail("history.ReserveEpochs", res.Error)
		s.markDown(err)
		return 0, err
	}
	if res.RowsAffected != 1 {
		// The migration seeds the row; without it epochs cannot be issued.
		return 0, fmt.Errorf("history.ReserveEpochs: the epochs row is missing")
	}
	return high - n + 1, nil
}
