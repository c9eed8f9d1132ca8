package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/cheetahbroker/cheetah/internal/heldconn"
	"github.com/cheetahbroker/cheetah/internal/tracing"
	"github.com/cheetahbroker/cheetah/protocol"
)

// Defaults for the zero values of Config.
const (
	DefaultMinBackoff   = 250 * time.Millisecond
	DefaultMaxBackoff   = 30 * time.Second
	DefaultPingInterval = 20 * time.Second
)

// clientPath is where the broker serves client WebSockets (DESIGN §4).
const clientPath = "/ws/v1/client"

// handshakeTimeout bounds dialling, hello and welcome together. The broker
// itself waits 10 s for hello, so a handshake that takes longer is not going
// to succeed.
const handshakeTimeout = 10 * time.Second

// Config says where an agent connects and what it offers.
type Config struct {
	// URL is the broker's base URL, such as "http://127.0.0.1:8420" or
	// "wss://broker.example.com". The agent dials <URL>/ws/v1/client, with
	// http mapped to ws and https to wss; a URL that already ends in
	// /ws/v1/client is used as it is.
	URL string
	// TLSConfig, when set, is the TLS client configuration of wss://
	// connections: RootCAs to trust a broker whose certificate a private or
	// self-signed CA issued, a client certificate for a proxy that asks for
	// one. Nil uses the system's roots. Proxies named by HTTPS_PROXY and
	// the like are used either way.
	TLSConfig *tls.Config
	// Token is the client key. It travels in hello and is never logged.
	Token string
	// ClientID names this client to the broker. Keep it stable across
	// restarts: a client that comes back with the same id keeps its leases.
	ClientID string
	// Name and Version describe the client in the broker's admin views.
	Name, Version string
	// Labels are matched by acquire requests that ask for them.
	Labels map[string]string
	// Effects declares, in hello, what each command does: EffectObserve
	// for a command that only reads, EffectMutate for one that changes
	// something (EchoEffect and ExecEffect for the built-in handlers).
	Effects map[string]string
	// Flows is how many console flows the agent offers, reported as the
	// contexts "flow-1" to "flow-N" with tab_id "1" to "N". Default 1.
	Flows int
	// MaxFlows is how many flows the agent may hold in all, reported as
	// its hello's capacity.max_contexts: when the broker asks for a new
	// context (create_context, DESIGN §10), the agent opens one more flow,
	// up to MaxFlows, and answers create_failed beyond it. Default Flows
	// (no flow opened on request).
	MaxFlows int
	// Log receives the agent's logs; nil discards them.
	Log *slog.Logger
	// MinBackoff and MaxBackoff bound the jittered exponential delay between
	// connection attempts. Defaults DefaultMinBackoff and DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// PingInterval is how often the agent sends a ping frame. A broker that
	// sends nothing at all for three intervals is taken for gone, and the
	// agent reconnects. Default DefaultPingInterval.
	PingInterval time.Duration
	// TracerProvider makes the span of each command the agent runs
	// (cheetah.agent.command), a child of the broker's dispatch span named
	// by the command frame's traceparent; a handler's context carries it,
	// so the handler's own spans nest under it. Nil is otel's global
	// provider, a no-op unless the program installed an SDK.
	TracerProvider trace.TracerProvider
}

// Session describes the connection the broker welcomed.
type Session struct {
	ID              string        // the broker's session id
	UserID          string        // the user the client key belongs to
	Heartbeat       time.Duration // how often the broker pings
	MaxMessageBytes int64         // the largest frame the broker accepts
}

// Agent is one client of a broker. Create it with New, register handlers
// with Handle, and call Run.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	dialer *http.Client // dials the WebSocket
	tracer trace.Tracer
	// flowsMu guards flows and order, which grow when the broker asks for
	// a new flow, and quit and workers, the current Run's.
	flowsMu sync.RWMutex
	flows   map[string]*flow
	order   []*flow // the flows in report order, flow-1 first
	quit    chan struct{}
	workers *sync.WaitGroup

	handlersMu sync.RWMutex
	handlers   map[string]Handler

	running atomic.Bool // whether Run is active; it must not run twice at once

	mu   sync.Mutex
	sess *session        // the welcomed connection, nil while disconnected
	up   chan struct{}   // closed while sess is set; see Connected
	jobs map[string]*job // commands queued or running, by command id
	acks sync.WaitGroup  // one per command whose ack is not sent yet (command.go)

	ackWithin time.Duration // defaultAckWithin; other in tests

	holds holdWaiters // Hold and Unhold calls waiting for hold_state (hold.go)
}

// New returns an agent for cfg, with the defaults of Config applied. It
// checks nothing; Run reports a bad configuration.
func New(cfg Config) *Agent {
	cfg.Flows = max(cfg.Flows, 1)
	cfg.MaxFlows = max(cfg.MaxFlows, cfg.Flows)
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	cfg.MaxBackoff = max(cfg.MaxBackoff, cfg.MinBackoff)
	if cfg.PingInterval <= 0 {
		cfg.PingInterval = DefaultPingInterval
	}
	// The agent reads the labels on every reconnect, so it keeps its own copy
	// rather than racing with a caller that reuses the map.
	cfg.Labels = maps.Clone(cfg.Labels)
	cfg.Effects = maps.Clone(cfg.Effects)
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &Agent{
		cfg:       cfg,
		dialer:    dialer(cfg.TLSConfig),
		tracer:    tracing.Tracer(cfg.TracerProvider, "github.com/cheetahbroker/cheetah/agent"),
		log:       log.With("client_id", cfg.ClientID),
		flows:     make(map[string]*flow, cfg.Flows),
		handlers:  make(map[string]Handler),
		up:        make(chan struct{}),
		jobs:      make(map[string]*job),
		ackWithin: defaultAckWithin,
	}
	for i := 1; i <= cfg.Flows; i++ {
		n := strconv.Itoa(i)
		f := newFlow("flow-"+n, n)
		a.flows[f.id] = f
		a.order = append(a.order, f)
	}
	return a
}

// Handle registers h for commands named name, replacing any handler that
// name had. It may be called while the agent runs.
func (a *Agent) Handle(name string, h Handler) {
	a.handlersMu.Lock()
	defer a.handlersMu.Unlock()
	a.handlers[name] = h
}

func (a *Agent) handler(name string) Handler {
	a.handlersMu.RLock()
	defer a.handlersMu.RUnlock()
	return a.handlers[name]
}

// Connected returns a channel that is closed once the broker has welcomed
// the agent and the agent has reported its contexts, that is, once commands
// can arrive. While the agent is disconnected it returns a channel that the
// next successful connection closes, so call it again after a reconnect.
func (a *Agent) Connected() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.up
}

// Session returns the current connection's welcome, and false while the agent
// is not connected.
func (a *Agent) Session() (Session, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.sess == nil {
		return Session{}, false
	}
	w := a.sess.welcome
	return Session{
		ID:              w.SessionID,
		UserID:          w.UserID,
		Heartbeat:       time.Duration(w.HeartbeatS) * time.Second,
		MaxMessageBytes: w.MaxMessageBytes,
	}, true
}

// Run connects to the broker and serves commands until ctx ends, then
// returns nil once every handler has returned. It reconnects whenever the
// connection is lost, except when the broker closes it with 4401 (bad key),
// 4403 (disconnected by an admin or key revoked) or 4409 (replaced by a newer
// connection with the same client id): then it returns a *CloseError, since
// retrying cannot help. A configuration the broker would refuse is reported
// at once.
func (a *Agent) Run(ctx context.Context) error {
	target, err := clientURL(a.cfg.URL)
	if err != nil {
		return err
	}
	// Encoding runs the same checks the broker's decoder does, so a bad
	// client id or label fails here, once, instead of on every attempt.
	if _, err := protocol.Encode(a.hello()); err != nil {
		return fmt.Errorf("agent: config: %w", err)
	}
	if !a.running.CompareAndSwap(false, true) {
		return errors.New("agent: run: already running")
	}
	defer a.running.Store(false)
	if cleartextRemote(target) {
		a.log.Warn("agent: the broker is on another machine and the URL is not https or wss: the client key travels in clear",
			"url", target)
	}

	// The workers outlive ctx a little: they stop only once the connection
	// is closed, since the reader may still queue a command while the close
	// handshake runs. Such a command's context has ended with ctx, so its
	// worker just reports it cancelled.
	quit := make(chan struct{})
	var workers sync.WaitGroup
	a.flowsMu.Lock()
	a.quit, a.workers = quit, &workers
	for _, f := range a.order {
		workers.Go(func() { f.serve(quit, a.execute) })
	}
	a.flowsMu.Unlock()
	err = a.connectLoop(ctx, target)
	close(quit)
	workers.Wait()
	a.acks.Wait() // every command ended; an ack sent on its own may be under way
	// An upgrade the broker refused may have left a connection idle in
	// the agent's own transport.
	a.dialer.CloseIdleConnections()
	return err
}

// connectLoop keeps one connection up at a time until ctx ends or the broker
// refuses the agent for good.
func (a *Agent) connectLoop(ctx context.Context, target string) error {
	b := &backoff{min: a.cfg.MinBackoff, max: a.cfg.MaxBackoff}
	for {
		err := a.connect(ctx, target, b.reset)
		if ctx.Err() != nil {
			return nil
		}
		if ce, ok := errors.AsType[*CloseError](err); ok && ce.permanent() {
			a.log.Error("agent: the broker refused the agent; not reconnecting", "err", err)
			return err
		}
		d := b.next()
		if ce, ok := errors.AsType[*CloseError](err); ok && ce.Code == protocol.CloseGoingAway {
			// A broker that restarts says so: expected.
			a.log.Info("agent: the broker is going away; reconnecting", "err", err, "retry_in", d)
		} else {
			a.log.Warn("agent: connection lost; reconnecting", "err", err, "retry_in", d)
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// connect runs one connection: handshake, state report, then serving until
// the connection ends. welcomed is called once the broker has accepted the
// agent, which is when the backoff starts over.
func (a *Agent) connect(ctx context.Context, target string, welcomed func()) error {
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	s, err := dial(hctx, target, a.dialer, a.log)
	if err != nil {
		return err
	}
	defer s.conn.CloseNow()
	if err := s.handshake(hctx, a.hello()); err != nil {
		return err
	}
	welcomed()
	a.log.Info("agent: connected", "session_id", s.welcome.SessionID, "user_id", s.welcome.UserID)
	if err := s.write(hctx, a.state(nil, "")); err != nil {
		return err
	}
	// Only now may handlers write: a late message from a command of an
	// earlier connection must not reach the broker before this
	// connection's state report makes its context live again.
	a.attach(s)
	defer a.detach(s)
	return s.serve(ctx, a)
}

func (a *Agent) hello() *protocol.Hello {
	return &protocol.Hello{
		Protocol:   protocol.ProtocolVersion,
		Token:      a.cfg.Token,
		ClientID:   a.cfg.ClientID,
		ClientType: protocol.ClientConsole,
		Name:       a.cfg.Name,
		Version:    a.cfg.Version,
		Labels:     a.cfg.Labels,
		Capacity:   &protocol.Capacity{MaxContexts: a.cfg.MaxFlows},
		Effects:    a.cfg.Effects,
	}
}

// state is the full state report. created, when not nil, is a flow just
// opened for the create_context of requestID, which its entry names.
func (a *Agent) state(created *flow, requestID string) *protocol.State {
	a.flowsMu.RLock()
	defer a.flowsMu.RUnlock()
	st := &protocol.State{Contexts: make([]protocol.ContextReport, 0, len(a.order))}
	for _, f := range a.order {
		rep := protocol.ContextReport{
			ContextID: f.id,
			TabID:     f.tabID,
			Owner:     protocol.OwnerWorker,
		}
		if f == created {
			rep.RequestID = requestID
		}
		st.Contexts = append(st.Contexts, rep)
	}
	return st
}

// flow returns the flow of context id, or nil.
func (a *Agent) flow(id string) *flow {
	a.flowsMu.RLock()
	defer a.flowsMu.RUnlock()
	return a.flows[id]
}

// onCreate opens a flow for the broker's create_context and reports it
// with the request's id, or answers create_failed when the agent already
// holds MaxFlows flows. The URL means nothing to a console flow.
func (a *Agent) onCreate(s *session, f *protocol.CreateContext) {
	a.flowsMu.Lock()
	if len(a.order) >= a.cfg.MaxFlows {
		a.flowsMu.Unlock()
		if err := s.write(context.Background(), &protocol.CreateFailed{RequestID: f.RequestID, Code: CodeNoRoom,
			Message: fmt.Sprintf("this agent holds its %d flows already", a.cfg.MaxFlows)}); err != nil {
			s.log.Warn("agent: create_failed failed", "err", err)
		}
		return
	}
	n := strconv.Itoa(len(a.order) + 1)
	fl := newFlow("flow-"+n, n)
	a.flows[fl.id] = fl
	a.order = append(a.order, fl)
	quit := a.quit
	a.workers.Go(func() { fl.serve(quit, a.execute) })
	a.flowsMu.Unlock()
	s.log.Info("agent: opened a flow on request", "context_id", fl.id, "request_id", f.RequestID)
	if err := s.write(context.Background(), a.state(fl, f.RequestID)); err != nil {
		s.log.Warn("agent: state report failed", "err", err)
	}
}

// attach makes s the connection handlers write to, and tells Connected's
// waiters.
func (a *Agent) attach(s *session) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sess = s
	close(a.up)
}

// detach forgets s, so that messages sent until the next connection is up
// are dropped rather than written to a dead socket.
func (a *Agent) detach(s *session) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.sess == s {
		a.sess = nil
		a.up = make(chan struct{})
	}
}

// send writes f on the current connection, or returns ErrNotConnected.
func (a *Agent) send(f protocol.Frame) error {
	a.mu.Lock()
	s := a.sess
	a.mu.Unlock()
	if s == nil {
		return ErrNotConnected
	}
	return s.write(context.Background(), f)
}

// cleartextRemote reports whether target, a client WebSocket URL, is ws://
// to a host other than this machine.
func cleartextRemote(target string) bool {
	u, err := url.Parse(target)
	if err != nil || u.Scheme != "ws" {
		return false
	}
	host := strings.ToLower(u.Hostname())
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return false
	}
	ip := net.ParseIP(host)
	return ip == nil || !ip.IsLoopback()
}

// dialer returns the HTTP client that dials the WebSocket, with tc when
// not nil. Its connections are heldconn's, so that a session can send a
// command's ack and its first message in one write; dial finds the one it
// got in its context's heldSlot.
func dialer(tc *tls.Config) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	if tc != nil {
		t.TLSClientConfig = tc.Clone()
	}
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second} // as http.DefaultTransport's
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		hc := heldconn.New(c)
		if slot, ok := ctx.Value(heldSlot{}).(*atomic.Pointer[heldconn.Conn]); ok {
			slot.Store(hc)
		}
		return hc, nil
	}
	return &http.Client{Transport: t}
}

// heldSlot is the context key under which dial learns the connection the
// transport dialed for it.
type heldSlot struct{}

// clientURL turns the configured broker URL into the WebSocket URL of the
// client endpoint.
func clientURL(base string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("agent: parse broker URL: %w", err)
	}
	switch u.Scheme {
	case "http", "ws":
		u.Scheme = "ws"
	case "https", "wss":
		u.Scheme = "wss"
	default:
		return "", fmt.Errorf("agent: broker URL %q: scheme must be http, https, ws or wss", base)
	}
	if u.Host == "" {
		return "", fmt.Errorf("agent: broker URL %q has no host", base)
	}
	if !strings.HasSuffix(u.Path, clientPath) {
		u.Path = strings.TrimSuffix(u.Path, "/") + clientPath
		u.RawPath = ""
	}
	return u.String(), nil
}
