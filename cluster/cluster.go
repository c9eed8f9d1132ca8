// Package cluster makes brokers on one PostgreSQL database replicas of one
// broker (DESIGN §9). PostgreSQL is the authority and the only thing the
// replicas agree through: each replica keeps a row that lapses unless it
// renews it, stops acting for its clients as soon as it cannot be sure its
// row is still there, and any replica removes the rows that lapsed and ends
// their commands as interrupted. There is no protocol of our own between
// replicas beyond signed HTTP requests: a request that belongs to a client
// on another replica is passed to it as it came.
//
// The time a replica may act is counted from before it asked the database,
// on its own monotonic clock: the row lapses later, by the database's clock,
// and other replicas wait a grace beyond that before they reap it. So a
// replica that loses the database (or is cut off from it) has stopped acting
// before anyone takes its place.
package cluster

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"go.opentelemetry.io/otel/metric"

	"github.com/cheetahbroker/cheetah/history"
)

// Store is what a replica needs of the database; *history.Store is one.
type Store interface {
	// JoinReplica makes id a member that lapses ttl from now unless renewed.
	JoinReplica(ctx context.Context, id, url string, ttl time.Duration) error
	// RenewReplica moves id's lapse to ttl from now; false when the row is
	// gone (the others declared this replica dead).
	RenewReplica(ctx context.Context, id string, ttl time.Duration) (bool, error)
	// LeaveReplica removes id's row.
	LeaveReplica(ctx context.Context, id string) error
	// Replicas lists the members whose rows have not lapsed.
	Replicas(ctx context.Context) ([]history.Replica, error)
	// ReapReplicas removes the rows that lapsed more than grace ago and,
	// in the same transaction, ends the commands in flight of every replica
	// no longer a member as interrupted at at.
	ReapReplicas(ctx context.Context, grace time.Duration, at time.Time) ([]string, int64, error)
	// ClusterSecret returns the secret shared by the replicas.
	ClusterSecret(ctx context.Context) ([]byte, error)
	// MarkOrphansInterrupted ends the commands in flight of replicas that
	// are no longer members.
	MarkOrphansInterrupted(ctx context.Context, at time.Time) (int64, error)
	// AbandonReplica makes id's lease rows orphans and ends its commands in
	// flight: what a fenced replica held, given up before it acts again.
	AbandonReplica(ctx context.Context, id string, at time.Time) error
}

// Config configures a Member.
type Config struct {
	Store Store
	// ID names the replica; NewID makes one. It is also the tag of the
	// lease tokens its registry issues.
	ID string
	// URL is where the other replicas reach this one (http://host:port);
	// empty for a replica that serves no HTTP (it takes no requests from
	// the others, and they send it none).
	URL string
	// TTL is how long a row lives unless renewed; default 5 s.
	TTL time.Duration
	// Interval is how often the row is renewed and the others looked at;
	// default TTL/5.
	Interval time.Duration
	// Grace is how long after a row lapsed the others wait before they
	// reap it; default two Intervals and a second, which covers the lag of
	// a fence behind the lapse (at most one Interval: a tick's queries are
	// bounded by it) and the clocks' difference.
	Grace time.Duration
	Clock clockwork.Clock
	Log   *slog.Logger
	// MeterProvider makes the member's gauges (cheetah.replicas,
	// cheetah.replica.valid); nil records none.
	MeterProvider metric.MeterProvider
	// AfterTick, when set, runs after every reaping round of a valid
	// member, with the round's context: work that must follow the reaping
	// (adopting the leases of reaped replicas).
	AfterTick func(ctx context.Context)
	// Probe, when set, asks whoever serves at url which replica it is (its
	// id, and whether anything answered). Join uses it on a live row with
	// this replica's URL: a replica that answers there is alive, and two
	// replicas cannot share one URL; nothing answering, or another id, is
	// a previous life of this one.
	Probe func(ctx context.Context, url string) (id string, answered bool)
	// OnFenced is called, from the member's own goroutine, when the
	// replica stops being sure of its row: it must stop acting for its
	// clients (cut their connections) before it returns. The member joins
	// again afterwards.
	OnFenced func()
	// Settle, when set, returns once every write the replica decided
	// before it is durable, or fails. A replica back from a fence calls it
	// before it gives up what it held (Store.AbandonReplica): a lease's
	// end decided before the fence (a revoke, a release waiting for its
	// row's deletion) must land while the row is still this replica's,
	// or it would change nothing once the row is an orphan, and the lease
	// would be adopted again after its caller heard it ended.
	Settle func(ctx context.Context) error
}

func (c *Config) fill() {
	if c.TTL == 0 {
		c.TTL = 5 * time.Second
	}
	if c.Interval == 0 {
		c.Interval = c.TTL / 5
	}
	if c.Grace == 0 {
		c.Grace = 2*c.Interval + time.Second
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.OnFenced == nil {
		c.OnFenced = func() {}
	}
	if c.Settle == nil {
		c.Settle = func(context.Context) error { return nil }
	}
}

// IDLen is the length of a replica id: it fits the registry's token tag.
const IDLen = 8

// NewID returns a random replica id.
func NewID() string {
	var b [IDLen / 2]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("cluster: crypto/rand: %v", err))
	}
	return hex.EncodeToString(b[:])
}

// Peer is another live replica.
type Peer struct {
	ID  string
	URL string
}

// Member is this process's place among the replicas. Join makes one,
// Start runs it, Stop ends it.
type Member struct {
	cfg    Config
	secret []byte

	// validUntil is when this replica stops acting unless it renews its
	// row first (a time of Clock, with its monotonic reading).
	validUntil atomic.Pointer[time.Time]
	peers      atomic.Pointer[[]Peer]

	// fencedMu serialises OnFenced with the checks of fence.
	fencedMu sync.Mutex
	fenced   bool

	// seen holds the nonces of the signed requests verified within the
	// last 2×peerSkew, oldest first: a request is taken once.
	seenMu sync.Mutex
	seen   map[string]time.Time
	seenQ  []seenNonce

	gauges     metric.Registration // nil without a MeterProvider
	started    atomic.Bool
	stop       chan struct{}
	done       chan struct{} // closed by loop
	maintained chan struct{} // closed by maintainLoop
	once       sync.Once
}

// Join registers the replica, ends the commands of replicas that are gone
// (its own previous life among them) and reads the live ones. The member
// is valid from here until its row would lapse; Start keeps it so.
func Join(ctx context.Context, cfg Config) (*Member, error) {
	cfg.fill()
	if len(cfg.ID) != IDLen {
		return nil, fmt.Errorf("cluster: a replica id has %d characters", IDLen)
	}
	m := &Member{cfg: cfg, stop: make(chan struct{}), done: make(chan struct{}), maintained: make(chan struct{}),
		seen: map[string]time.Time{}}
	secret, err := cfg.Store.ClusterSecret(ctx)
	if err != nil {
		return nil, err
	}
	m.secret = secret
	if err := m.checkURL(ctx); err != nil {
		return nil, err
	}
	if err := m.join(ctx); err != nil {
		return nil, err
	}
	m.look(ctx)
	if cfg.MeterProvider != nil {
		if err := m.register(cfg.MeterProvider); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// ErrURLTaken is Join's answer when a live replica already serves at the
// URL this one would advertise.
var ErrURLTaken = errors.New("cluster: another live replica serves at this replica's URL")

// checkURL refuses to join when another replica with a live row answers at
// this replica's URL: joining would remove its row (JoinReplica takes a
// row with the same URL for a previous life) while it still acts.
func (m *Member) checkURL(ctx context.Context) error {
	if m.cfg.URL == "" || m.cfg.Probe == nil {
		return nil
	}
	rows, err := m.cfg.Store.Replicas(ctx)
	if err != nil {
		return err
	}
	for _, r := range rows {
		if r.URL != m.cfg.URL || r.ID == m.cfg.ID {
			continue
		}
		if id, answered := m.cfg.Probe(ctx, r.URL); answered && id == r.ID {
			return fmt.Errorf("%w: replica %s at %s; give each replica its own --advertise-url (or --listen)", ErrURLTaken, r.ID, r.URL)
		}
	}
	return nil
}

// register makes the member's gauges: no label carries a replica id, so
// each replica's /metrics stays as small with many replicas as with one.
func (m *Member) register(mp metric.MeterProvider) error {
	meter := mp.Meter("github.com/cheetahbroker/cheetah/cluster")
	replicas, err := meter.Int64ObservableGauge("cheetah.replicas", metric.WithUnit("{replica}"),
		metric.WithDescription("Live replicas on the database as this replica last read them, itself included."))
	if err != nil {
		return err
	}
	valid, err := meter.Int64ObservableGauge("cheetah.replica.valid",
		metric.WithDescription("1 while this replica may act for its clients, 0 while it is fenced."))
	if err != nil {
		return err
	}
	m.gauges, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(replicas, int64(len(m.Peers())+1))
		v := int64(0)
		if m.Valid() {
			v = 1
		}
		o.ObserveInt64(valid, v)
		return nil
	}, replicas, valid)
	return err
}

// ID returns the replica's id.
func (m *Member) ID() string { return m.cfg.ID }

// TTL returns how long a replica's row lives unless renewed: a replica that
// stops renewing is reaped within about that.
func (m *Member) TTL() time.Duration { return m.cfg.TTL }

// URL returns where the other replicas reach this one.
func (m *Member) URL() string { return m.cfg.URL }

// Valid reports whether the replica may act for its clients now: its row
// cannot have lapsed yet.
func (m *Member) Valid() bool {
	until := m.validUntil.Load()
	return until != nil && m.cfg.Clock.Now().Before(*until)
}

// Peers returns the other live replicas that take requests, by id, as last
// read.
func (m *Member) Peers() []Peer {
	if p := m.peers.Load(); p != nil {
		return *p
	}
	return nil
}

// Peer returns the live replica id, if it takes requests.
func (m *Member) Peer(id string) (Peer, bool) {
	for _, p := range m.Peers() {
		if p.ID == id {
			return p, true
		}
	}
	return Peer{}, false
}

// Start runs the member: it renews the row, reads the others and reaps the
// lapsed, every Interval, until Stop.
func (m *Member) Start() {
	if m.started.CompareAndSwap(false, true) {
		go m.loop()
		go m.maintainLoop()
	}
}

// Stop ends the loop and removes the row, so that the others know at once
// that this replica is gone. ctx bounds the removal.
func (m *Member) Stop(ctx context.Context) error {
	m.once.Do(func() { close(m.stop) })
	if m.started.Load() {
		<-m.done
		<-m.maintained
	}
	if m.gauges != nil {
		_ = m.gauges.Unregister()
	}
	return m.cfg.Store.LeaveReplica(ctx, m.cfg.ID)
}

func (m *Member) join(ctx context.Context) error {
	t0 := m.cfg.Clock.Now()
	if err := m.cfg.Store.JoinReplica(ctx, m.cfg.ID, m.cfg.URL, m.cfg.TTL); err != nil {
		return err
	}
	m.extend(t0)
	if _, err := m.cfg.Store.MarkOrphansInterrupted(ctx, m.cfg.Clock.Now()); err != nil {
		return err
	}
	return nil
}

// extend makes the replica valid until TTL after t0, the moment it asked.
func (m *Member) extend(t0 time.Time) {
	until := t0.Add(m.cfg.TTL)
	m.validUntil.Store(&until)
	m.fencedMu.Lock()
	m.fenced = false
	m.fencedMu.Unlock()
}

func (m *Member) loop() {
	defer close(m.done)
	tick := m.cfg.Clock.NewTicker(m.cfg.Interval)
	defer tick.Stop()
	for {
		// The check runs on every tick too: a renewal that keeps failing
		// fences the replica as soon as its row may have lapsed.
		m.fence()
		select {
		case <-m.stop:
			return
		case <-tick.Chan():
		}
		m.tick()
	}
}

// tick renews the row (and gives up what a fenced replica held, before it
// acts again). Its queries are bounded by the interval, so that a database
// that does not answer cannot hold the loop past the moment the replica
// must fence.
func (m *Member) tick() {
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.Interval)
	defer cancel()
	// A row that may have lapsed since the last check fences the replica
	// even if this renewal succeeds: meanwhile it refused its clients'
	// hand-overs elsewhere, so what it holds may be held twice.
	m.fence()
	t0 := m.cfg.Clock.Now()
	ok, err := m.cfg.Store.RenewReplica(ctx, m.cfg.ID, m.cfg.TTL)
	if err != nil {
		m.cfg.Log.Warn("cluster: could not renew this replica's row", "replica", m.cfg.ID, "err", err)
		return
	}
	if !ok {
		// The others reaped this replica: what it held is theirs now.
		m.cfg.Log.Error("cluster: this replica was declared gone; it drops its clients and joins again", "replica", m.cfg.ID)
		m.validUntil.Store(nil)
		m.fence()
	}
	if m.isFenced() {
		// Back after a fence, reaped or not: whatever it held was dropped
		// then, and is given up now, before it acts again; anything it
		// gained meanwhile (a hello under way) is dropped too.
		m.cfg.OnFenced()
		if err := m.cfg.Settle(ctx); err != nil {
			m.cfg.Log.Warn("cluster: could not write what this replica decided before it fenced", "replica", m.cfg.ID, "err", err)
			return
		}
		if err := m.cfg.Store.AbandonReplica(ctx, m.cfg.ID, m.cfg.Clock.Now()); err != nil {
			m.cfg.Log.Warn("cluster: could not give up what this replica held", "replica", m.cfg.ID, "err", err)
			return
		}
	}
	if !ok {
		if err := m.join(ctx); err != nil {
			m.cfg.Log.Warn("cluster: could not join again", "replica", m.cfg.ID, "err", err)
			return
		}
	} else {
		m.extend(t0)
	}
}

// maintainLoop reads the others, reaps the lapsed and runs AfterTick every
// Interval, apart from the renewals: slow maintenance (a reap under load,
// adoptions) never delays a renewal into a fence.
func (m *Member) maintainLoop() {
	defer close(m.maintained)
	tick := m.cfg.Clock.NewTicker(m.cfg.Interval)
	defer tick.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-tick.Chan():
		}
		m.maintain()
	}
}

// maintain is one round of maintainLoop, bounded by the TTL.
func (m *Member) maintain() {
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.TTL)
	defer cancel()
	m.look(ctx)
	if !m.Valid() {
		return // a fenced replica acts for nobody, reaping included
	}
	reaped, n, err := m.cfg.Store.ReapReplicas(ctx, m.cfg.Grace, m.cfg.Clock.Now())
	if err != nil {
		m.cfg.Log.Warn("cluster: could not reap lapsed replicas", "err", err)
		return
	}
	if len(reaped) > 0 || n > 0 {
		m.cfg.Log.Info("cluster: replicas gone; their commands in flight are interrupted", "replicas", reaped, "interrupted", n)
	}
	if m.cfg.AfterTick != nil && m.Valid() {
		m.cfg.AfterTick(ctx)
	}
}

// Refresh reads the live replicas now rather than at the next tick: a
// replica that knows others joined since it did need not wait to see them.
func (m *Member) Refresh(ctx context.Context) { m.look(ctx) }

// look reads the live replicas.
func (m *Member) look(ctx context.Context) {
	rows, err := m.cfg.Store.Replicas(ctx)
	if err != nil {
		m.cfg.Log.Warn("cluster: could not read the replicas", "err", err)
		return
	}
	peers := make([]Peer, 0, len(rows))
	for _, r := range rows {
		if r.ID != m.cfg.ID && r.URL != "" {
			peers = append(peers, Peer{ID: r.ID, URL: r.URL})
		}
	}
	m.peers.Store(&peers)
}

// isFenced reports whether the replica fenced since it last renewed.
func (m *Member) isFenced() bool {
	m.fencedMu.Lock()
	defer m.fencedMu.Unlock()
	return m.fenced
}

// fence calls OnFenced once each time the replica stops being valid.
func (m *Member) fence() {
	if m.Valid() {
		return
	}
	m.fencedMu.Lock()
	defer m.fencedMu.Unlock()
	if m.fenced {
		return
	}
	m.fenced = true
	m.cfg.Log.Warn("cluster: this replica cannot be sure of its row; it stops acting for its clients", "replica", m.cfg.ID)
	m.cfg.OnFenced()
}

// PeerHeader carries a replica's signature on a request it passes to
// another. Never logged.
const PeerHeader = "Cheetah-Peer"

// PeerKeyHeader names, on a signed request, the API key the passing
// replica authenticated the caller with (by id): the receiver takes it as
// authenticated, as it cannot check the caller's console session.
const PeerKeyHeader = "Cheetah-Peer-Key"

// ReplicaHeader names, on a replica's answers, the replica that answered
// (its id is no secret: lease tokens begin with it).
const ReplicaHeader = "Cheetah-Replica"

// PeerHopsHeader counts, on a signed request, the replicas that passed it
// on before.
const PeerHopsHeader = "Cheetah-Peer-Hops"

// peerSkew bounds how far a signed request's time may be from the
// receiver's: a captured request cannot be replayed later than this.
const peerSkew = 30 * time.Second

// MaxSignedBody bounds the body of a signed request: the signature covers
// the body, so both ends read it whole. It is well above any body limit of
// the API.
const MaxSignedBody = 64 << 20

// ErrBodyTooLarge is Sign's answer to a body over MaxSignedBody.
var ErrBodyTooLarge = errors.New("cluster: the body of a request to another replica is over its limit")

// Sign marks req as coming from this replica. The signature covers the
// body too: Sign reads it whole and puts it back.
func (m *Member) Sign(req *http.Request) error {
	body, err := readBody(req)
	if err != nil {
		return err
	}
	req.ContentLength = int64(len(body))
	req.GetBody = func() (io.ReadCloser, error) {
		if len(body) == 0 {
			return http.NoBody, nil
		}
		return io.NopCloser(bytes.NewReader(body)), nil
	}
	ts := strconv.FormatInt(m.cfg.Clock.Now().UnixMilli(), 10)
	var n [12]byte
	if _, err := rand.Read(n[:]); err != nil {
		return err
	}
	nonce := hex.EncodeToString(n[:])
	req.Header.Set(PeerHeader, m.cfg.ID+" "+ts+" "+nonce+" "+m.mac(m.cfg.ID, ts, nonce, req, body))
	return nil
}

// seenNonce is one nonce of seen and when it may be forgotten.
type seenNonce struct {
	nonce string
	until time.Time
}

// firstUse records nonce and reports whether it was not seen before within
// the window a signature's time allows: a captured request is refused the
// second time.
func (m *Member) firstUse(nonce string, now time.Time) bool {
	m.seenMu.Lock()
	defer m.seenMu.Unlock()
	for len(m.seenQ) > 0 && !now.Before(m.seenQ[0].until) {
		delete(m.seen, m.seenQ[0].nonce)
		m.seenQ = m.seenQ[1:]
	}
	if _, dup := m.seen[nonce]; dup {
		return false
	}
	until := now.Add(2 * peerSkew)
	m.seen[nonce] = until
	m.seenQ = append(m.seenQ, seenNonce{nonce, until})
	return true
}

// readBody reads req's body whole (at most MaxSignedBody) and puts an
// equal one back.
func readBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, MaxSignedBody+1))
	_ = req.Body.Close()
	if err != nil {
		return nil, err
	}
	if len(body) > MaxSignedBody {
		return nil, ErrBodyTooLarge
	}
	req.Body = http.NoBody
	if len(body) > 0 {
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	return body, nil
}

// ErrBadSignature is Verify's answer to a request that carries PeerHeader
// with a signature that does not hold.
var ErrBadSignature = errors.New("cluster: the peer signature does not hold")

// Verify reports whether req comes from a replica of this cluster (its
// id), and whether it carries a peer header at all.
func (m *Member) Verify(req *http.Request) (string, bool, error) {
	h := req.Header.Get(PeerHeader)
	if h == "" {
		return "", false, nil
	}
	parts := strings.Split(h, " ")
	if len(parts) != 4 || len(parts[2]) != 24 {
		return "", true, ErrBadSignature
	}
	ms, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return "", true, ErrBadSignature
	}
	if d := m.cfg.Clock.Now().Sub(time.UnixMilli(ms)); d > peerSkew || d < -peerSkew {
		return "", true, ErrBadSignature
	}
	body, err := readBody(req)
	if err != nil {
		return "", true, ErrBadSignature
	}
	if !hmac.Equal([]byte(parts[3]), []byte(m.mac(parts[0], parts[1], parts[2], req, body))) {
		return "", true, ErrBadSignature
	}
	if !m.firstUse(parts[2], m.cfg.Clock.Now()) {
		return "", true, ErrBadSignature // a replay
	}
	return parts[0], true, nil
}

func (m *Member) mac(id, ts, nonce string, req *http.Request, body []byte) string {
	digest := sha256.Sum256(body)
	h := hmac.New(sha256.New, m.secret)
	for _, s := range []string{id, ts, nonce, req.Method, req.URL.RequestURI(), req.Header.Get("Authorization"), req.Header.Get("X-Lease"), req.Header.Get(PeerKeyHeader), req.Header.Get(PeerHopsHeader), string(digest[:])} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}
