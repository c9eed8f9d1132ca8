package auth_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/server/auth"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func setup(t *testing.T, adminKey string) *auth.Keys {
	t.Helper()
	return auth.New(historytest.NewSQLite(t), adminKey, time.Now)
}

func TestCreateVerifyRevoke(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	k := setup(t, "")
	c, err := k.Create(ctx, auth.Client, "usr_1", "laptop")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(c.Secret, "chk_"+c.ID+"_"))
	require.Empty(t, c.WebhookSecret, "client keys sign nothing")

	got, err := k.Verify(ctx, c.Secret)
	require.NoError(t, err)
	require.Equal(t, auth.Client, got.Kind)
	require.Equal(t, "usr_1", got.UserID)

	for _, bad := range []string{"", "chk_", "chk_" + c.ID, "chk_" + c.ID + "_wrong", c.Secret + "x", strings.TrimPrefix(c.Secret, "chk_"), "chk_ffffffffffff_" + strings.Split(c.Secret, "_")[2]} {
		_, err := k.Verify(ctx, bad)
		require.ErrorIs(t, err, cheetah.ErrUnauthorized, bad)
	}

	ok, err := k.Revoke(ctx, c.ID)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = k.Verify(ctx, c.Secret)
	require.ErrorIs(t, err, cheetah.ErrUnauthorized, "a revoked key is refused at once")
	ok, err = k.Revoke(ctx, c.ID)
	require.NoError(t, err)
	require.False(t, ok)

	app, err := k.Create(ctx, auth.App, "", "backend")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(app.WebhookSecret, "whsec_"))
	list, err := k.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
}

func TestCreateValidation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	k := setup(t, "")
	for _, tc := range []struct {
		kind auth.Kind
		user string
		name string
	}{
		{auth.Client, "", "x"},
		{auth.Client, "bad user", "x"},
		{auth.App, "usr_1", "x"},
		{"root", "", "x"},
		{auth.Admin, "", strings.Repeat("n", 129)},
	} {
		_, err := k.Create(ctx, tc.kind, tc.user, tc.name)
		require.ErrorIs(t, err, cheetah.ErrInvalidRequest, "%+v", tc)
	}
}

func TestBootstrapAndEnsureAdmin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	k := setup(t, "s3cret-admin-key")
	got, err := k.Verify(ctx, "s3cret-admin-key")
	require.NoError(t, err)
	require.Equal(t, auth.Admin, got.Kind)
	secret, err := k.EnsureAdmin(ctx)
	require.NoError(t, err)
	require.Empty(t, secret, "the environment's key is the admin key")

	k2 := setup(t, "")
	secret, err = k2.EnsureAdmin(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, secret)
	got, err = k2.Verify(ctx, secret)
	require.NoError(t, err)
	require.Equal(t, auth.Admin, got.Kind)
	again, err := k2.EnsureAdmin(ctx)
	require.NoError(t, err)
	require.Empty(t, again, "made once, never again")
}

// countingStore is a real store that counts the key lookups that reach it.
type countingStore struct {
	*history.Store
	gets atomic.Int64
}

func (s *countingStore) GetKey(ctx context.Context, id string) (history.Key, error) {
	s.gets.Add(1)
	return s.Store.GetKey(ctx, id)
}

// TestUnknownKeyIDsSpareTheStore: a key id the store does not know is
// remembered for a while, so a flood of made-up keys costs one lookup per
// id, not one per request; after the while it is asked again.
func TestUnknownKeyIDsSpareTheStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := &countingStore{Store: historytest.NewSQLite(t)}
	now := time.Now()
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	k := auth.New(store, "", clock)

	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				_, err := k.Verify(ctx, "chk_0123456789ab_secret")
				require.ErrorIs(t, err, cheetah.ErrUnauthorized)
			}
		})
	}
	wg.Wait()
	// Concurrent first requests may each look before one remembers.
	require.LessOrEqual(t, store.gets.Load(), int64(8))
	first := store.gets.Load()
	_, err := k.Verify(ctx, "chk_0123456789ab_secret")
	require.ErrorIs(t, err, cheetah.ErrUnauthorized)
	require.Equal(t, first, store.gets.Load(), "remembered")
	_, err = k.Verify(ctx, "chk_ba9876543210_secret")
	require.ErrorIs(t, err, cheetah.ErrUnauthorized)
	require.Equal(t, first+1, store.gets.Load(), "another id is looked up")

	mu.Lock()
	now = now.Add(11 * time.Second)
	mu.Unlock()
	_, err = k.Verify(ctx, "chk_0123456789ab_secret")
	require.ErrorIs(t, err, cheetah.ErrUnauthorized)
	require.Equal(t, first+2, store.gets.Load(), "forgotten after a while")

	// A real key is unaffected, and so is one made after its id was tried.
	c, err := k.Create(ctx, auth.App, "", "backend")
	require.NoError(t, err)
	got, err := k.Verify(ctx, c.Secret)
	require.NoError(t, err)
	require.Equal(t, c.ID, got.ID)
}

// TestActive: a key's id answers while the key is active, and not once it
// is revoked or was never made; the bootstrap id answers only when the
// environment gave an admin key.
func TestActive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	k := setup(t, "the-bootstrap-admin-key")
	c, err := k.Create(ctx, auth.Admin, "", "operator")
	require.NoError(t, err)
	got, err := k.Active(ctx, c.ID)
	require.NoError(t, err)
	require.Equal(t, auth.Admin, got.Kind)
	require.Equal(t, "operator", got.Name)
	boot, err := k.Active(ctx, auth.BootstrapID)
	require.NoError(t, err)
	require.Equal(t, auth.Admin, boot.Kind)

	ok, err := k.Revoke(ctx, c.ID)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = k.Active(ctx, c.ID)
	require.ErrorIs(t, err, cheetah.ErrUnauthorized)
	_, err = k.Active(ctx, "ffffffffffff")
	require.ErrorIs(t, err, cheetah.ErrUnauthorized)
	_, err = setup(t, "").Active(ctx, auth.BootstrapID)
	require.ErrorIs(t, err, cheetah.ErrUnauthorized, "no bootstrap key without CHEETAH_ADMIN_KEY")
}

// Two Keys on one store, as two replicas: a key revoked through one is
// refused by the other once it forgets it, or once its cached copy is
// older than SetCacheFor, whichever comes first.
func TestRevocationReachesAnotherKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := historytest.NewSQLite(t)
	var now atomic.Int64
	now.Store(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	a, b := auth.New(store, "", clock), auth.New(store, "", clock)
	b.SetCacheFor(10 * time.Second)

	for _, forget := range []bool{true, false} {
		c, err := a.Create(ctx, auth.App, "", "app")
		require.NoError(t, err)
		_, err = b.Verify(ctx, c.Secret) // b caches it
		require.NoError(t, err)
		ok, err := a.Revoke(ctx, c.ID)
		require.NoError(t, err)
		require.True(t, ok)
		_, err = b.Verify(ctx, c.Secret)
		require.NoError(t, err, "b trusts its cached copy for now")
		if forget {
			b.Forget(c.ID)
		} else {
			now.Add(int64(11 * time.Second))
		}
		_, err = b.Verify(ctx, c.Secret)
		require.ErrorIs(t, err, cheetah.ErrUnauthorized, "forget=%v", forget)
	}
}
