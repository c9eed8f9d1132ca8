package history

import (
	"context"
	"time"

	"gorm.io/gorm"

	cheetah "github.com/cheetahbroker/cheetah"
)

// PendingDelivery is a command whose webhook delivery has an attempt due.
type PendingDelivery struct {
	CommandID string
	UserID    string
	URL       string
	// KeyID names the API key whose webhook secret signs the delivery; empty
	// means the broker's own secret.
	KeyID string
	// FinishedAt is when the command ended: the attempts are scheduled from
	// it.
	FinishedAt time.Time
	// Attempts is how many attempts were made so far.
	Attempts int
	DueAt    time.Time
}

// deliveryRow is what the due-delivery queries read of a command.
type deliveryRow struct {
	CommandID        string
	UserID           string
	CallbackURL      *string
	CallbackKeyID    *string
	FinishedAt       *time.Time
	DeliveryAttempts int
	DeliveryNextAt   *time.Time
}

// DueDeliveries returns up to limit deliveries whose next attempt is due at
// now, the longest overdue first. A delivery is pending while its command's
// delivery_next_at is set; the partial index on that column makes this a
// short range scan however large the history is.
func (s *Store) DueDeliveries(ctx context.Context, now time.Time, limit int) ([]PendingDelivery, error) {
	if limit < 1 {
		return nil, cheetah.Invalidf("history: limit must be at least 1")
	}
	var rows []deliveryRow
	err := s.db.WithContext(ctx).Table("commands").
		Select("command_id", "user_id", "callback_url", "callback_key_id", "finished_at", "delivery_attempts", "delivery_next_at").
		Where("delivery_next_at IS NOT NULL AND delivery_next_at <= ? AND status_rank = 3", utc(now)).
		Order("delivery_next_at").Limit(limit).Find(&rows).Error
	if err != nil {
		return nil, fail("history.DueDeliveries", err)
	}
	out := make([]PendingDelivery, 0, len(rows))
	for _, r := range rows {
		p := PendingDelivery{
			CommandID: r.CommandID,
			UserID:    r.UserID,
			URL:       deref(r.CallbackURL),
			KeyID:     deref(r.CallbackKeyID),
			Attempts:  r.DeliveryAttempts,
		}
		if r.FinishedAt != nil {
			p.FinishedAt = r.FinishedAt.UTC()
		}
		if r.DeliveryNextAt != nil {
			p.DueAt = r.DeliveryNextAt.UTC()
		}
		out = append(out, p)
	}
	return out, nil
}

// NextDeliveryAt returns when the earliest pending delivery is due, and
// false when none is pending.
func (s *Store) NextDeliveryAt(ctx context.Context) (time.Time, bool, error) {
	var rows []deliveryRow
	err := s.db.WithContext(ctx).Table("commands").Select("delivery_next_at").
		Where("delivery_next_at IS NOT NULL AND status_rank = 3").
		Order("delivery_next_at").Limit(1).Find(&rows).Error
	if err != nil {
		return time.Time{}, false, fail("history.NextDeliveryAt", err)
	}
	if len(rows) == 0 || rows[0].DeliveryNextAt == nil {
		return time.Time{}, false, nil
	}
	return rows[0].DeliveryNextAt.UTC(), true, nil
}

// ClaimDelivery takes a due delivery for one attempt: it moves the delivery's
// next attempt to until, so that no other poll (of this process or another
// broker on the same database) takes it meanwhile, and so that an attempt cut
// short by a crash is made again once until has passed. It reports false when
// the delivery is no longer due at now with that many attempts made: someone
// else took it, or it was delivered or given up.
//
// The claim is a direct, conditional write, not one of the writer's ops: its
// answer is needed at once.
func (s *Store) ClaimDelivery(ctx context.Context, commandID string, attempts int, now, until time.Time) (bool, error) {
	res := s.db.WithContext(ctx).Table("commands").
		Where("command_id = ? AND delivery_attempts = ? AND delivery_next_at IS NOT NULL AND delivery_next_at <= ? AND status_rank = 3",
			commandID, attempts, utc(now)).
		Update("delivery_next_at", utc(until))
	if res.Error != nil {
		return false, fail("history.ClaimDelivery", res.Error)
	}
	return res.RowsAffected == 1, nil
}

// ArmInterruptedDeliveries makes the webhook delivery of every command that
// MarkInterrupted is about to end due at at. The broker calls it at start,
// just before MarkInterrupted and with the same time: MarkInterrupted ends
// commands without a SetStatus, so nothing else would arm their deliveries.
// A delivery armed on a command that is not yet terminal waits: pending
// deliveries are only taken once the command has ended. Calling it again is
// harmless.
func (s *Store) ArmInterruptedDeliveries(ctx context.Context, at time.Time) (int64, error) {
	res := s.armInterruptedRes(s.db.WithContext(ctx), at)
	if res.Error != nil {
		return 0, fail("history.ArmInterruptedDeliveries", res.Error)
	}
	return res.RowsAffected, nil
}

func (s *Store) armInterrupted(db *gorm.DB, at time.Time, op string) error {
	if res := s.armInterruptedRes(db, at); res.Error != nil {
		return fail(op, res.Error)
	}
	return nil
}

func (s *Store) armInterruptedRes(db *gorm.DB, at time.Time) *gorm.DB {
	return db.Table("commands").
		Where("status_rank < 3 AND response_mode <> ? AND callback_url IS NOT NULL AND delivery_next_at IS NULL",
			string(cheetah.ModeNone)).
		Update("delivery_next_at", utc(at))
}
