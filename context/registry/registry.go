package registry

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/quota"
)

// Store is what the registry needs of the durable history. The registry
// never calls it under its lock.
type Store interface {
	// Write commits ops in one transaction and returns once they are
	// durable, or with the error that kept them from being so. A Write with
	// no ops returns once everything enqueued before it (by Write or
	// WriteAsync) is written.
	Write(ctx context.Context, ops ...history.Op) error
	// WriteAsync enqueues ops, in the order of the calls, and returns; it
	// may block while the store's queue is full. done, if not nil, runs once
	// the ops committed or failed; it must not block and must not call the
	// store. The writes of one command, and every lease row, commit in the
	// order of the calls, and their callbacks run in that order; writes of
	// different commands may commit in either order, and their callbacks
	// may run at the same time. The registry calls it from one goroutine,
	// in the order it decided the ops (see outbox.go): a command's record
	// first, which the command may be dispatched before (invariant 9).
	WriteAsync(done func(error), ops ...history.Op)
	// Lookup finds a command that the registry no longer remembers, to
	// place a late message: its user, client, status and response mode. It
	// fails with cheetah.ErrNotFound when there is no such command.
	Lookup(ctx context.Context, commandID string) (history.CommandRef, error)
	// Get reads one command of a user with its messages; a command of
	// another user is cheetah.ErrNotFound (invariant 10).
	Get(ctx context.Context, userID, commandID string) (cheetah.CommandRecord, error)
	// List pages through a user's commands, newest first.
	List(ctx context.Context, userID string, q cheetah.ListQuery) (cheetah.CommandPage, error)
	// ReserveEpochs durably raises the epoch high-water mark by n and
	// returns the first of the n epochs reserved: no later call, in this
	// process or after a restart, returns any of them again.
	ReserveEpochs(ctx context.Context, n int64) (int64, error)
	// Health is nil while the store's database answers; acquires are
	// refused while it is not (see Acquire).
	Health() error
	// LeaseRowHeld reports whether the lease of digest has a row that has
	// not expired, whichever replica's: read when a lease's end was made
	// durable only after the replica fenced (endsStand).
	LeaseRowHeld(ctx context.Context, digest [32]byte) (bool, error)
	// CommitTime is how long the store's recent transactions took to
	// commit, a moving average (zero before the first); it must cost no
	// more than an atomic load. It sets how long a waited command's record
	// is held back (Config.InsertDelay).
	CommitTime() time.Duration
}

// Conn is a client's connection as the registry sees it. Send must not
// block: the registry calls it under its lock. A connection whose outbound
// queue is full answers false and closes itself.
type Conn interface {
	Send(f protocol.Frame) bool
	// Close sends an error frame explaining code, then closes the connection.
	// It must not block.
	Close(code protocol.CloseCode, reason string)
}

// Config tunes a Registry. Zero values take the defaults.
type Config struct {
	Clock clockwork.Clock
	Store Store
	Log   *slog.Logger
	// DefaultTTL is a lease's TTL when the acquire names none (300 s).
	DefaultTTL time.Duration
	// ReconnectGrace is how long a disconnected client's leases survive (30 s).
	ReconnectGrace time.Duration
	// EndedMemory is how long the registry remembers how a lease ended, so a
	// late use can be told why (10 min). EndedMax bounds that memory.
	EndedMemory time.Duration
	EndedMax    int
	// EpochBlock is how many epochs are reserved in the store at a time,
	// at least (1,024): blocks used up in less than a second grow.
	EpochBlock int64
	// MaxMessageBytes bounds a command frame (4 MiB).
	MaxMessageBytes int
	// DefaultCommandTimeout applies when a send names no timeout (30 s).
	DefaultCommandTimeout time.Duration
	// MaxInFlightPerContext bounds a context's commands admitted and not yet
	// ended (1,024); a send past it fails overloaded. Negative is unbounded.
	MaxInFlightPerContext int
	// InsertDelay is how long, at least, the record of a command whose
	// caller waits for its resolution (SendAndWait) is held back before it
	// is handed to the store alone: a terminal message that comes back
	// within the hold shares the record's commit, so a round trip waits on
	// one commit, not two. While the store's commits take longer than
	// InsertDelay (Store.CommitTime: under load, a record handed over waits
	// for the commit in flight anyway), the hold lasts as long as a commit,
	// up to MaxInsertDelay. The command is dispatched at once either way;
	// the hold is real time, whatever Clock says. Default DefaultInsertDelay;
	// negative sends every record at once.
	InsertDelay time.Duration
	// MaxInsertDelay bounds the hold on a slow store (default
	// DefaultMaxInsertDelay): it is how much later than without a hold a
	// waited command's id may be told, at most (the wait's early header,
	// OnAdmitted), when its answer is slow.
	MaxInsertDelay time.Duration
	// TracerProvider makes the spans of acquires and commands; nil is otel's
	// global provider (a no-op unless the application installed an SDK).
	TracerProvider trace.TracerProvider
	// MeterProvider makes the registry's metrics; nil records none.
	MeterProvider metric.MeterProvider
	// TokenTag, when set, begins every lease token this registry issues:
	// the replicas of one database (DESIGN §9) tell by it which of them
	// holds a lease, without asking the database. Eight hex digits; the
	// rest of the token stays 96 random bits.
	TokenTag string
	// DurableLeases writes every lease to the store as a row (PostgreSQL),
	// so that another replica can adopt it when this one dies
	// (durable_leases.go). An acquire and a release then return once their
	// row is durable.
	DurableLeases bool
}

// Limits of the acquire and send requests: the broker's own, declared once
// in the root package.
const (
	MinTTL            = cheetah.MinTTL
	MaxTTL            = cheetah.MaxTTL
	MaxWait           = cheetah.MaxWait
	MaxCommandTimeout = cheetah.MaxCommandTimeout
	MaxTaskIDLen      = cheetah.MaxTaskIDLen
	MaxNameLen        = cheetah.MaxNameLen
	MaxLabels         = cheetah.MaxLabels
)

func (c *Config) fill() {
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.DefaultTTL == 0 {
		c.DefaultTTL = cheetah.DefaultTTL
	}
	if c.ReconnectGrace == 0 {
		c.ReconnectGrace = cheetah.DefaultReconnectGrace
	}
	if c.EndedMemory == 0 {
		c.EndedMemory = 10 * time.Minute
	}
	if c.EndedMax == 0 {
		c.EndedMax = 200_000
	}
	if c.EpochBlock == 0 {
		c.EpochBlock = 1024
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = cheetah.DefaultMaxMessageBytes
	}
	if c.MaxInFlightPerContext == 0 {
		c.MaxInFlightPerContext = cheetah.DefaultMaxInFlightPerContext
	}
	if c.DefaultCommandTimeout == 0 {
		c.DefaultCommandTimeout = cheetah.DefaultCommandTimeout
	}
	if c.InsertDelay == 0 {
		c.InsertDelay = DefaultInsertDelay
	}
	if c.MaxInsertDelay == 0 {
		c.MaxInsertDelay = DefaultMaxInsertDelay
	}
}

// DefaultInsertDelay is Config.InsertDelay's default: longer than a local
// client's answer to a quick command takes to come back (ack and result
// over a WebSocket: most within 300 µs, nearly all within 500 µs on the
// SendAndWait benchmark), shorter than a commit on a disk that syncs
// (SQLite or PostgreSQL: a millisecond or more). See docs/behaviour.md for
// the measurements.
const DefaultInsertDelay = 500 * time.Microsecond

// DefaultMaxInsertDelay is Config.MaxInsertDelay's default: a few commits
// of a loaded store (10 to 25 ms on this project's throughput benchmark),
// short beside a command's timeout.
const DefaultMaxInsertDelay = 50 * time.Millisecond

// Registry is the broker's live state. Create it with New and stop it with
// Close.
type Registry struct {
	cfg   Config
	clock clockwork.Clock
	store Store
	log   *slog.Logger
	tel   *telemetry

	mu     spinMutex
	users  map[string]*pool
	leases map[tokenKey]*lease // active leases by token digest
	// awaiting holds the contexts whose lease another replica holds, and
	// until when they wait for it (durable_leases.go).
	awaiting map[*wctx]time.Time
	// moving counts, per client (user id, client id), the hand-overs and
	// adoptions of its leases under way here (Moving).
	moving map[[2]string]int
	// forgets counts the calls of Forget (Forgets); it moves under mu.
	forgets     atomic.Uint64
	heap        leaseHeap               // active leases that may expire, by deadline
	endedLeases *endedMemory            // how recent leases ended, by token digest (ended.go)
	moved       *memo[endedKey, string] // leases handed over with their client, to the replica (handover.go)
	// lastLeaseRow hears of the commit of the last lease row written, made
	// or deleted (leaseRowsDurable); r.mu.
	lastLeaseRow chan error
	commands     map[string]*command
	// ending holds the commands that ended and whose end is not durable yet.
	ending        map[*command]struct{}
	endedCommands *memo[string, endedCommand] // recently ended commands, for late messages
	epochs        epochRange
	closed        bool
	// draining is set by Drain: no new acquire or send is admitted.
	// idle is closed once draining and no command is in flight.
	draining bool
	idle     chan struct{}

	// quotas are the quota funnel's caps and slots (quotas.go); qset is
	// quotas.set, read off the lock.
	quotas quotaState
	// creations are the create_context requests waiting for their
	// context, by request id (create.go).
	creations map[string]*creation
	qset      atomic.Pointer[quota.Set]
	// watches are the lease watches of Handle.Done (leasewatch.go).
	watches leaseWatches

	// after acts on what was decided under r.mu: the outbox of writes and
	// the queue of events (outbox.go).
	after afterLock

	// wg counts every goroutine of the registry but the expiry loop: the
	// flusher, the notifier, epoch reservations and timer callbacks under
	// way. Close waits for it.
	wg       sync.WaitGroup
	bg       context.Context // cancelled by Close
	bgCancel context.CancelFunc
	kick     chan struct{} // wakes the expiry loop for a deadline before expiryWake
	// expiryWake is when the expiry loop wakes next at the latest (zero:
	// not before a minute); only a deadline before it kicks the loop. r.mu.
	expiryWake time.Time
	stop       chan struct{}
	done       chan struct{}
}

// New starts a registry. It reserves its first block of epochs from the
// store, so it fails when the store does not answer.
func New(ctx context.Context, cfg Config) (*Registry, error) {
	cfg.fill()
	if cfg.Store == nil {
		return nil, fmt.Errorf("registry: new: a store is required")
	}
	if t := cfg.TokenTag; t != "" {
		if _, err := hex.DecodeString(t); err != nil || len(t) != TokenTagLen {
			return nil, fmt.Errorf("registry: new: the token tag must be %d hex digits", TokenTagLen)
		}
	}
	r := &Registry{
		cfg:           cfg,
		clock:         cfg.Clock,
		store:         cfg.Store,
		log:           cfg.Log,
		users:         map[string]*pool{},
		leases:        map[tokenKey]*lease{},
		awaiting:      map[*wctx]time.Time{},
		moving:        map[[2]string]int{},
		endedLeases:   newEndedMemory(cfg.EndedMemory, cfg.EndedMax),
		moved:         newMemo[endedKey, string](max(cfg.EndedMemory, MaxTTL), cfg.EndedMax),
		commands:      map[string]*command{},
		ending:        map[*command]struct{}{},
		endedCommands: newMemo[string, endedCommand](cfg.EndedMemory, cfg.EndedMax),
		kick:          make(chan struct{}, 1),
		stop:          make(chan struct{}),
		done:          make(chan struct{}),
	}
	r.after.outKick = make(chan struct{}, 1)
	r.after.notifKick = make(chan struct{}, 1)
	r.bg, r.bgCancel = context.WithCancel(context.Background())
	tel, err := newTelemetry(r, cfg.TracerProvider, cfg.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("registry: metrics: %w", err)
	}
	r.tel = tel
	if err := r.reserveFirst(ctx); err != nil {
		tel.close()
		r.bgCancel()
		return nil, err
	}
	r.wg.Add(2)
	go r.flushLoop()
	go r.notifyLoop()
	go r.expiryLoop()
	return r, nil
}

// afterFunc runs f under r.mu after d, unless the registry closed first.
// Close waits for a run under way.
func (r *Registry) afterFunc(d time.Duration, f func()) clockwork.Timer {
	return r.clock.AfterFunc(d, func() {
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			return
		}
		r.wg.Add(1)
		f()
		r.mu.Unlock()
		r.wg.Done()
	})
}

// Close stops the expiry loop and every timer, fails waiting acquires and
// resolves every waiting send as interrupted. It hands the store what was
// decided before it and writes nothing of its own: the caller closes the
// store after, and the next start marks what was in flight interrupted in
// history. It returns once nothing of the registry runs any more: every
// goroutine it started has ended, and the events queued before it are
// delivered. A graceful stop calls Drain and Interrupt first, so that
// nothing is left in flight for Close.
func (r *Registry) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	shutdown := &cheetah.Error{Code: cheetah.CodeOverloaded, Message: "the broker is shutting down"}
	for _, p := range r.users {
		for e := p.waiters.Front(); e != nil; e = e.Next() {
			wt := e.Value.(*waiter)
			wt.elem = nil
			wt.ch <- acquireResult{err: shutdown}
		}
		p.waiters.Init()
		r.quotas.waiters.Init()
		r.failCreations(nil, shutdown)
		for _, c := range p.clients {
			if c.grace != nil {
				c.grace.Stop()
				c.grace = nil
			}
		}
	}
	now := r.clock.Now()
	for _, c := range r.commands {
		if c.timer != nil {
			c.timer.Stop()
		}
		// A record still held back goes to the store now, with what was
		// decided about the command: the next start marks it interrupted.
		r.releaseHeld(c, nil)
		if !c.durable && c.writeSpan != nil {
			// Its sender still hears how the write fared, but nothing of
			// the registry runs for it after Close.
			c.writeSpan.End()
		}
		e := &cheetah.ErrorInfo{Code: "interrupted", Message: "the broker stopped"}
		c.res = cheetah.Resolution{CommandID: c.rec.CommandID, TraceID: c.rec.TraceID, Status: cheetah.StatusInterrupted, Error: e}
		c.endedAt = now
		if c.resolved != nil {
			c.resolved <- outcome{res: c.res}
		}
		r.untrack(c)
		if c.durable {
			// One whose record is still being written was never announced.
			r.emitEnded(c, false)
		}
		r.endSpansLater(c, cheetah.StatusInterrupted, e, "")
	}
	// Ended, and the end not durable yet: the store may still answer (the
	// waiting caller then learns it), but the registry does not wait.
	for c := range r.ending {
		c.ending = false
		delete(r.ending, c)
		if c.durable {
			r.emitEnded(c, false)
		} else if c.writeSpan != nil {
			c.writeSpan.End() // as above
		}
		r.endSpansLater(c, c.res.Status, c.res.Error, c.terminal)
	}
	r.mu.Unlock()
	r.bgCancel()
	close(r.stop)
	<-r.done
	r.wg.Wait()
	r.tel.close()
}

// Stats counts the registry's bookkeeping. After every lease is released and
// every client is gone, Leases, Heap, Commands, Waiters, Clients and
// Contexts are all zero (invariant 11). Ended and Finished are time-bounded
// memories of the last EndedMemory.
type Stats struct {
	Clients, Contexts, Leases, Heap, Commands, Waiters, Preserving int
	Ended, Finished                                                int
	// StandIns counts the waits held here for acquires other replicas
	// admitted; Waiters leaves them out.
	StandIns int
	// Slots counts the quota slots in use, every level and scope of every
	// quota (quotas.go), and QuotaWaiters the waiting acquires quotas govern.
	Slots, QuotaWaiters int
	// Creations counts the create_context requests waiting for a context.
	Creations int
}

// Stats returns the current counts.
func (r *Registry) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Stats{Leases: len(r.leases), Heap: len(r.heap), Commands: len(r.commands),
		Ended: r.endedLeases.len(), Finished: r.endedCommands.len()}
	for _, p := range r.users {
		s.Clients += len(p.clients)
		own, standIns := p.waiting()
		s.Waiters += own
		s.StandIns += standIns
		for _, c := range p.clients {
			s.Contexts += len(c.contexts)
		}
	}
	for _, l := range r.leases {
		s.Preserving += l.preserve
	}
	s.Slots, s.QuotaWaiters, s.Creations = r.quotas.slots(), r.quotas.waiters.Len(), len(r.creations)
	return s
}

// PruneMemory drops remembered ended leases and finished commands older than
// EndedMemory, and event chunks kept beyond what a while's deliveries
// needed. The expiry loop calls it; tests call it after moving a fake
// clock.
func (r *Registry) PruneMemory() {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock.Now()
	r.endedLeases.prune(now)
	r.moved.prune(now)
	r.endedCommands.prune(now)
	r.after.events.trim(now)
}

// tokenKey is how the registry knows a lease: the SHA-256 of its token. A
// map lookup compares whole keys, byte by byte, with the entries its hash
// probes, so keyed by the token itself the time a lookup takes could, in
// principle, say how much of a guess matches a live token. Keyed by the
// digest, what is compared is a value the guesser cannot steer: every guess
// takes the same path (DESIGN §5, tokens compared in constant time), and
// the registry keeps no token that a memory dump could show.
type tokenKey [sha256.Size]byte

func keyOf(token string) tokenKey { return TokenDigest(token) }

// TokenDigest is what the registry and the store know a lease token by:
// the token itself is never kept.
func TokenDigest(token string) [sha256.Size]byte { return sha256.Sum256([]byte(token)) }

// TokenTagLen is the length of Config.TokenTag.
const TokenTagLen = 8

// newToken returns 128 random bits, hex encoded; with a tag, the tag and
// 96 random bits, so that every token has one length.
func newToken(tag string) string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("registry: crypto/rand: %v", err))
	}
	if tag != "" {
		return tag + hex.EncodeToString(b[:(32-TokenTagLen)/2])
	}
	return hex.EncodeToString(b[:])
}

// TokenTagOf returns the tag a token begins with, if it can carry one.
func TokenTagOf(token string) (string, bool) {
	if len(token) != 32 {
		return "", false
	}
	return token[:TokenTagLen], true
}
