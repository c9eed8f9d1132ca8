// Package broker runs Cheetah for the harness: a whole broker in this
// process (store, registry, HTTP and WebSocket server on a loopback port),
// console agents answering echo over real WebSockets, and the SDK both in
// process and over HTTP.
package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/agent"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/internal/procs"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/quota"
	"github.com/cheetahbroker/cheetah/remote"
	"github.com/cheetahbroker/cheetah/server"
	"github.com/cheetahbroker/cheetah/server/auth"
)

// User is the one user every benchmark context belongs to.
const User = "usr_bench"

// Store names the broker's history store.
type Store string

const (
	SQLite   Store = "sqlite"
	Postgres Store = "postgres"
)

// Options say how to start a broker.
type Options struct {
	Store Store
	// DatabaseURL is the PostgreSQL database (its own, made for this broker)
	// when Store is Postgres.
	DatabaseURL string
	// MaxInFlightPerContext is passed through; zero keeps the default.
	MaxInFlightPerContext int
	// Log receives the broker's logs; nil discards them.
	Log *slog.Logger
	// Replica makes the broker a replica of the others on DatabaseURL
	// (docs/cluster.md): it advertises its own listener to them.
	Replica bool
	// AppKey and ClientKey, when set, are used instead of new keys (the
	// replicas of one database share them).
	AppKey, ClientKey string
}

// Broker is a running broker with its listener, keys and agents.
type Broker struct {
	B         *server.Broker
	URL       string // http://127.0.0.1:PORT
	AppKey    string
	ClientKey string

	dir    string
	srv    *http.Server
	served chan struct{}

	mu     sync.Mutex
	agents []*runningAgent

	releaseProcs func()
}

type runningAgent struct {
	a       *agent.Agent
	stop    context.CancelFunc
	done    chan struct{}
	session string // the session id of its first connection
}

// Start opens a broker on the store and serves it on a free loopback port.
func Start(ctx context.Context, o Options) (*Broker, error) {
	so := server.Options{Log: o.Log, MaxInFlightPerContext: o.MaxInFlightPerContext}
	b := &Broker{served: make(chan struct{})}
	switch o.Store {
	case SQLite:
		dir, err := os.MkdirTemp("", "cheetah-bench-*")
		if err != nil {
			return nil, err
		}
		b.dir, so.DataDir = dir, dir
	case Postgres:
		if o.DatabaseURL == "" {
			return nil, errors.New("broker: postgres needs a database URL")
		}
		dir, err := os.MkdirTemp("", "cheetah-bench-*")
		if err != nil {
			return nil, err
		}
		b.dir, so.DataDir, so.DatabaseURL = dir, dir, o.DatabaseURL
	default:
		return nil, fmt.Errorf("broker: unknown store %q", o.Store)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(b.dir)
		return nil, err
	}
	b.URL = "http://" + ln.Addr().String()
	if o.Replica {
		so.AdvertiseURL = b.URL
	}
	if b.B, err = server.Open(ctx, so); err != nil {
		ln.Close()
		os.RemoveAll(b.dir)
		return nil, err
	}
	b.AppKey, b.ClientKey = o.AppKey, o.ClientKey
	if b.AppKey == "" {
		app, err := b.B.Keys.Create(ctx, auth.App, "", "bench app")
		if err != nil {
			ln.Close()
			b.closeBroker()
			return nil, err
		}
		client, err := b.B.Keys.Create(ctx, auth.Client, User, "bench clients")
		if err != nil {
			ln.Close()
			b.closeBroker()
			return nil, err
		}
		b.AppKey, b.ClientKey = app.Secret, client.Secret
	}
	b.srv = &http.Server{Handler: b.B.Server.Handler(), ReadHeaderTimeout: 10 * time.Second}
	ln = server.HoldWrites(b.srv, ln) // as cheetah serve does
	b.releaseProcs = governProcs(o.Log)
	go func() {
		defer close(b.served)
		_ = b.srv.Serve(ln)
	}()
	return b, nil
}

// StartReplicas starts n replicas on one PostgreSQL database (o.Store must
// be Postgres), sharing one app key and one client key, and waits until
// each knows the others.
func StartReplicas(ctx context.Context, o Options, n int) ([]*Broker, error) {
	o.Replica = true
	var rs []*Broker
	closeAll := func() {
		for _, r := range rs {
			r.Close()
		}
	}
	for range n {
		r, err := Start(ctx, o)
		if err != nil {
			closeAll()
			return nil, err
		}
		rs = append(rs, r)
		o.AppKey, o.ClientKey = r.AppKey, r.ClientKey
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, r := range rs {
		for len(r.B.Cluster.Peers()) != n-1 {
			if time.Now().After(deadline) {
				closeAll()
				return nil, fmt.Errorf("broker: replica %s sees %d others, want %d", r.B.Cluster.ID(), len(r.B.Cluster.Peers()), n-1)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return rs, nil
}

// Manager is the in-process SDK.
func (b *Broker) Manager() *cheetah.Manager { return b.B.Manager() }

// Remote is the SDK over the HTTP API, with a transport that keeps up to
// idle keep-alive connections to the broker (Go's default keeps two, which
// makes concurrent callers open and close a connection per request).
func (b *Broker) Remote(idle int) *cheetah.Manager {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = idle
	tr.MaxIdleConnsPerHost = idle
	return remote.New(b.URL, b.AppKey, remote.WithHTTPClient(&http.Client{Transport: tr}))
}

// AddAgents connects n console agents with flows contexts each, all
// answering echo, and waits until each has reported its contexts.
func (b *Broker) AddAgents(ctx context.Context, prefix string, n, flows int) error {
	for i := range n {
		a := agent.New(agent.Config{
			URL: b.URL, Token: b.ClientKey, ClientID: fmt.Sprintf("%s-%d", prefix, i),
			Name: "cheetah-bench", Flows: flows,
		})
		a.Handle("echo", agent.Echo())
		actx, stop := context.WithCancel(context.Background())
		ra := &runningAgent{a: a, stop: stop, done: make(chan struct{})}
		go func() { defer close(ra.done); _ = a.Run(actx) }()
		b.mu.Lock()
		b.agents = append(b.agents, ra)
		b.mu.Unlock()
		select {
		case <-a.Connected():
		case <-ctx.Done():
			return ctx.Err()
		}
		sess, _ := a.Session()
		ra.session = sess.ID
	}
	return nil
}

// Dropped returns how many agents have lost the connection they first had
// (the broker closed it, or it broke), and how many agents there are.
func (b *Broker) Dropped() (dropped, agents int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, ra := range b.agents {
		if s, ok := ra.a.Session(); !ok || s.ID != ra.session {
			dropped++
		}
	}
	return dropped, len(b.agents)
}

// WaitIdle waits until the user has at least n idle console contexts.
func (b *Broker) WaitIdle(ctx context.Context, n int) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		got, err := b.Manager().ListAvailable(ctx, User, cheetah.Console)
		if err != nil {
			return err
		}
		if len(got) >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("broker: %d idle contexts after 60 s, want %d", len(got), n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Close stops the agents (so that none reconnects), the listener, the
// broker and its store, and removes the data directory.
func (b *Broker) Close() {
	b.mu.Lock()
	agents := b.agents
	b.agents = nil
	b.mu.Unlock()
	for _, ra := range agents {
		ra.stop()
	}
	for _, ra := range agents {
		<-ra.done
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_ = b.srv.Shutdown(ctx)
	<-b.served
	b.closeBroker()
	b.releaseProcs()
}

// governed is the process's processor governor, as cheetah serve runs it
// (--procs auto), shared by the brokers the harness runs at once: it
// governs the whole process, so there is one while any broker runs.
var governed struct {
	sync.Mutex
	brokers int
	gov     *procs.Governor
}

// governProcs counts a broker in, starting the governor for the first (it
// logs its changes to that broker's log), and returns what counts it out,
// stopping the governor after the last.
func governProcs(log *slog.Logger) (release func()) {
	governed.Lock()
	defer governed.Unlock()
	if governed.brokers == 0 {
		governed.gov = procs.New(procs.Config{Log: log})
		governed.gov.Start()
	}
	governed.brokers++
	var once sync.Once
	return func() {
		once.Do(func() {
			governed.Lock()
			defer governed.Unlock()
			if governed.brokers--; governed.brokers == 0 {
				governed.gov.Stop()
				governed.gov = nil
			}
		})
	}
}

func (b *Broker) closeBroker() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_ = b.B.Close(ctx)
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}

// Registry is a registry alone, on a real store, whose clients are stubs
// that take every frame and drop it: the acquire/release path with no
// network and no client behind it.
type Registry struct {
	Reg   *registry.Registry
	store *history.Store
}

// discard is a client connection that accepts every frame.
type discard struct{}

func (discard) Send(protocol.Frame) bool         { return true }
func (discard) Close(protocol.CloseCode, string) {}

// StartRegistry opens the store at databaseURL (SQLite in dir when empty)
// and a registry over it with clients×flows idle console contexts, and
// quotas in force (none when nil).
func StartRegistry(ctx context.Context, databaseURL, dir string, clients, flows int, quotas *quota.Set) (*Registry, error) {
	st, err := history.Open(ctx, history.Config{DatabaseURL: databaseURL, DataDir: dir})
	if err != nil {
		return nil, err
	}
	reg, err := registry.New(ctx, registry.Config{Store: st})
	if err != nil {
		st.Close()
		return nil, err
	}
	reg.SetQuotas(quotas)
	for i := range clients {
		att := reg.Connect(registry.ClientInfo{UserID: User, ClientID: fmt.Sprintf("stub-%d", i), Type: cheetah.Console}, discard{})
		reps := make([]protocol.ContextReport, flows)
		for j := range reps {
			reps[j] = protocol.ContextReport{ContextID: fmt.Sprintf("flow-%d", j+1), TabID: fmt.Sprint(j + 1), Owner: protocol.OwnerWorker}
		}
		reg.Report(att, reps)
	}
	return &Registry{Reg: reg, store: st}, nil
}

// Manager is the in-process SDK over the registry.
func (r *Registry) Manager() *cheetah.Manager { return cheetah.NewManager(r.Reg) }

// Close stops the registry and closes the store.
func (r *Registry) Close() {
	r.Reg.Close()
	r.store.Close()
}
