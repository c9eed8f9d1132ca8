package history

import (
	"context"
	"time"

	"gorm.io/gorm"
)

// Lease rows make a lease outlive the replica that holds it (DESIGN §9;
// migrations/postgres/00004_leases.sql). They are written through the same
// writer as commands, in the registry's decision order, on PostgreSQL only:
// SQLite is single-node, and its leases live and die with its one broker.

// PutLease writes a lease's row, as Kind says. The token itself is never
// stored, only its digest.
type PutLease struct {
	Kind        PutKind
	TokenDigest [32]byte
	UserID      string
	ClientID    string
	ContextID   string
	TaskID      string
	Epoch       int64
	TTL         time.Duration
	RenewOnUse  bool
	ClearState  bool
	ExpiresAt   time.Time
	// Generation orders the claims of the row: a claim takes the row only
	// from a lower generation (each move of the lease claims with one more).
	Generation int64
}

// PutKind says what a PutLease writes.
type PutKind uint8

const (
	// LeaseExpiry moves the expiry of a row that is this replica's; it
	// never makes a row, so a write held through an outage and replayed
	// after the lease ended (its row deleted) brings nothing back.
	LeaseExpiry PutKind = iota
	// LeaseClaim makes the row this replica's whoever held it: a lease that
	// moved here with its client, or that this replica adopted.
	LeaseClaim
	// LeaseNew makes the row of a new lease.
	LeaseNew
)

// DeleteLease removes a lease's row, where it is this replica's: the lease
// ended.
type DeleteLease struct {
	TokenDigest [32]byte
}

func (PutLease) isOp()    {}
func (DeleteLease) isOp() {}

// leaseChange is what the lease ops of one batch amount to for one lease:
// the last one wins, as if they ran in order.
type leaseChange struct {
	put    PutLease
	delete bool
}

// replica_id takes the writing connection's setting (EXCLUDED's is this
// replica's). A replica cut off from the database may have writes held that
// reach it after others took its leases over: they change only rows still
// its own.
var pgDeleteLeases = newPGStmt(`DELETE FROM leases WHERE token_digest = ANY($1::bytea[])
AND replica_id = COALESCE(current_setting('cheetah.replica_id', true), '')`)

// The lease rows' columns, in putValues's order.
var pgLeaseTypes = []string{"bytea", "text", "text", "text", "text", "int8", "int8", "bool", "timestamptz", "bool", "int8"}

var (
	pgNewLeases = newPGRows("history.PutLease", `INSERT INTO leases (token_digest, user_id, client_id, context_id, task_id, epoch, ttl_ms, renew_on_use, expires_at, clear_state, generation)
SELECT * FROM %s AS v
ON CONFLICT (token_digest) DO NOTHING`, pgLeaseTypes...)

	pgLeaseExpiries = newPGRows("history.PutLease", `UPDATE leases AS l SET expires_at = v.expires_at, ttl_ms = v.ttl_ms
FROM %s AS v(token_digest, user_id, client_id, context_id, task_id, epoch, ttl_ms, renew_on_use, expires_at, clear_state, generation)
WHERE l.token_digest = v.token_digest AND l.replica_id = COALESCE(current_setting('cheetah.replica_id', true), '')`, pgLeaseTypes...)

	pgClaimLeases = newPGRows("history.PutLease", `INSERT INTO leases (token_digest, user_id, client_id, context_id, task_id, epoch, ttl_ms, renew_on_use, expires_at, clear_state, generation)
SELECT * FROM %s AS v
ON CONFLICT (token_digest) DO UPDATE SET expires_at = EXCLUDED.expires_at, ttl_ms = EXCLUDED.ttl_ms,
	replica_id = EXCLUDED.replica_id, orphaned_at = NULL, generation = EXCLUDED.generation
WHERE leases.generation < EXCLUDED.generation`, pgLeaseTypes...)
)

// planLease folds one lease op into p.
func (p *writePlan) planLease(digest [32]byte, c leaseChange) {
	if p.leaseAt == nil {
		p.leaseAt = make(map[[32]byte]int)
	}
	if i, ok := p.leaseAt[digest]; ok {
		// A new row or a claim earlier in the batch still makes or claims
		// it: a later expiry alone would find no row of this replica's.
		if prev := p.leases[i]; !prev.delete && !c.delete {
			c.put.Kind = max(c.put.Kind, prev.put.Kind)
		}
		p.leases[i] = c
		return
	}
	p.leaseAt[digest] = len(p.leases)
	p.leases = append(p.leases, c)
}

// queueLeases adds to b the statements that make the lease rows what cs
// say: new rows, expiries, claims, deletions.
func queueLeases(b *pgBatch, cs []leaseChange) {
	var byKind [3][]*PutLease
	var gone [][]byte
	for i := range cs {
		c := &cs[i]
		if c.delete {
			gone = append(gone, c.put.TokenDigest[:])
			continue
		}
		byKind[c.put.Kind] = append(byKind[c.put.Kind], &c.put)
	}
	for kind, st := range [...]*pgRows{LeaseNew: pgNewLeases, LeaseExpiry: pgLeaseExpiries, LeaseClaim: pgClaimLeases} {
		ls := byKind[kind]
		st.queue(b, len(ls), func(i int, vals []any) { putValues(ls[i], vals) })
	}
	if len(gone) > 0 {
		b.queue("history.DeleteLease", pgDeleteLeases, gone)
	}
}

// putValues puts l's values in vals, in the order of pgLeaseTypes.
func putValues(l *PutLease, vals []any) {
	copy(vals, []any{l.TokenDigest[:], l.UserID, l.ClientID, l.ContextID, l.TaskID,
		l.Epoch, l.TTL.Milliseconds(), l.RenewOnUse, utc(l.ExpiresAt), l.ClearState, l.Generation})
}

// abandoned is the replica_id of rows given up: no replica's id (those are
// 8 hex digits), so the rows are nobody's, and orphans.
const abandoned = "abandoned"

// AbandonReplica gives up what replica id held before it was fenced, once
// it can reach the database again without having been reaped: it forgot its
// clients and leases when it fenced, so its lease rows become orphans at
// once (for the replicas its clients went to) and its commands in flight
// end interrupted, in one transaction.
func (s *Store) AbandonReplica(ctx context.Context, id string, at time.Time) error {
	const op = "history.AbandonReplica"
	if err := s.clustered(op); err != nil {
		return err
	}
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec(`UPDATE leases SET replica_id = ?, orphaned_at = now() WHERE replica_id = ?`, abandoned, id).Error; err != nil {
			return err
		}
		if err := s.armInterrupted(tx.Where("replica_id = ?", id), at, op); err != nil {
			return err
		}
		_, err := s.markInterrupted(tx.Where("replica_id = ?", id), at, op)
		return err
	})
	return s.replicaErr(op, err)
}

// OrphanLeases marks the rows of replicas that are no longer members as
// orphaned (once: the first time counts), and deletes the orphans that no
// replica adopted within grace. Any replica may call it at any time.
func (s *Store) OrphanLeases(ctx context.Context, grace time.Duration) error {
	const op = "history.OrphanLeases"
	if err := s.clustered(op); err != nil {
		return err
	}
	db := s.db.WithContext(ctx)
	if err := db.Exec(`UPDATE leases SET orphaned_at = now() WHERE orphaned_at IS NULL AND ` + orphaned).Error; err != nil {
		return s.replicaErr(op, err)
	}
	return s.replicaErr(op, db.Exec(`DELETE FROM leases WHERE orphaned_at < now() - ? * interval '1 millisecond'`,
		grace.Milliseconds()).Error)
}

// ClaimOrphanedLeases makes the orphaned rows of a user's client that have
// not expired this replica's, and returns them at the generation it
// claimed them with: what the replica the client is connected to adopts.
// The claim is one statement, so of two replicas that claim the same
// orphan (a client's hello on one, a stale one on another) exactly one
// gets it. A row beside one of a later epoch on its context is left out:
// epochs grow per context, so its lease was lost, and adopting it would
// fence the later one's holder off with an older epoch. What the registry
// does not take goes back with GiveBackLeases.
func (s *Store) ClaimOrphanedLeases(ctx context.Context, userID, clientID string) ([]PutLease, error) {
	const op = "history.ClaimOrphanedLeases"
	if err := s.clustered(op); err != nil {
		return nil, err
	}
	type row struct {
		TokenDigest []byte
		ContextID   string
		TaskID      string
		Epoch       int64
		TTLMs       int64 `gorm:"column:ttl_ms"`
		RenewOnUse  bool
		ClearState  bool
		ExpiresAt   time.Time
		Generation  int64
	}
	var rows []row
	err := s.db.WithContext(ctx).Raw(`UPDATE leases AS l SET replica_id = COALESCE(current_setting('`+replicaSetting+`', true), ''),
	orphaned_at = NULL, generation = l.generation + 1
WHERE user_id = ? AND client_id = ? AND orphaned_at IS NOT NULL AND expires_at > now()
	AND NOT EXISTS (SELECT 1 FROM leases AS n WHERE n.user_id = l.user_id AND n.client_id = l.client_id
		AND n.context_id = l.context_id AND n.epoch > l.epoch)
RETURNING token_digest, context_id, task_id, epoch, ttl_ms, renew_on_use, clear_state, expires_at, generation`, userID, clientID).Scan(&rows).Error
	if err != nil {
		return nil, s.replicaErr(op, err)
	}
	out := make([]PutLease, 0, len(rows))
	for _, r := range rows {
		l := PutLease{UserID: userID, ClientID: clientID, ContextID: r.ContextID, TaskID: r.TaskID, Epoch: r.Epoch,
			TTL: time.Duration(r.TTLMs) * time.Millisecond, RenewOnUse: r.RenewOnUse, ClearState: r.ClearState, ExpiresAt: r.ExpiresAt,
			Generation: r.Generation}
		if copy(l.TokenDigest[:], r.TokenDigest) == len(l.TokenDigest) {
			out = append(out, l)
		}
	}
	return out, nil
}

// GiveBackLeases makes orphans of the rows of digests that are this
// replica's: ones it claimed (ClaimOrphanedLeases) and did not take in, or
// the leases it handed over with their client, for the replica the client
// is connected to, or to be deleted unadopted after the grace. A row
// another replica claimed since stays that replica's.
func (s *Store) GiveBackLeases(ctx context.Context, digests [][32]byte) error {
	const op = "history.GiveBackLeases"
	if err := s.clustered(op); err != nil {
		return err
	}
	if len(digests) == 0 {
		return nil
	}
	ds := make([][]byte, len(digests))
	for i := range digests {
		ds[i] = digests[i][:]
	}
	return s.replicaErr(op, s.db.WithContext(ctx).Exec(`UPDATE leases SET replica_id = ?, orphaned_at = now()
WHERE token_digest IN ? AND replica_id = COALESCE(current_setting('`+replicaSetting+`', true), '')`, abandoned, ds).Error)
}

// LeasedElsewhere returns the contexts of a user's client whose lease rows
// have not expired and are not this replica's: held by another replica, or
// orphaned and not adopted yet. A replica the client reconnected to leases
// none of them until the holder hands them over or ends them, or the
// orphans are adopted here or deleted. An orphan counts as held until
// then: a replica that gives up its rows once it can reach the database
// again (AbandonReplica) may orphan them between this replica's adoption
// of orphans and its look at what is held, and a context let go then would
// be leased anew while its lease, orphaned, is still to be adopted.
func (s *Store) LeasedElsewhere(ctx context.Context, userID, clientID string) ([]string, error) {
	const op = "history.LeasedElsewhere"
	if err := s.clustered(op); err != nil {
		return nil, err
	}
	var ids []string
	err := s.db.WithContext(ctx).Raw(`SELECT DISTINCT context_id FROM leases
WHERE user_id = ? AND client_id = ? AND expires_at > now()
AND replica_id <> COALESCE(current_setting('`+replicaSetting+`', true), '')`, userID, clientID).Scan(&ids).Error
	if err != nil {
		return nil, s.replicaErr(op, err)
	}
	return ids, nil
}

// LeaseRowHeld reports whether the lease of digest has a row that has not
// expired: a lease that no replica holds now (its replica died) but that a
// replica may adopt.
func (s *Store) LeaseRowHeld(ctx context.Context, digest [32]byte) (bool, error) {
	const op = "history.LeaseRowHeld"
	if err := s.clustered(op); err != nil {
		return false, err
	}
	var held bool
	err := s.db.WithContext(ctx).Raw(`SELECT EXISTS (SELECT 1 FROM leases WHERE token_digest = ? AND expires_at > now())`, digest[:]).
		Scan(&held).Error
	return held, s.replicaErr(op, err)
}

// ContextLeaseHolders returns who holds the lease rows of a context that
// have not expired: a replica's id, or "" for an orphan (held by nobody).
// A revoke that no replica could do did not find "no lease" while such a
// row stands that none of the replicas that answered holds: the replica
// the context's client reconnects to adopts it.
func (s *Store) ContextLeaseHolders(ctx context.Context, userID, clientID, contextID string) ([]string, error) {
	const op = "history.ContextLeaseHolders"
	if err := s.clustered(op); err != nil {
		return nil, err
	}
	var holders []string
	err := s.db.WithContext(ctx).Raw(`SELECT CASE WHEN orphaned_at IS NULL THEN replica_id ELSE '' END FROM leases
WHERE user_id = ? AND client_id = ? AND context_id = ? AND expires_at > now()`, userID, clientID, contextID).
		Scan(&holders).Error
	return holders, s.replicaErr(op, err)
}

// OrphanedClients returns the clients that have orphaned lease rows, by
// user id then client id.
func (s *Store) OrphanedClients(ctx context.Context) ([][2]string, error) {
	const op = "history.OrphanedClients"
	if err := s.clustered(op); err != nil {
		return nil, err
	}
	type row struct{ UserID, ClientID string }
	var rows []row
	err := s.db.WithContext(ctx).Raw(`SELECT DISTINCT user_id, client_id FROM leases WHERE orphaned_at IS NOT NULL ORDER BY 1, 2`).
		Scan(&rows).Error
	if err != nil {
		return nil, s.replicaErr(op, err)
	}
	out := make([][2]string, len(rows))
	for i, r := range rows {
		out[i] = [2]string{r.UserID, r.ClientID}
	}
	return out, nil
}
