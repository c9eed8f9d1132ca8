package history_test

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

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
	base := historytest.NewPostgres(t)
	a := historytest.Beside(t, base, historytest.Replica("leaseaaa"))
	b := historytest.Beside(t, base, historytest.Replica("leasebbb"))
	require.NoError(t, a.JoinReplica(ctx, "leaseaaa", "", time.Hour))
	require.NoError(t, b.JoinReplica(ctx, "leasebbb", "", time.Hour))

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
	rows, err := a.OrphanedLeases(ctx, "u1", "c1")
	require.NoError(t, err)
	require.Len(t, rows, 1, "the deleted lease is not offered, nor brought back by an expiry write")
	got := rows[0]
	require.Equal(t, row.TokenDigest, got.TokenDigest)
	require.Equal(t, int64(7), got.Epoch)
	require.Equal(t, "x1", got.ContextID)
	require.Equal(t, time.Minute, got.TTL)
	require.True(t, got.RenewOnUse)
	require.True(t, got.ClearState, "the adopter clears the context when the lease ends, as its first holder would have")
	require.Equal(t, int64(2), got.Generation, "the adopter claims with one more")

	// A adopts it: no orphan is left.
	got.Kind = history.LeaseClaim
	got.Generation++
	require.NoError(t, a.Write(ctx, got))
	rows, err = a.OrphanedLeases(ctx, "u1", "c1")
	require.NoError(t, err)
	require.Empty(t, rows)
	r, _ = owner()
	require.Equal(t, "leaseaaa", r)

	// An orphan nobody adopts within the grace is deleted.
	require.NoError(t, a.LeaveReplica(ctx, "leaseaaa"))
	require.NoError(t, b.JoinReplica(ctx, "leasebbb", "", time.Hour))
	require.NoError(t, b.OrphanLeases(ctx, time.Hour))
	require.NoError(t, b.OrphanLeases(ctx, -time.Hour))
	clients, err = b.OrphanedClients(ctx)
	require.NoError(t, err)
	require.Empty(t, clients)
}
