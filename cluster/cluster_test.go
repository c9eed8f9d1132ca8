package cluster_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/cluster"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/internal/tcpproxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// guard bounds the waits for what a replica's loop does on its own. It is
// a failure guard: with the TTLs below, each happens within a second.
const guard = 20 * time.Second

// inFlight inserts an RPC command that has not ended, written by s.
func inFlight(t *testing.T, s *history.Store) cheetah.CommandRecord {
	t.Helper()
	rec := cheetah.CommandRecord{
		CommandID: uuid.Must(uuid.NewV7()).String(), UserID: "u1", ClientID: "c1", ContextID: "x1",
		TaskID: "t1", Epoch: 1, Name: "echo", ResponseMode: cheetah.ModeRPC,
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", CreatedAt: time.Now(),
	}
	require.NoError(t, s.Write(context.Background(), history.InsertCommand{Rec: rec}))
	return rec
}

func status(t *testing.T, s *history.Store, rec cheetah.CommandRecord) cheetah.Status {
	t.Helper()
	got, err := s.Get(context.Background(), rec.UserID, rec.CommandID)
	require.NoError(t, err)
	return got.Status
}

func join(t *testing.T, s *history.Store, id, url string, ttl time.Duration, onFenced func()) *cluster.Member {
	t.Helper()
	m, err := cluster.Join(context.Background(), cluster.Config{Store: s, ID: id, URL: url, TTL: ttl,
		Interval: ttl / 5, Grace: ttl / 2, OnFenced: onFenced})
	require.NoError(t, err)
	return m
}

// A replica that stops renewing is reaped by a live one, which ends its
// commands in flight as interrupted and never touches its own.
func TestLapsedReplicaIsReapedAndItsCommandsInterrupted(t *testing.T) {
	t.Parallel()
	base := historytest.NewPostgres(t)
	deadStore := historytest.Beside(t, base, historytest.Replica("dead0001"))
	liveStore := historytest.Beside(t, base, historytest.Replica("live0001"))

	// The dead replica joins and writes, then never renews: as if killed.
	// The TTL is long enough that the live one, renewing every fifth of
	// it, does not lapse on a loaded machine (400 ms once did, under -race
	// beside a benchmark, and had its own commands marked).
	const ttl = 2 * time.Second
	dead := join(t, deadStore, "dead0001", "http://127.0.0.1:1", ttl, nil)
	require.True(t, dead.Valid())
	orphan := inFlight(t, deadStore)

	live := join(t, liveStore, "live0001", "http://127.0.0.1:2", ttl, nil)
	require.Equal(t, []cluster.Peer{{ID: "dead0001", URL: "http://127.0.0.1:1"}}, live.Peers())
	own := inFlight(t, liveStore)
	live.Start()
	t.Cleanup(func() { require.NoError(t, live.Stop(context.Background())) })

	require.Eventually(t, func() bool { return status(t, base, orphan) == cheetah.StatusInterrupted }, guard, 10*time.Millisecond)
	require.False(t, dead.Valid(), "the reaped replica's own count ran out first")
	require.Empty(t, live.Peers())
	require.Equal(t, cheetah.StatusAdmitted, status(t, base, own), "a live replica's work is never marked")
	require.True(t, live.Valid())
}

// A replica that starts again at the same address ends its previous life's
// commands at once, without waiting for the row to lapse.
func TestRestartAtTheSameAddressEndsThePreviousLife(t *testing.T) {
	t.Parallel()
	base := historytest.NewPostgres(t)
	first := historytest.Beside(t, base, historytest.Replica("aaaa0001"))
	join(t, first, "aaaa0001", "http://127.0.0.1:9", time.Hour, nil)
	rec := inFlight(t, first)

	second := historytest.Beside(t, base, historytest.Replica("aaaa0002"))
	join(t, second, "aaaa0002", "http://127.0.0.1:9", time.Hour, nil)
	require.Equal(t, cheetah.StatusInterrupted, status(t, base, rec))
}

// A replica cut off from the database fences itself (OnFenced) before any
// other replica reaps it, and acts again once the database answers.
func TestCutOffReplicaFencesBeforeItIsReaped(t *testing.T) {
	t.Parallel()
	base := historytest.NewPostgres(t)
	pg, err := url.Parse(historytest.ServerURL())
	require.NoError(t, err)
	link := tcpproxy.Start(t, "127.0.0.1:0", pg.Host)
	cutStore := historytest.Beside(t, base, historytest.Replica("cut00001"), historytest.Through(link.Addr()))
	watchStore := historytest.Beside(t, base, historytest.Replica("watch001"))

	var mu sync.Mutex
	var fencedAt time.Time
	fenced := make(chan struct{}, 4)
	cut := join(t, cutStore, "cut00001", "", 600*time.Millisecond, func() {
		mu.Lock()
		fencedAt = time.Now()
		mu.Unlock()
		fenced <- struct{}{}
	})
	rec := inFlight(t, cutStore)
	cut.Start()
	t.Cleanup(func() { _ = cut.Stop(context.Background()) })

	watch := join(t, watchStore, "watch001", "", 600*time.Millisecond, nil)
	watch.Start()
	t.Cleanup(func() { require.NoError(t, watch.Stop(context.Background())) })

	link.Cut()
	select {
	case <-fenced:
	case <-time.After(guard):
		t.Fatal("the cut-off replica never fenced")
	}
	require.False(t, cut.Valid())
	require.Eventually(t, func() bool { return status(t, base, rec) == cheetah.StatusInterrupted }, guard, 10*time.Millisecond)
	reapedAt := time.Now()
	mu.Lock()
	require.True(t, fencedAt.Before(reapedAt))
	mu.Unlock()

	// Back on the database, the replica finds itself reaped and joins again.
	link.Heal()
	require.Eventually(t, cut.Valid, guard, 10*time.Millisecond)
}

// waitingClock is a fake clock that tells when a loop waits on one of its
// tickers: Chan is called as a select begins, after whatever the loop did
// before it.
type waitingClock struct {
	*clockwork.FakeClock
	mu      sync.Mutex
	waiting map[*waitingTicker]int
}

type waitingTicker struct {
	clockwork.Ticker
	c *waitingClock
}

func (c *waitingClock) NewTicker(d time.Duration) clockwork.Ticker {
	return &waitingTicker{Ticker: c.FakeClock.NewTicker(d), c: c}
}

func (t *waitingTicker) Chan() <-chan time.Time {
	t.c.mu.Lock()
	t.c.waiting[t]++
	t.c.mu.Unlock()
	return t.Ticker.Chan()
}

// waits reports whether n tickers were each waited on at least once.
func (c *waitingClock) waits(n int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiting) >= n
}

// waited counts the waits on every ticker so far.
func (c *waitingClock) waited() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, k := range c.waiting {
		n += k
	}
	return n
}

// A replica back from a fence first writes what it decided before
// (Settle), then gives up what it held: a lease ended before the fence,
// whose row's deletion was held through the outage, has its row deleted
// while it is still the replica's, rather than orphaned and adopted again.
// While that write fails, the replica stays fenced and gives up nothing.
func TestFencedReplicaSettlesBeforeItGivesUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base := historytest.NewPostgres(t)
	store := historytest.Beside(t, base, historytest.Replica("settle01"))
	other := historytest.Joined(t, base, "settle02")[0]
	clock := &waitingClock{FakeClock: clockwork.NewFakeClock(), waiting: map[*waitingTicker]int{}}
	row := func(token, contextID string) history.PutLease {
		return history.PutLease{Kind: history.LeaseNew, TokenDigest: sha256.Sum256([]byte(token)), UserID: "u1", ClientID: "c1",
			ContextID: contextID, TaskID: "t1", Epoch: 1, TTL: time.Hour, ExpiresAt: time.Now().Add(time.Hour).UTC()}
	}
	ended, held := row("ended", "x1"), row("held", "x2")
	var settles atomic.Int32
	var answers atomic.Bool
	settle := func(ctx context.Context) error {
		settles.Add(1)
		if !answers.Load() {
			return errors.New("the database does not answer yet")
		}
		// Decided before the fence, written only now.
		return store.Write(ctx, history.DeleteLease{TokenDigest: ended.TokenDigest})
	}
	m, err := cluster.Join(ctx, cluster.Config{Store: store, ID: "settle01", Clock: clock,
		TTL: 5 * time.Second, Interval: time.Second, Settle: settle})
	require.NoError(t, err)
	require.NoError(t, store.Write(ctx, ended, held))
	m.Start()
	t.Cleanup(func() { require.NoError(t, m.Stop(context.Background())) })
	orphans := func() []string {
		t.Helper()
		rows, err := other.ClaimOrphanedLeases(ctx, "u1", "c1")
		require.NoError(t, err)
		var ids []string
		for _, r := range rows {
			ids = append(ids, r.ContextID)
		}
		return ids
	}

	require.Eventually(t, func() bool { return clock.waits(2) }, guard, time.Millisecond)
	before := clock.waited()
	clock.Advance(6 * time.Second) // the row may have lapsed: a fence
	require.Eventually(t, func() bool { return settles.Load() > 0 && clock.waited() >= before+2 }, guard, time.Millisecond,
		"a try, and both loops wait again")
	require.False(t, m.Valid())
	require.Empty(t, orphans(), "nothing given up while the write fails")

	answers.Store(true)
	clock.Advance(time.Second)
	require.Eventually(t, m.Valid, guard, time.Millisecond)
	require.Equal(t, []string{"x2"}, orphans(), "the lease ended before the fence stays ended; the other is given up")
}

// A row that lapsed between two renewals fences the replica even when the
// next renewal succeeds: while it was unsure it refused the hand-overs of
// clients that moved on, so it gives up what it held before acting again.
func TestLapseBetweenRenewalsFences(t *testing.T) {
	t.Parallel()
	base := historytest.NewPostgres(t)
	store := historytest.Beside(t, base, historytest.Replica("lapse001"))
	clock := &waitingClock{FakeClock: clockwork.NewFakeClock(), waiting: map[*waitingTicker]int{}}
	fenced := make(chan struct{}, 8)
	m, err := cluster.Join(context.Background(), cluster.Config{Store: store, ID: "lapse001", Clock: clock,
		TTL: 5 * time.Second, Interval: time.Second, OnFenced: func() { fenced <- struct{}{} }})
	require.NoError(t, err)
	rec := inFlight(t, store)
	m.Start()
	t.Cleanup(func() { require.NoError(t, m.Stop(context.Background())) })

	// Both loops wait for their first tick; the next renewal comes after
	// the row may have lapsed (a stalled process, a slow database).
	require.Eventually(t, func() bool { return clock.waits(2) }, guard, time.Millisecond)
	require.True(t, m.Valid())
	clock.Advance(6 * time.Second)
	select {
	case <-fenced:
	case <-time.After(guard):
		t.Fatal("the replica acted on after its row may have lapsed")
	}
	require.Eventually(t, func() bool { return status(t, base, rec) == cheetah.StatusInterrupted }, guard, 10*time.Millisecond,
		"what it held is given up before it acts again")
	require.Eventually(t, m.Valid, guard, 10*time.Millisecond)
}

// Requests between replicas are signed with the secret they share through
// the database; a signature from elsewhere, an altered request or an old
// one does not hold.
func TestPeerSignatures(t *testing.T) {
	t.Parallel()
	base := historytest.NewPostgres(t)
	clock := clockwork.NewFakeClockAt(time.Now())
	a, err := cluster.Join(context.Background(), cluster.Config{Store: base, ID: "sign0001", Clock: clock, TTL: time.Hour})
	require.NoError(t, err)
	b, err := cluster.Join(context.Background(), cluster.Config{Store: base, ID: "sign0002", Clock: clock, TTL: time.Hour})
	require.NoError(t, err)
	other := historytest.NewPostgres(t) // another cluster: another secret
	stranger, err := cluster.Join(context.Background(), cluster.Config{Store: other, ID: "sign0003", Clock: clock, TTL: time.Hour})
	require.NoError(t, err)

	req := func() *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/api/v1/commands?x=1", strings.NewReader(`{"name":"echo"}`))
		r.Header.Set("Authorization", "Bearer k")
		r.Header.Set("X-Lease", "tok")
		return r
	}
	r := req()
	id, signed, err := b.Verify(r)
	require.NoError(t, err)
	require.False(t, signed)
	require.Empty(t, id)

	r = req()
	require.NoError(t, a.Sign(r))
	id, signed, err = b.Verify(r)
	require.NoError(t, err)
	require.True(t, signed)
	require.Equal(t, "sign0001", id)
	got, err := io.ReadAll(r.Body)
	require.NoError(t, err)
	require.Equal(t, `{"name":"echo"}`, string(got), "the body is there to read after both")

	// The same request again, as whoever captured it would send it: taken
	// once. Two requests alike, each signed, both pass.
	again := req()
	again.Header.Set(cluster.PeerHeader, r.Header.Get(cluster.PeerHeader))
	_, signed, err = b.Verify(again)
	require.True(t, signed)
	require.ErrorIs(t, err, cluster.ErrBadSignature, "a replay within the window")
	for range 2 {
		twin := req()
		require.NoError(t, a.Sign(twin))
		_, _, err = b.Verify(twin)
		require.NoError(t, err, "alike, but each signed once")
	}

	for name, alter := range map[string]func(*http.Request){
		"lease":  func(r *http.Request) { r.Header.Set("X-Lease", "other") },
		"key":    func(r *http.Request) { r.Header.Set("Authorization", "Bearer other") },
		"path":   func(r *http.Request) { r.URL.RawQuery = "x=2" },
		"method": func(r *http.Request) { r.Method = http.MethodGet },
		"body":   func(r *http.Request) { r.Body = io.NopCloser(strings.NewReader(`{"name":"click"}`)) },
	} {
		r = req()
		require.NoError(t, a.Sign(r))
		alter(r)
		_, signed, err = b.Verify(r)
		require.True(t, signed, name)
		require.ErrorIs(t, err, cluster.ErrBadSignature, name)
	}

	r = req()
	require.NoError(t, stranger.Sign(r))
	_, _, err = b.Verify(r)
	require.ErrorIs(t, err, cluster.ErrBadSignature, "another cluster's secret")

	r = req()
	require.NoError(t, a.Sign(r))
	clock.Advance(time.Minute)
	_, _, err = b.Verify(r)
	require.ErrorIs(t, err, cluster.ErrBadSignature, "a replayed request")
}

// SQLite is single-node: the replica methods refuse.
func TestSQLiteIsSingleNode(t *testing.T) {
	t.Parallel()
	s := historytest.NewSQLite(t)
	_, err := cluster.Join(context.Background(), cluster.Config{Store: s, ID: cluster.NewID()})
	require.ErrorIs(t, err, history.ErrNotClustered)
}
