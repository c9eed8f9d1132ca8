package history

import (
	"context"
	"errors"
	"time"

	"gorm.io/gorm"

	cheetah "github.com/cheetahbroker/cheetah"
)

// Key is a stored API key. Only its hash is kept; the key itself is shown
// once, when it is made.
type Key struct {
	ID            string
	Kind          string // "client", "app" or "admin"
	UserID        string // set for client keys
	TenantID      string // set for tenant-bound app keys
	Name          string
	Hash          []byte
	WebhookSecret string // set for app keys (and admin keys made by the API)
	CreatedAt     time.Time
	RevokedAt     *time.Time
}

// CreateKey stores a new key. A zero CreatedAt means now. A duplicate id or
// an unknown kind is refused (not store_unavailable).
func (s *Store) CreateKey(ctx context.Context, k Key) error {
	created := k.CreatedAt
	if created.IsZero() {
		created = time.Now()
	}
	row := keyRow{
		ID:            k.ID,
		Kind:          k.Kind,
		UserID:        text(k.UserID),
		TenantID:      text(k.TenantID),
		Name:          k.Name,
		Hash:          k.Hash,
		WebhookSecret: text(k.WebhookSecret),
		CreatedAt:     utc(created),
		RevokedAt:     utcPtr(k.RevokedAt),
	}
	if row.Hash == nil {
		row.Hash = []byte{}
	}
	return fail("history.CreateKey", s.db.WithContext(ctx).Create(&row).Error)
}

// GetKey returns a key, revoked or not.
func (s *Store) GetKey(ctx context.Context, id string) (Key, error) {
	var row keyRow
	err := s.db.WithContext(ctx).Where("id = ?", id).Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Key{}, cheetah.NotFoundf("key %s not found", id)
	}
	if err != nil {
		return Key{}, fail("history.GetKey", err)
	}
	return row.key(), nil
}

// ListKeys returns every key, revoked ones included, oldest first.
func (s *Store) ListKeys(ctx context.Context) ([]Key, error) {
	var rows []keyRow
	if err := s.db.WithContext(ctx).Order("created_at, id").Find(&rows).Error; err != nil {
		return nil, fail("history.ListKeys", err)
	}
	keys := make([]Key, 0, len(rows))
	for _, r := range rows {
		keys = append(keys, r.key())
	}
	return keys, nil
}

// RevokeKey marks a key revoked at at. It reports false when the key is
// unknown or already revoked, so revoking twice is not an error.
func (s *Store) RevokeKey(ctx context.Context, id string, at time.Time) (bool, error) {
	res := s.db.WithContext(ctx).Model(&keyRow{}).
		Where("id = ? AND revoked_at IS NULL", id).
		Update("revoked_at", utc(at))
	if res.Error != nil {
		return false, fail("history.RevokeKey", res.Error)
	}
	return res.RowsAffected == 1, nil
}

// CountActiveKeys counts the keys of a kind that are not revoked; kind ""
// counts every kind. serve uses it to decide whether to make the first
// admin key.
func (s *Store) CountActiveKeys(ctx context.Context, kind string) (int64, error) {
	db := s.db.WithContext(ctx).Model(&keyRow{}).Where("revoked_at IS NULL")
	if kind != "" {
		db = db.Where("kind = ?", kind)
	}
	var n int64
	if err := db.Count(&n).Error; err != nil {
		return 0, fail("history.CountActiveKeys", err)
	}
	return n, nil
}
