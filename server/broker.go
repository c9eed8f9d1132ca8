package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/cluster"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/server/auth"
	"github.com/cheetahbroker/cheetah/server/telemetry"
	"github.com/cheetahbroker/cheetah/server/webhook"
)

// Options configure a whole broker. Zero values take the defaults of
// `cheetah serve`.
type Options struct {
	// DatabaseURL is postgres://… for PostgreSQL; empty for the embedded
	// SQLite file in DataDir.
	DatabaseURL string
	DataDir     string
	// AdminKey, when set, is accepted as an admin key.
	AdminKey        string
	DefaultTTL      time.Duration
	ReconnectGrace  time.Duration
	Heartbeat       time.Duration
	MaxMessageBytes int
	KeyRateLimit    float64
	FrameRateLimit  float64
	// MaxBodyBytes bounds an HTTP request body (1 MiB).
	MaxBodyBytes int64
	// MaxInFlightPerContext bounds each context's unfinished commands.
	MaxInFlightPerContext int
	// MaxPendingHellos bounds the connections not yet past hello (1,024).
	MaxPendingHellos int
	AllowedOrigins   []string
	LoopbackOnly     bool
	Log              *slog.Logger
	Clock            clockwork.Clock
	// WebhookSecret (whsec_…) signs the webhook deliveries of in-process
	// sends (cheetah.WithCallback), which carry no API key. Without it, an
	// in-process send with a callback is refused with invalid_request.
	// Sends over the HTTP API are signed with the requesting key's secret.
	WebhookSecret string
	// WebhookAllowPrivate lets callbacks reach private and loopback
	// addresses, and allows http:// callbacks (--webhook-allow-private).
	WebhookAllowPrivate bool
	// Telemetry gives the tracer and meter providers and the /metrics
	// handler. Nil builds one that serves Prometheus text at /metrics,
	// exports nothing and traces with otel's global provider; the broker
	// then shuts it down on Close. A Telemetry given here is the caller's
	// to shut down, after Close.
	Telemetry *telemetry.Telemetry
	// HistoryRetention is how long finished commands are kept; 0 keeps
	// them all. The broker deletes older ones at Open and then every
	// RetentionInterval (an hour), by Clock.
	HistoryRetention  time.Duration
	RetentionInterval time.Duration
	// QuotaFile is the quota funnel's YAML file (DESIGN §10); empty runs
	// without quotas. A broken file fails Open.
	QuotaFile string
	// Listen is the address the broker's HTTP server listens on, if any.
	// Open does not listen; it writes this in the SQLite database's lock
	// file, so that a second broker refused on the same data directory
	// names this one.
	Listen string
	// AdvertiseURL makes a broker on PostgreSQL a replica (DESIGN §9):
	// the other replicas on the database reach it at this URL
	// (http(s)://host:port). `cheetah serve` sets it from --listen, or
	// --advertise-url. Empty, or on SQLite, the broker is alone.
	AdvertiseURL string
	// ReplicaTTL is how long a replica's membership lasts unless renewed
	// (5 s); the others reap it 2 s after that. Tests shorten it.
	ReplicaTTL time.Duration
	// PeerTransport carries requests to the other replicas; nil is a
	// clone of http.DefaultTransport.
	PeerTransport http.RoundTripper
}

// Broker is the store, registry, keys and server wired together: what
// `cheetah serve` runs, and what an application embeds to use the SDK in
// process.
type Broker struct {
	Store    *history.Store
	Registry *registry.Registry
	Keys     *auth.Keys
	Server   *Server
	// Webhooks delivers command records to callback URLs.
	Webhooks *webhook.Worker
	// Retention deletes the history past Options.HistoryRetention.
	Retention *Retention
	// Telemetry holds the providers the broker reports to.
	Telemetry *telemetry.Telemetry
	// Cluster is this broker's membership among the replicas of its
	// PostgreSQL; nil when it is alone (Options.AdvertiseURL).
	Cluster *cluster.Member
	// Quotas is the quota file, when Options.QuotaFile named one.
	Quotas *QuotaFile
	ownTel bool // Open built Telemetry, so Close shuts it down
}

// Open opens the store (applying migrations), marks commands left in flight
// by the last run interrupted, and starts the registry.
func Open(ctx context.Context, o Options) (*Broker, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Clock == nil {
		o.Clock = clockwork.NewRealClock()
	}
	tel, ownTel := o.Telemetry, false
	if tel == nil {
		var err error
		if tel, err = telemetry.New(ctx, telemetry.Config{}); err != nil {
			return nil, err
		}
		ownTel = true
	}
	b, err := open(ctx, o, tel)
	if err != nil {
		if ownTel {
			_ = tel.Shutdown(context.WithoutCancel(ctx))
		}
		return nil, err
	}
	b.ownTel = ownTel
	return b, nil
}

func open(ctx context.Context, o Options, tel *telemetry.Telemetry) (*Broker, error) {
	tp, mp := tel.TracerProvider(), tel.MeterProvider()
	holder := "an embedded broker"
	if o.Listen != "" {
		holder = "a broker listening on " + o.Listen
	}
	replicaID := ""
	if o.AdvertiseURL != "" && history.IsPostgres(o.DatabaseURL) {
		replicaID = cluster.NewID()
	}
	store, err := history.Open(ctx, history.Config{DatabaseURL: o.DatabaseURL, DataDir: o.DataDir, Logger: o.Log,
		MeterProvider: mp, Holder: holder, ReplicaID: replicaID})
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	// The server is made later; the member reaches it through this.
	var srvRef atomic.Pointer[Server]
	var member *cluster.Member
	if replicaID != "" {
		// A replica ends only the commands of replicas that are gone (its
		// own previous life among them), never another live one's.
		member, err = cluster.Join(ctx, cluster.Config{Store: store, ID: replicaID, URL: o.AdvertiseURL,
			TTL: o.ReplicaTTL, Clock: o.Clock, Log: o.Log, MeterProvider: mp, Probe: probeReplica(o.PeerTransport), OnFenced: func() {
				if s := srvRef.Load(); s != nil {
					// Others may take its clients and leases from now on:
					// it forgets them, writing nothing.
					s.reg.Forget(protocol.CloseGoingAway, fencedReason)
					s.CutClients(protocol.CloseGoingAway, fencedReason)
				}
			}, Settle: func(ctx context.Context) error {
				if s := srvRef.Load(); s != nil {
					return s.reg.Flush(ctx)
				}
				return nil
			}, AfterTick: func(ctx context.Context) {
				if s := srvRef.Load(); s != nil {
					s.adoptOrphans(ctx)
					s.lapseAwaiting(ctx)
				}
			}})
		if err != nil {
			store.Close()
			return nil, fmt.Errorf("join the replicas: %w", err)
		}
	} else if err := markInterrupted(ctx, store, o); err != nil {
		store.Close()
		return nil, err
	}
	keys := auth.New(store, o.AdminKey, o.Clock.Now)
	if member != nil {
		// A revocation on another replica reaches this one as Forget; were
		// that lost (the replicas cut off from each other), the key is read
		// again within this.
		keys.SetCacheFor(keyCacheAmongReplicas)
	}
	hooks, err := webhook.New(webhook.Config{
		Store: store, Keys: keys, Secret: o.WebhookSecret, AllowPrivate: o.WebhookAllowPrivate,
		Clock: o.Clock, Log: o.Log, MeterProvider: mp,
	})
	if err != nil {
		store.Close()
		return nil, err
	}
	reg, err := registry.New(ctx, registry.Config{
		Clock: o.Clock, Store: store, Log: o.Log, DefaultTTL: o.DefaultTTL, TokenTag: replicaID, DurableLeases: replicaID != "",
		ReconnectGrace: o.ReconnectGrace, MaxMessageBytes: o.MaxMessageBytes,
		MaxInFlightPerContext: o.MaxInFlightPerContext, TracerProvider: tp, MeterProvider: mp,
	})
	if err != nil {
		hooks.Close()
		store.Close()
		return nil, err
	}
	var quotas *QuotaFile
	if o.QuotaFile != "" {
		if quotas, err = OpenQuotaFile(o.QuotaFile, reg, o.Log); err != nil {
			reg.Close()
			hooks.Close()
			store.Close()
			return nil, err
		}
	}
	// The worker wakes when a command with a callback ends durably here.
	reg.Subscribe(hooks.Observe)
	srv, err := New(Config{
		Quotas:   quotas,
		Registry: reg, Store: store, Keys: keys, Log: o.Log, Clock: o.Clock,
		Heartbeat: o.Heartbeat, MaxMessageBytes: o.MaxMessageBytes,
		KeyRateLimit: o.KeyRateLimit, FrameRateLimit: o.FrameRateLimit, MaxBodyBytes: o.MaxBodyBytes,
		MaxPendingHellos: o.MaxPendingHellos,
		AllowedOrigins:   o.AllowedOrigins, LoopbackOnly: o.LoopbackOnly, Webhooks: hooks,
		TracerProvider: tp, MeterProvider: mp, Metrics: tel.MetricsHandler(),
		Cluster: member, PeerTransport: o.PeerTransport,
	})
	if err != nil {
		reg.Close()
		hooks.Close()
		store.Close()
		return nil, err
	}
	srvRef.Store(srv)
	if member != nil {
		member.Start()
	}
	ret := NewRetention(RetentionConfig{Store: store, Keep: o.HistoryRetention, Interval: o.RetentionInterval,
		Clock: o.Clock, Log: o.Log})
	hooks.Start()
	ret.Start()
	return &Broker{Store: store, Registry: reg, Keys: keys, Server: srv, Webhooks: hooks, Retention: ret, Telemetry: tel,
		Cluster: member, Quotas: quotas}, nil
}

// keyCacheAmongReplicas bounds how long a replica trusts a key it read,
// when another replica may revoke it.
const keyCacheAmongReplicas = 10 * time.Second

// markInterrupted ends, at start, what a broker alone on its database had
// in flight when it last stopped.
func markInterrupted(ctx context.Context, store *history.Store, o Options) error {
	// Commands about to be marked interrupted end without a SetStatus, so
	// their webhook deliveries are armed first, at the same time.
	now := o.Clock.Now()
	if _, err := store.ArmInterruptedDeliveries(ctx, now); err != nil {
		return fmt.Errorf("arm webhook deliveries: %w", err)
	}
	n, err := store.MarkInterrupted(ctx, now)
	if err != nil {
		return fmt.Errorf("mark interrupted commands: %w", err)
	}
	if n > 0 {
		o.Log.Info("commands in flight at the last stop are now interrupted", "count", n)
	}
	return nil
}

// Manager is the in-process SDK over this broker. A send with a callback is
// checked as the HTTP API checks X-Callback-Url, and signed with
// Options.WebhookSecret. Its spans come from the broker's tracer provider.
func (b *Broker) Manager() *cheetah.Manager {
	return cheetah.NewManager(b.Webhooks.Guard(b.Registry), cheetah.WithTracerProvider(b.Telemetry.TracerProvider()))
}

// Drain begins a graceful shutdown. It stops taking new work: /readyz
// answers 503, new client connections, acquires and sends are refused with
// 503 overloaded, and acquires waiting for a context fail. Connected
// clients stay, and the commands in flight run on until they end or ctx
// ends. Those still in flight then are marked interrupted, durably, and
// their waiting callers get that resolution. Drain returns how many it
// interrupted; grace bounds that marking (the writes and the commands whose
// records were still being written).
//
// Close comes next: it closes the clients with 1001 and flushes history.
// An HTTP server in front of the broker is best shut down between the two,
// so that callers waiting on /commands/wait get their answers.
func (b *Broker) Drain(ctx context.Context, grace time.Duration) (int, error) {
	b.Server.Drain()
	b.Registry.Drain()
	if b.Registry.WaitIdle(ctx) == nil {
		return 0, nil
	}
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	return b.Registry.Interrupt(ictx)
}

// Close stops the broker: it marks the commands still in flight
// interrupted (all of them, at once: Drain first for a graceful stop),
// closes every client with 1001, stops the registry, the webhook worker
// (pending deliveries stay in the store for the next start) and history
// retention, flushes and
// closes the store, and shuts down the telemetry Open built (exporters
// send what they hold). ctx bounds the waits.
func (b *Broker) Close(ctx context.Context) error {
	_, ierr := b.Registry.Interrupt(ctx)
	err := b.Server.Shutdown(ctx)
	if b.Cluster != nil {
		// After the clients are closed: the others may take them at once.
		err = errors.Join(err, b.Cluster.Stop(ctx))
	}
	b.Registry.Close()
	b.Webhooks.Close()
	b.Retention.Close()
	err = errors.Join(ierr, err, b.Store.Close())
	if b.ownTel {
		err = errors.Join(err, b.Telemetry.Shutdown(ctx))
	}
	return err
}

// probeReplica asks whoever serves at a URL which replica it is, by the
// Cheetah-Replica header of its /healthz, within two seconds.
func probeReplica(t http.RoundTripper) func(ctx context.Context, url string) (string, bool) {
	hc := &http.Client{Transport: t, Timeout: 2 * time.Second}
	return func(ctx context.Context, url string) (string, bool) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/healthz", nil)
		if err != nil {
			return "", false
		}
		resp, err := hc.Do(req)
		if err != nil {
			return "", false
		}
		_ = resp.Body.Close()
		return resp.Header.Get(cluster.ReplicaHeader), true
	}
}
