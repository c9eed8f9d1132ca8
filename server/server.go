// Package server is the broker's network face: the client WebSocket at
// /ws/v1/client, the application and admin HTTP API under /api/v1, and the
// health endpoints. It holds no state of its own beyond open connections:
// the registry decides, the history store remembers.
package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/jonboulle/clockwork"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/cluster"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/server/auth"
	"github.com/cheetahbroker/cheetah/server/console"
	"github.com/cheetahbroker/cheetah/server/webhook"
)

// Config wires a Server. Zero durations and sizes take the defaults.
type Config struct {
	Registry *registry.Registry
	Store    *history.Store
	Keys     *auth.Keys
	Log      *slog.Logger
	Clock    clockwork.Clock
	// Heartbeat is how often the broker pings a client (20 s); a client
	// silent for three of them is closed with 4408.
	Heartbeat time.Duration
	// HelloTimeout is how long a new connection has to say hello (10 s).
	HelloTimeout time.Duration
	// MaxPendingHellos bounds the connections that have not said hello yet
	// (1,024). Beyond it an upgrade is refused with 503 overloaded and
	// Retry-After, so a flood of silent connections costs bounded memory,
	// not only bounded time. Negative is unbounded.
	MaxPendingHellos int
	// MaxMessageBytes bounds one frame in either direction (4 MiB).
	MaxMessageBytes int
	// OutboundQueue bounds the frames waiting to be written to one client
	// (4,096), and OutboundBytes their size (16 MiB, and at least four
	// frames of MaxMessageBytes); a client that lets either fill is not
	// reading, and is disconnected. An idle client's queue holds nothing.
	OutboundQueue int
	OutboundBytes int
	// WriteTimeout bounds one frame write (10 s).
	WriteTimeout time.Duration
	// MaxBodyBytes bounds an HTTP request body (1 MiB).
	MaxBodyBytes int64
	// KeyRateLimit is requests per second per API key; 0 is unlimited.
	KeyRateLimit float64
	// FrameRateLimit is frames per second per client; 0 is unlimited. A
	// client over it is closed with 4429.
	FrameRateLimit float64
	// MaxContextsPerClient bounds one state report (256). A larger report is
	// refused with an error frame and the previous state stands.
	MaxContextsPerClient int
	// AllowedOrigins, when not empty, lists the Origin values (for example
	// chrome-extension://<id>) a browser may open the client WebSocket from.
	// Requests without an Origin (console agents) are not affected.
	AllowedOrigins []string
	// LoopbackOnly makes every request name a loopback host (localhost,
	// 127.0.0.1, [::1]) in its Host header: a broker bound to loopback is
	// then out of reach of DNS rebinding from a web page.
	LoopbackOnly bool
	// Webhooks, when set, accepts X-Callback-Url on sends, checks it and
	// delivers the record when the command ends; without it the header is
	// refused with 400.
	Webhooks *webhook.Worker
	// TracerProvider makes the server spans of API requests, which continue
	// the caller's trace (W3C traceparent); nil is otel's global provider.
	TracerProvider trace.TracerProvider
	// MeterProvider makes the server's metrics (frames, HTTP requests); nil
	// records none.
	MeterProvider metric.MeterProvider
	// Metrics serves GET /metrics (Prometheus text); nil answers 404.
	Metrics http.Handler
	// Cluster, when set, makes this server one replica of several on one
	// PostgreSQL (DESIGN §9): requests that concern another replica's
	// clients are passed to it, and none is answered while the replica is
	// fenced.
	Cluster *cluster.Member
	// PeerTransport carries requests to the other replicas; nil is a clone
	// of http.DefaultTransport.
	PeerTransport http.RoundTripper
	// Quotas is the quota file POST /api/v1/admin/quotas/reload reads
	// again; nil when the broker runs without one.
	Quotas *QuotaFile
}

func (c *Config) fill() {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = cheetah.DefaultHeartbeat
	}
	if c.HelloTimeout == 0 {
		c.HelloTimeout = 10 * time.Second
	}
	if c.MaxPendingHellos == 0 {
		c.MaxPendingHellos = cheetah.DefaultMaxPendingHellos
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = cheetah.DefaultMaxMessageBytes
	}
	if c.OutboundQueue == 0 {
		c.OutboundQueue = 4096
	}
	if c.OutboundBytes == 0 {
		c.OutboundBytes = max(16<<20, 4*c.MaxMessageBytes)
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = 10 * time.Second
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = cheetah.DefaultMaxBodyBytes
	}
	if c.MaxContextsPerClient == 0 {
		c.MaxContextsPerClient = 256
	}
}

// Server serves the broker's HTTP and WebSocket endpoints.
type Server struct {
	cfg   Config
	reg   *registry.Registry
	store *history.Store
	keys  *auth.Keys
	log   *slog.Logger
	clock clockwork.Clock
	gin   *gin.Engine

	console   *console.Console // the admin console at /ui/
	keyLimits *keyLimits       // nil when unlimited
	tel       *instruments
	draining  atomic.Bool
	// pendingHellos counts connections accepted and not yet past hello.
	pendingHellos atomic.Int64

	mu       sync.Mutex
	sessions map[*session]struct{}
	closing  bool
	wg       sync.WaitGroup
	// beating counts the sessions in the heartbeat loop; beatStop stops
	// the loop, and is nil while none runs.
	beating  int
	beatStop chan struct{}
	// bufs holds the encode buffers writers borrow.
	bufs sync.Pool

	// peerClient carries requests to the other replicas.
	peerClient *http.Client
	// standIns are the waits held here for other replicas' acquires.
	standIns standIns
}

// New returns a Server for cfg.
func New(cfg Config) (*Server, error) {
	cfg.fill()
	if cfg.Registry == nil || cfg.Store == nil || cfg.Keys == nil {
		return nil, fmt.Errorf("server: new: registry, store and keys are required")
	}
	s := &Server{
		cfg: cfg, reg: cfg.Registry, store: cfg.Store, keys: cfg.Keys, log: cfg.Log,
		clock: cfg.Clock, sessions: map[*session]struct{}{},
	}
	tel, err := newInstruments(cfg.TracerProvider, cfg.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("server: new: metrics: %w", err)
	}
	s.tel = tel
	if cfg.KeyRateLimit > 0 {
		s.keyLimits = &keyLimits{perSecond: cfg.KeyRateLimit, byKey: map[string]*rate.Limiter{}}
	}
	if cfg.Cluster != nil {
		t := cfg.PeerTransport
		if t == nil {
			t = http.DefaultTransport.(*http.Transport).Clone()
		}
		s.peerClient = &http.Client{Transport: t}
	}
	s.console = console.New(console.Config{Registry: cfg.Registry, Keys: cfg.Keys, Clock: cfg.Clock, Fail: s.fail})
	s.gin = s.routes()
	return s, nil
}

// Handler returns the HTTP handler of every endpoint.
func (s *Server) Handler() http.Handler { return s.gin }

// admitHello takes a place among the connections waiting to say hello, or
// reports that there is none.
func (s *Server) admitHello() bool {
	if s.cfg.MaxPendingHellos < 0 {
		s.pendingHellos.Add(1)
		return true
	}
	if s.pendingHellos.Add(1) > int64(s.cfg.MaxPendingHellos) {
		s.pendingHellos.Add(-1)
		return false
	}
	return true
}

// track registers a live session; it fails once shutdown began.
func (s *Server) track(sess *session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.sessions[sess] = struct{}{}
	s.wg.Add(1)
	return true
}

func (s *Server) untrack(sess *session) {
	s.mu.Lock()
	delete(s.sessions, sess)
	s.mu.Unlock()
	s.wg.Done()
}

// Shutdown closes every client with 1001 and waits for their sessions to
// end, or for ctx.
func (s *Server) Shutdown(ctx context.Context) error {
	s.console.Close()
	s.mu.Lock()
	s.closing = true
	for sess := range s.sessions {
		sess.Close(protocol.CloseGoingAway, "broker shutting down")
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("server: shutdown: %w", ctx.Err())
	}
}

// CutClients closes every client connection with code, as a replica that
// lost the database must: its clients reconnect to a replica that can act
// for them. Unlike Shutdown, new connections are taken again afterwards.
func (s *Server) CutClients(code protocol.CloseCode, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sess := range s.sessions {
		sess.Close(code, reason)
	}
}

func newID() string {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("server: crypto/rand: %v", err))
	}
	return hex.EncodeToString(b[:])
}
