package registry

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/protocol"
)

// Store is what the registry needs of the durable history.
type Store interface {
	Write(ctx context.Context, ops ...history.Op) error
	WriteAsync(done func(error), ops ...history.Op)
	Lookup(ctx context.Context, commandID string) (history.CommandRef, error)
	Get(ctx context.Context, userID, commandID string) (cheetah.CommandRecord, error)
	List(ctx context.Context, userID string, q cheetah.ListQuery) (cheetah.CommandPage, error)
	ReserveEpochs(ctx context.Context, n int64) (int64, error)
	// Health is nil while the store's database answers; acquires are
	// refused while it is not (see Acquire).
	Health() error
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
	// EpochBlock is how many epochs are reserved in the store at a time.
	EpochBlock int64
	// MaxMessageBytes bounds a command frame (4 MiB).
	MaxMessageBytes int
	// DefaultCommandTimeout applies when a send names no timeout (30 s).
	DefaultCommandTimeout time.Duration
	// MaxInFlightPerContext bounds a context's commands admitted and not yet
	// ended (1,024); a send past it fails overloaded. Negative is unbounded.
	MaxInFlightPerContext int
	// TracerProvider makes the spans of acquires and commands; nil is otel's
	// global provider (a no-op unless the application installed an SDK).
	TracerProvider trace.TracerProvider
	// MeterProvider makes the registry's metrics; nil records none.
	MeterProvider metric.MeterProvider
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
		c.DefaultTTL = 300 * time.Second
	}
	if c.ReconnectGrace == 0 {
		c.ReconnectGrace = 30 * time.Second
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
		c.MaxMessageBytes = 4 << 20
	}
	if c.MaxInFlightPerContext == 0 {
		c.MaxInFlightPerContext = 1024
	}
	if c.DefaultCommandTimeout == 0 {
		c.DefaultCommandTimeout = 30 * time.Second
	}
}

// Registry is the broker's live state. Create it with New and stop it with
// Close.
type Registry struct {
	cfg   Config
	clock clockwork.Clock
	store Store
	log   *slog.Logger
	tel   *telemetry

	mu       sync.Mutex
	users    map[string]*pool
	leases   map[tokenKey]*lease         // active leases by token digest
	heap     leaseHeap                   // active leases that may expire, by deadline
	ended    *memo[tokenKey, endedLease] // how recent leases ended, by token digest
	commands map[string]*command
	finished *memo[string, finishedCommand] // recently ended commands, for late messages
	epochs   epochRange
	closed   bool
	// draining is set by Drain: no new acquire or send is admitted.
	// interrupting is set by Interrupt: a command whose record becomes
	// durable ends interrupted instead of being dispatched. idle is closed
	// once draining and no command is in flight.
	draining, interrupting bool
	idle                   chan struct{}

	wg   sync.WaitGroup // background epoch reservations
	kick chan struct{}  // wakes the expiry loop when the earliest deadline moves
	stop chan struct{}
	done chan struct{}
}

// New starts a registry. It reserves its first block of epochs from the
// store, so it fails when the store does not answer.
func New(ctx context.Context, cfg Config) (*Registry, error) {
	cfg.fill()
	if cfg.Store == nil {
		return nil, fmt.Errorf("registry: new: a store is required")
	}
	r := &Registry{
		cfg:      cfg,
		clock:    cfg.Clock,
		store:    cfg.Store,
		log:      cfg.Log,
		users:    map[string]*pool{},
		leases:   map[tokenKey]*lease{},
		ended:    newMemo[tokenKey, endedLease](cfg.EndedMemory, cfg.EndedMax),
		commands: map[string]*command{},
		finished: newMemo[string, finishedCommand](cfg.EndedMemory, cfg.EndedMax),
		kick:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	tel, err := newTelemetry(r, cfg.TracerProvider, cfg.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("registry: metrics: %w", err)
	}
	r.tel = tel
	if err := r.reserveEpochs(ctx); err != nil {
		tel.close()
		return nil, err
	}
	go r.expiryLoop()
	return r, nil
}

// Close stops the expiry loop and every timer, fails waiting acquires and
// resolves every waiting send as interrupted. It writes nothing: the caller
// closes the store after, and the next start marks what was in flight
// interrupted in history. A graceful stop calls Drain and Interrupt first,
// so that nothing is left in flight for Close.
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
		for _, c := range p.clients {
			if c.grace != nil {
				c.grace.Stop()
				c.grace = nil
			}
		}
	}
	for _, c := range r.commands {
		if c.timer != nil {
			c.timer.Stop()
		}
		e := &cheetah.ErrorInfo{Code: "interrupted", Message: "the broker stopped"}
		if c.resolved != nil {
			c.resolved <- outcome{res: cheetah.Resolution{CommandID: c.rec.CommandID, TraceID: c.rec.TraceID, Status: cheetah.StatusInterrupted, Error: e}}
		}
		r.forget(c)
		if c.spans.cmd != nil {
			r.tel.ended(c, cheetah.StatusInterrupted, e, "", r.clock.Now())
		}
	}
	r.mu.Unlock()
	r.tel.close()
	close(r.stop)
	<-r.done
	r.wg.Wait()
}

// Stats counts the registry's bookkeeping. After every lease is released and
// every client is gone, Leases, Heap, Commands, Queued, Waiters, Clients and
// Contexts are all zero (invariant 11). Ended and Finished are time-bounded
// memories of the last EndedMemory.
type Stats struct {
	Clients, Contexts, Leases, Heap, Commands, Queued, Waiters, Preserving int
	Ended, Finished                                                        int
}

// Stats returns the current counts.
func (r *Registry) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Stats{Leases: len(r.leases), Heap: len(r.heap), Commands: len(r.commands),
		Ended: r.ended.len(), Finished: r.finished.len()}
	for _, p := range r.users {
		s.Clients += len(p.clients)
		s.Waiters += p.waiters.Len()
		for _, c := range p.clients {
			s.Contexts += len(c.contexts)
			for _, w := range c.contexts {
				s.Queued += len(w.queue)
			}
		}
	}
	for _, l := range r.leases {
		s.Preserving += l.preserve
	}
	return s
}

// PruneMemory drops remembered ended leases and finished commands older than
// EndedMemory. The expiry loop calls it; tests call it after moving a fake
// clock.
func (r *Registry) PruneMemory() {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock.Now()
	r.ended.prune(now)
	r.finished.prune(now)
}

// tokenKey is how the registry knows a lease: the SHA-256 of its token. A
// map lookup compares whole keys, byte by byte, with the entries its hash
// probes, so keyed by the token itself the time a lookup takes could, in
// principle, say how much of a guess matches a live token. Keyed by the
// digest, what is compared is a value the guesser cannot steer: every guess
// takes the same path (DESIGN §5, tokens compared in constant time), and
// the registry keeps no token that a memory dump could show.
type tokenKey [sha256.Size]byte

func keyOf(token string) tokenKey { return sha256.Sum256([]byte(token)) }

// newToken returns 128 random bits, hex encoded.
func newToken() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("registry: crypto/rand: %v", err))
	}
	return hex.EncodeToString(b[:])
}
