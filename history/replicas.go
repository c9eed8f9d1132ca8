package history

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// Replica is one member of the replicas of a PostgreSQL database (DESIGN
// §9), as its row says.
type Replica struct {
	ID  string
	URL string
	// ExpiresAt is when the row lapses unless renewed, by the database's
	// clock.
	ExpiresAt time.Time
}

// ErrNotClustered is what the replica methods answer on SQLite, which is
// single-node.
var ErrNotClustered = errors.New("history: replicas need PostgreSQL")

func (s *Store) clustered(op string) error {
	if s.dialect != DialectPostgres {
		return fmt.Errorf("%s: %w", op, ErrNotClustered)
	}
	return nil
}

// JoinReplica makes id a member that lapses ttl from now unless renewed.
// A row of another replica with the same URL is a previous life of this
// one (two live replicas cannot listen at one address): it is removed, so
// that its commands are orphans at once rather than after it lapses.
func (s *Store) JoinReplica(ctx context.Context, id, url string, ttl time.Duration) error {
	const op = "history.JoinReplica"
	if err := s.clustered(op); err != nil {
		return err
	}
	err := s.db.WithContext(ctx).Exec(`WITH gone AS (DELETE FROM replicas WHERE url = ? AND url <> '' AND id <> ?)
INSERT INTO replicas (id, url, expires_at) VALUES (?, ?, now() + ? * interval '1 millisecond')
ON CONFLICT (id) DO UPDATE SET url = EXCLUDED.url, expires_at = EXCLUDED.expires_at`,
		url, id, id, url, ttl.Milliseconds()).Error
	return s.replicaErr(op, err)
}

// RenewReplica moves id's lapse to ttl from now. It reports false when the
// row is gone: other replicas declared this one dead, and it must stop
// acting for its clients before it joins again.
func (s *Store) RenewReplica(ctx context.Context, id string, ttl time.Duration) (bool, error) {
	const op = "history.RenewReplica"
	if err := s.clustered(op); err != nil {
		return false, err
	}
	res := s.db.WithContext(ctx).Exec(`UPDATE replicas SET expires_at = now() + ? * interval '1 millisecond' WHERE id = ?`,
		ttl.Milliseconds(), id)
	if res.Error != nil {
		return false, s.replicaErr(op, res.Error)
	}
	return res.RowsAffected == 1, nil
}

// LeaveReplica removes id's row: a replica that stops cleanly says so at
// once rather than lapsing.
func (s *Store) LeaveReplica(ctx context.Context, id string) error {
	const op = "history.LeaveReplica"
	if err := s.clustered(op); err != nil {
		return err
	}
	return s.replicaErr(op, s.db.WithContext(ctx).Exec(`DELETE FROM replicas WHERE id = ?`, id).Error)
}

// Replicas lists the members whose rows have not lapsed, by id.
func (s *Store) Replicas(ctx context.Context) ([]Replica, error) {
	const op = "history.Replicas"
	if err := s.clustered(op); err != nil {
		return nil, err
	}
	var rows []Replica
	err := s.db.WithContext(ctx).Raw(`SELECT id, url, expires_at FROM replicas WHERE expires_at > now() ORDER BY id`).
		Scan(&rows).Error
	return rows, s.replicaErr(op, err)
}

// ReapReplicas removes the members whose rows lapsed more than grace ago,
// and in the same transaction ends the commands in flight of every replica
// that is no longer a member as interrupted at at (arming their webhook
// deliveries), so that no failure between the two can leave them in
// flight. It returns the ids removed and how many commands it ended.
// grace covers the difference between the database's clock and the
// replicas' own: a replica stops acting when its row lapses by its own
// count, which starts before the database's.
func (s *Store) ReapReplicas(ctx context.Context, grace time.Duration, at time.Time) ([]string, int64, error) {
	const op = "history.ReapReplicas"
	if err := s.clustered(op); err != nil {
		return nil, 0, err
	}
	var ids []string
	var n int64
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Raw(`DELETE FROM replicas WHERE expires_at < now() - ? * interval '1 millisecond' RETURNING id`,
			grace.Milliseconds()).Scan(&ids).Error; err != nil {
			return err
		}
		if err := s.armInterrupted(tx.Where(orphaned), at, op); err != nil {
			return err
		}
		var err error
		n, err = s.markInterrupted(tx.Where(orphaned), at, op)
		return err
	})
	return ids, n, s.replicaErr(op, err)
}

// ClusterSecret returns the secret the replicas sign their requests to
// each other with, made by the first replica that asks.
func (s *Store) ClusterSecret(ctx context.Context) ([]byte, error) {
	const op = "history.ClusterSecret"
	if err := s.clustered(op); err != nil {
		return nil, err
	}
	fresh := make([]byte, 32)
	if _, err := rand.Read(fresh); err != nil {
		return nil, err
	}
	var secret []byte
	err := s.db.WithContext(ctx).Raw(`WITH made AS (
  INSERT INTO cluster_secret (id, secret) VALUES (1, ?) ON CONFLICT (id) DO NOTHING RETURNING secret)
SELECT secret FROM made UNION ALL SELECT secret FROM cluster_secret WHERE id = 1 LIMIT 1`, fresh).Row().Scan(&secret)
	if err != nil {
		return nil, s.replicaErr(op, err)
	}
	return secret, nil
}

// replicaErr marks the store down when the database does not answer, as
// every other path of the store does.
func (s *Store) replicaErr(op string, err error) error {
	if err == nil {
		return nil
	}
	err = fail(op, err)
	s.markDown(err)
	return err
}
