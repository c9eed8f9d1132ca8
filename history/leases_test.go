package history_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/history/historytest"
)

// Lease rows belong to the replica that wrote them: another replica's
// plain writes (held through an outage, say) leave them alone, a claim
// takes them, and the rows of a replica that is gone become orphans that
// the replica a client reconnects to adopts.
func TestLeaseRowsBelongToTheirReplica(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base, a, b := twoReplicas(t, "leaseaaa", "leasebbb")

	expires := time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)
	row := history.PutLease{TokenDigest: sha256.Sum256([]byte("token-1")), UserID: "u1", ClientID: "c1", ContextID: "x1",
		TaskID: "t1", Epoch: 7, TTL: time.Minute, RenewOnUse: true, ClearState: true, ExpiresAt: expires}
	row.Kind = history.LeaseNew
	require.NoError(t, a.Write(ctx, row))
	gone := history.PutLease{Kind: history.LeaseNew, TokenDigest: sha256.Sum256([]byte("token-2")), UserID: "u1", ClientID: "c1", ContextID: "x2",
		TaskID: "t1", Epoch: 8, TTL: time.Minute, ExpiresAt: expires}
	require.NoError(t, a.Write(ctx, gone, history.DeleteLease{TokenDigest: gone.TokenDigest}))

	owner := func() (replica string, exp time.Time) {
		t.Helper()
		db := historytest.DB(t, base)
		require.NoError(t, db.QueryRow(`SELECT replica_id, expires_at FROM leases WHERE token_digest = $1`, row.TokenDigest[:]).Scan(&replica, &exp))
		return replica, exp.UTC()
	}
	r, exp := owner()
	require.Equal(t, "leaseaaa", r)
	require.Equal(t, expires, exp)

	// B's expiry write and delete do not touch A's row; an expiry write
	// makes no row (a write replayed after its lease ended brings it back
	// to nothing), nor does a new-lease write replayed on a row.
	later := row
	later.Kind = history.LeaseExpiry
	later.ExpiresAt = expires.Add(time.Hour)
	require.NoError(t, b.Write(ctx, later, history.DeleteLease{TokenDigest: row.TokenDigest}))
	r, exp = owner()
	require.Equal(t, "leaseaaa", r)
	require.Equal(t, expires, exp)

	require.NoError(t, a.Write(ctx, history.PutLease{Kind: history.LeaseExpiry, TokenDigest: gone.TokenDigest, ExpiresAt: expires}))
	require.NoError(t, b.Write(ctx, history.PutLease{Kind: history.LeaseNew, TokenDigest: row.TokenDigest, UserID: "u1",
		ClientID: "c1", ContextID: "x1", TaskID: "t1", Epoch: 7, TTL: time.Minute, ExpiresAt: later.ExpiresAt}))
	r, exp = owner()
	require.Equal(t, "leaseaaa", r)
	require.Equal(t, expires, exp)

	// A claim makes it B's; A's late writes then change nothing.
	claim := later
	claim.Kind, claim.Generation = history.LeaseClaim, 2
	require.NoError(t, b.Write(ctx, claim))
	require.NoError(t, a.Write(ctx, history.DeleteLease{TokenDigest: row.TokenDigest},
		history.PutLease{Kind: history.LeaseExpiry, TokenDigest: row.TokenDigest, ExpiresAt: expires}))
	r, exp = owner()
	require.Equal(t, "leasebbb", r)
	require.Equal(t, later.ExpiresAt, exp)

	// A claim of an earlier move that commits late (generation 1, the
	// lease passed through A on its way to B) takes nothing back.
	late := claim
	late.Generation, late.ExpiresAt = 1, expires
	require.NoError(t, a.Write(ctx, late))
	r, exp = owner()
	require.Equal(t, "leasebbb", r, "claims are ordered by generation, not by commit")
	require.Equal(t, later.ExpiresAt, exp)

	// B goes; its row is orphaned and offered to whoever holds the client.
	require.NoError(t, b.LeaveReplica(ctx, "leasebbb"))
	require.NoError(t, a.OrphanLeases(ctx, time.Hour))
	clients, err := a.OrphanedClients(ctx)
	require.NoError(t, err)
	require.Equal(t, [][2]string{{"u1", "c1"}}, clients)
	// A claims it: no orphan is left, and the row is A's.
	rows, err := a.ClaimOrphanedLeases(ctx, "u1", "c1")
	require.NoError(t, err)
	require.Len(t, rows, 1, "the deleted lease is not offered, nor brought back by an expiry write")
	got := rows[0]
	require.Equal(t, row.TokenDigest, got.TokenDigest)
	require.Equal(t, int64(7), got.Epoch)
	require.Equal(t, "x1", got.ContextID)
	require.Equal(t, time.Minute, got.TTL)
	require.True(t, got.RenewOnUse)
	require.True(t, got.ClearState, "the adopter clears the context when the lease ends, as its first holder would have")
	require.Equal(t, int64(3), got.Generation, "claimed with one more")
	rows, err = a.ClaimOrphanedLeases(ctx, "u1", "c1")
	require.NoError(t, err)
	require.Empty(t, rows)
	r, _ = owner()
	require.Equal(t, "leaseaaa", r)
	// A claim it made is ordered with its writes: a move of the lease
	// claims with one more.
	got.Kind = history.LeaseClaim
	require.NoError(t, b.Write(ctx, got))
	r, _ = owner()
	require.Equal(t, "leaseaaa", r, "a claim of the same generation takes nothing")

	// An orphan nobody adopts within the grace is deleted.
	require.NoError(t, a.LeaveReplica(ctx, "leaseaaa"))
	require.NoError(t, b.JoinReplica(ctx, "leasebbb", "", time.Hour))
	require.NoError(t, b.OrphanLeases(ctx, time.Hour))
	require.NoError(t, b.OrphanLeases(ctx, -time.Hour))
	clients, err = b.OrphanedClients(ctx)
	require.NoError(t, err)
	require.Empty(t, clients)
}

// A batch writes its lease rows from a VALUES list when it has a few and
// from arrays when it has more: both make the same rows.
func TestLeaseRowsInBatchesOfEverySize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base, a, b := twoReplicas(t, "sizeaaaa", "sizebbbb")
	db := historytest.DB(t, base)
	expires := time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)

	for _, n := range []int{1, 3, 7, 8, 20} {
		rows := make([]history.PutLease, n)
		ops := func(kind history.PutKind, at time.Time, generation int64) []history.Op {
			out := make([]history.Op, n)
			for i := range rows {
				rows[i].Kind, rows[i].ExpiresAt, rows[i].Generation = kind, at, generation
				out[i] = rows[i]
			}
			return out
		}
		for i := range rows {
			rows[i] = history.PutLease{TokenDigest: sha256.Sum256(fmt.Appendf(nil, "size-%d-%d", n, i)), UserID: "u1", ClientID: "c1",
				ContextID: fmt.Sprintf("x%d", i), TaskID: "t1", Epoch: int64(100*n + i), TTL: time.Duration(i+1) * time.Second,
				RenewOnUse: i%2 == 0, ClearState: i%3 == 0}
		}
		check := func(replica string, at time.Time) {
			t.Helper()
			for i, l := range rows {
				var (
					got    history.PutLease
					digest []byte
					owner  string
					exp    time.Time
					ttl    int64
				)
				require.NoError(t, db.QueryRow(`SELECT token_digest, user_id, client_id, context_id, task_id, epoch, ttl_ms, renew_on_use, expires_at, clear_state, generation, replica_id
FROM leases WHERE token_digest = $1`, l.TokenDigest[:]).Scan(&digest, &got.UserID, &got.ClientID, &got.ContextID, &got.TaskID, &got.Epoch,
					&ttl, &got.RenewOnUse, &exp, &got.ClearState, &got.Generation, &owner), "n=%d row %d", n, i)
				require.Equal(t, l.TokenDigest[:], digest)
				got.TokenDigest, got.Kind, got.TTL, got.ExpiresAt = l.TokenDigest, l.Kind, time.Duration(ttl)*time.Millisecond, at
				require.Equal(t, l, got, "n=%d row %d", n, i)
				require.Equal(t, at, exp.UTC(), "n=%d row %d", n, i)
				require.Equal(t, replica, owner, "n=%d row %d", n, i)
			}
		}
		require.NoError(t, a.Write(ctx, ops(history.LeaseNew, expires, 0)...))
		check("sizeaaaa", expires)
		require.NoError(t, a.Write(ctx, ops(history.LeaseExpiry, expires.Add(time.Minute), 0)...))
		check("sizeaaaa", expires.Add(time.Minute))
		require.NoError(t, b.Write(ctx, ops(history.LeaseClaim, expires.Add(2*time.Minute), 1)...))
		check("sizebbbb", expires.Add(2*time.Minute))
		del := make([]history.Op, n)
		for i, l := range rows {
			del[i] = history.DeleteLease{TokenDigest: l.TokenDigest}
		}
		require.NoError(t, b.Write(ctx, del...))
		var left int
		require.NoError(t, db.QueryRow(`SELECT count(*) FROM leases`).Scan(&left))
		require.Zero(t, left, "n=%d", n)
	}
}

// Of two orphaned rows on one context (a lease whose row outlived its end,
// beside its successor's), only the later epoch is offered for adoption.
func TestOrphanedLeasesOfferTheLatestEpochOfAContext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, a, b := twoReplicas(t, "orphaaaa", "orphbbbb")

	expires := time.Now().Add(time.Hour).UTC()
	lease := func(token, contextID string, epoch int64) history.PutLease {
		return history.PutLease{Kind: history.LeaseNew, TokenDigest: sha256.Sum256([]byte(token)), UserID: "u1", ClientID: "c1",
			ContextID: contextID, TaskID: "t1", Epoch: epoch, TTL: time.Minute, ExpiresAt: expires}
	}
	// The later lease first: the order of the rows is not what decides.
	require.NoError(t, a.Write(ctx, lease("later", "x1", 9), lease("earlier", "x1", 6), lease("other", "x2", 4)))
	require.NoError(t, a.LeaveReplica(ctx, "orphaaaa"))
	require.NoError(t, b.OrphanLeases(ctx, time.Hour))

	rows, err := b.ClaimOrphanedLeases(ctx, "u1", "c1")
	require.NoError(t, err)
	got := map[string]int64{}
	for _, r := range rows {
		got[r.ContextID] = r.Epoch
	}
	require.Len(t, rows, 2)
	require.Equal(t, map[string]int64{"x1": 9, "x2": 4}, got)
}

// twoReplicas opens two stores on one new PostgreSQL database, each a
// replica of the given id that has joined, and returns the database's own
// store with them.
func twoReplicas(t *testing.T, idA, idB string) (base, a, b *history.Store) {
	t.Helper()
	base = historytest.NewPostgres(t)
	rs := historytest.Joined(t, base, idA, idB)
	return base, rs[0], rs[1]
}

// A context whose lease row another replica holds stays held from another
// replica's view until that row is gone or this replica's own: orphaned
// and not adopted yet, it still stands for a lease the client's replica
// is to adopt (ContextLeaseHolders says it is nobody's).
func TestLeasedElsewhereCountsOrphansUntilAdopted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, a, b := twoReplicas(t, "elseaaaa", "elsebbbb")

	expires := time.Now().Add(time.Hour).UTC()
	row := func(token, contextID string, epoch int64, exp time.Time) history.PutLease {
		return history.PutLease{Kind: history.LeaseNew, TokenDigest: sha256.Sum256([]byte(token)), UserID: "u1", ClientID: "c1",
			ContextID: contextID, TaskID: "t1", Epoch: epoch, TTL: time.Minute, ExpiresAt: exp}
	}
	require.NoError(t, a.Write(ctx, row("held", "x1", 3, expires), row("ended", "x2", 4, expires),
		row("expired", "x3", 5, time.Now().Add(-time.Minute).UTC())))
	require.NoError(t, a.Write(ctx, history.DeleteLease{TokenDigest: sha256.Sum256([]byte("ended"))}))
	held := func() []string {
		t.Helper()
		ids, err := b.LeasedElsewhere(ctx, "u1", "c1")
		require.NoError(t, err)
		return ids
	}
	require.Equal(t, []string{"x1"}, held())
	own, err := a.LeasedElsewhere(ctx, "u1", "c1")
	require.NoError(t, err)
	require.Empty(t, own, "a replica's own rows are not elsewhere")
	// Who holds each context's row: A, then nobody (an orphan), then B.
	holders := func(want string) {
		t.Helper()
		for _, s := range []*history.Store{a, b} {
			got := map[string][]string{}
			for _, x := range []string{"x1", "x2", "x3", "x4"} {
				h, err := s.ContextLeaseHolders(ctx, "u1", "c1", x)
				require.NoError(t, err)
				if len(h) > 0 {
					got[x] = h
				}
			}
			require.Equal(t, map[string][]string{"x1": {want}}, got, "only x1's row stands")
		}
	}
	holders("elseaaaa")

	// A gives its rows up: orphaned, x1's lease is still to be adopted.
	require.NoError(t, a.AbandonReplica(ctx, "elseaaaa", time.Now()))
	require.Equal(t, []string{"x1"}, held(), "an orphan not adopted yet holds its context")
	holders("")

	// B claims it: it is B's own now.
	claimed, err := b.ClaimOrphanedLeases(ctx, "u1", "c1")
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	require.Empty(t, held())
	holders("elsebbbb")
}

// Replicas that claim the same client's orphans at once (its hello on one,
// a hello of a connection already gone on another) never both get one: a
// lease adopted twice would be held twice. What a replica gives back is an
// orphan again, for the next claim.
func TestOrphansAreClaimedOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const replicas, leases = 6, 20
	ids := make([]string, replicas)
	for i := range ids {
		ids[i] = fmt.Sprintf("clai%04d", i)
	}
	stores := historytest.Joined(t, historytest.NewPostgres(t), ids...)
	expires := time.Now().Add(time.Hour).UTC()
	for round := range 5 {
		client := fmt.Sprintf("c%d", round)
		for i := range leases {
			require.NoError(t, stores[0].Write(ctx, history.PutLease{Kind: history.LeaseNew,
				TokenDigest: sha256.Sum256(fmt.Appendf(nil, "%s-%d", client, i)), UserID: "u1", ClientID: client,
				ContextID: fmt.Sprintf("x%d", i), TaskID: "t1", Epoch: int64(i + 1), TTL: time.Minute, ExpiresAt: expires}))
		}
		require.NoError(t, stores[0].AbandonReplica(ctx, "clai0000", time.Now()))

		claimed := make([][]history.PutLease, replicas)
		var wg sync.WaitGroup
		for i := 1; i < replicas; i++ {
			wg.Go(func() {
				rows, err := stores[i].ClaimOrphanedLeases(ctx, "u1", client)
				assert.NoError(t, err)
				claimed[i] = rows
			})
		}
		wg.Wait()
		seen := map[[32]byte]int{}
		for i, rows := range claimed {
			for _, r := range rows {
				prev, twice := seen[r.TokenDigest]
				require.False(t, twice, "round %d: lease %s claimed by replicas %d and %d", round, r.ContextID, prev, i)
				seen[r.TokenDigest] = i
			}
		}
		require.Len(t, seen, leases, "round %d: every orphan is claimed", round)

		// A claimant gives its rows back; another claims them again. A
		// replica gives back only rows that are its own.
		giver := slices.IndexFunc(claimed, func(rows []history.PutLease) bool { return len(rows) > 0 })
		other := 1 + giver%(replicas-1)
		digests := make([][32]byte, len(claimed[giver]))
		for j, r := range claimed[giver] {
			digests[j] = r.TokenDigest
		}
		require.NoError(t, stores[other].GiveBackLeases(ctx, digests))
		rows, err := stores[other].ClaimOrphanedLeases(ctx, "u1", client)
		require.NoError(t, err)
		require.Empty(t, rows, "round %d: rows given back by a replica they are not the rows of", round)
		require.NoError(t, stores[giver].GiveBackLeases(ctx, digests))
		again, err := stores[other].ClaimOrphanedLeases(ctx, "u1", client)
		require.NoError(t, err)
		require.Len(t, again, len(digests), "round %d: what was given back is claimed again", round)
		for _, r := range again {
			require.Equal(t, claimed[giver][0].Generation+1, r.Generation, "round %d", round)
		}
	}
}
