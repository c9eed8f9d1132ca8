package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.opentelemetry.io/otel"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/internal/procs"
	"github.com/cheetahbroker/cheetah/quota"
	"github.com/cheetahbroker/cheetah/server"
	"github.com/cheetahbroker/cheetah/server/telemetry"
)

type serveCmd struct {
	Listen           string        `default:"127.0.0.1:8420" help:"Address to listen on."`
	DatabaseURL      string        `name:"database-url" help:"postgres://… for PostgreSQL; empty for an embedded SQLite file in --data-dir."`
	DataDir          string        `default:"./cheetah-data" help:"Folder of the embedded SQLite store."`
	DefaultTTL       time.Duration `name:"default-ttl" default:"${default_ttl}" help:"Lease TTL when an acquire names none (1s to 1h)."`
	ReconnectGrace   time.Duration `default:"${default_reconnect_grace}" help:"How long a disconnected client's leases survive."`
	HistoryRetention time.Duration `default:"720h" help:"How long finished commands are kept; 0 keeps them forever."`
	MaxMessageBytes  int           `default:"${default_max_message_bytes}" help:"Largest WebSocket frame, in bytes."`
	Heartbeat        time.Duration `default:"${default_heartbeat}" help:"How often the broker pings clients; three silent intervals close one."`
	ShutdownTimeout  time.Duration `default:"15s" help:"On SIGTERM or SIGINT, how long commands in flight may run on before they are marked interrupted."`
	KeyRateLimit     float64       `name:"key-rate-limit" default:"0" help:"Requests per second per API key; 0 is unlimited."`
	FrameRateLimit   float64       `name:"frame-rate-limit" default:"0" help:"Frames per second per client; 0 is unlimited (over it: close 4429)."`
	MaxBodyBytes     int64         `name:"max-body-bytes" default:"${default_max_body_bytes}" help:"Largest HTTP request body, in bytes."`
	MaxInFlight      int           `name:"max-in-flight-per-context" default:"${default_max_in_flight}" help:"Commands admitted and not yet ended per context; a send past it is overloaded (503)."`
	MaxPendingHellos int           `name:"max-pending-hellos" default:"${default_max_pending_hellos}" help:"Client connections that have not said hello yet; past it an upgrade is refused (503 overloaded)."`
	AllowedOrigins   []string      `name:"allowed-origins" help:"Origins (chrome-extension://<id>) that may open the client WebSocket; empty allows any."`
	WebhookPrivate   bool          `name:"webhook-allow-private" help:"Let webhook callbacks reach private and loopback addresses, and allow http:// callbacks."`
	LogLevel         string        `default:"info" enum:"debug,info,warn,error" help:"debug, info, warn or error."`
	LogFormat        string        `default:"text" enum:"text,json" help:"text (logfmt) or json (one object per line), on stderr."`
	AdminKey         string        `name:"admin-key" env:"CHEETAH_ADMIN_KEY" help:"An admin key to accept; when unset and none exists, one is made and printed once."`
	TLSCert          string        `name:"tls-cert" and:"tls" type:"path" help:"PEM certificate (chain) file: serve HTTPS and wss:// on --listen; reloaded when it changes. Needs --tls-key."`
	TLSKey           string        `name:"tls-key" and:"tls" type:"path" help:"PEM private key file of --tls-cert."`
	AdvertiseURL     string        `name:"advertise-url" help:"Where the other replicas on the same PostgreSQL reach this one (http(s)://host:port); default: --listen's address."`
	ReplicaTTL       time.Duration `name:"replica-ttl" default:"5s" help:"With PostgreSQL: how long this replica acts without renewing its membership; the others end its commands a grace later (two renewals, TTL/5 each, plus 1s). Shorter fails over sooner, and fences sooner on a slow database."`
	Procs            string        `default:"auto" enum:"auto,all" help:"auto: run on one processor while one is enough, on all of GOMAXPROCS once goroutines wait for it or it is full (a light load's round trips then wake no idle processor); all: always on all. A GOMAXPROCS environment variable turns auto off."`
	QuotaFile        string        `name:"quota-file" env:"CHEETAH_QUOTA_FILE" type:"path" help:"YAML file of quota caps (global, tenant, user); reloaded on SIGHUP and by POST /api/v1/admin/quotas/reload. A broken file refuses to start."`
}

// shutdownGrace bounds what a graceful stop does after --shutdown-timeout:
// marking the rest interrupted, answering the callers that waited, closing
// the clients, flushing history and the exporters.
const shutdownGrace = 10 * time.Second

func (c *serveCmd) Run() error {
	log, err := newLog(c.LogLevel, c.LogFormat, c.AdminKey, dbPassword(c.DatabaseURL))
	if err != nil {
		return err
	}
	if c.DefaultTTL < time.Second || c.DefaultTTL > time.Hour {
		return fmt.Errorf("--default-ttl must be from 1s to 1h")
	}
	if c.MaxMessageBytes < cheetah.MinMaxMessageBytes {
		return fmt.Errorf("--max-message-bytes must be at least %d", cheetah.MinMaxMessageBytes)
	}
	if c.ReplicaTTL < time.Second {
		return fmt.Errorf("--replica-ttl must be at least 1s")
	}
	if c.ShutdownTimeout < 0 {
		return fmt.Errorf("--shutdown-timeout must not be negative")
	}
	// A quota file that does not load fails the start too.
	if c.QuotaFile != "" {
		if _, err := quota.Load(c.QuotaFile); err != nil {
			return err
		}
	}
	// A certificate that does not load fails the start, before anything else.
	var certs *server.CertReloader
	if c.TLSCert != "" {
		if certs, err = server.NewCertReloader(c.TLSCert, c.TLSKey, log); err != nil {
			return err
		}
		defer certs.ReloadOnSIGHUP()()
	}
	// The first SIGTERM or SIGINT starts a graceful stop; a second one ends
	// the process at once.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-sigs:
		case <-done:
			return
		}
		cancel()
		select {
		case sig := <-sigs:
			log.Warn("second signal: exiting at once; commands in flight are marked interrupted at the next start", "signal", sig.String())
			os.Exit(exitError)
		case <-done:
		}
	}()

	tel, err := telemetry.New(ctx, telemetry.Config{ServiceName: "cheetah", ServiceVersion: version, FromEnv: true})
	if err != nil {
		return err
	}
	if tel.Traces != "none" {
		otel.SetTracerProvider(tel.TracerProvider())
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("opentelemetry", "err", err) }))
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		defer cancel()
		if err := tel.Shutdown(sctx); err != nil {
			log.Warn("flush telemetry", "err", err)
		}
	}()

	// Listen at once: while the store cannot be opened (PostgreSQL down at
	// start), /healthz answers 200 and the rest 503, and the store is
	// tried again with backoff until it opens or a signal stops us.
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	front := server.NewStarting(tel.MetricsHandler())
	httpSrv := &http.Server{Handler: front, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	ln = server.HoldWrites(httpSrv, ln)
	errc := make(chan error, 1)
	if certs != nil {
		httpSrv.TLSConfig = certs.TLSConfig()
		go func() { errc <- httpSrv.ServeTLS(ln, "", "") }()
	} else {
		go func() { errc <- httpSrv.Serve(ln) }()
	}
	scheme := "http"
	if certs != nil {
		scheme = "https"
	}
	advertise := c.AdvertiseURL
	if advertise == "" && history.IsPostgres(c.DatabaseURL) {
		advertise = advertiseURL(scheme, ln.Addr().String(), c.Listen)
	}
	b, err := server.OpenRetry(ctx, server.Options{
		DatabaseURL: c.DatabaseURL, DataDir: c.DataDir, AdminKey: c.AdminKey, DefaultTTL: c.DefaultTTL,
		ReconnectGrace: c.ReconnectGrace, Heartbeat: c.Heartbeat, MaxMessageBytes: c.MaxMessageBytes, Log: log,
		KeyRateLimit: c.KeyRateLimit, FrameRateLimit: c.FrameRateLimit,
		MaxInFlightPerContext: c.MaxInFlight, MaxPendingHellos: c.MaxPendingHellos, MaxBodyBytes: c.MaxBodyBytes, AllowedOrigins: c.AllowedOrigins, LoopbackOnly: loopback(c.Listen),
		WebhookAllowPrivate: c.WebhookPrivate, Telemetry: tel,
		HistoryRetention: c.HistoryRetention, Listen: c.Listen, AdvertiseURL: advertise, ReplicaTTL: c.ReplicaTTL, QuotaFile: c.QuotaFile,
	}, server.DefaultRetry)
	if err != nil {
		sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		defer cancel()
		_ = httpSrv.Shutdown(sctx)
		if ctx.Err() != nil {
			log.Info("stopped before the store opened")
			return nil
		}
		return err
	}
	closed := false
	defer func() {
		if closed {
			return
		}
		cctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		defer cancel()
		if err := b.Close(cctx); err != nil {
			log.Warn("close", "err", err)
		}
	}()
	secret, err := b.Keys.EnsureAdmin(ctx)
	if err != nil {
		return err
	}
	if secret != "" {
		// Shown once, on the terminal, never through the logger.
		fmt.Fprintf(os.Stdout, "\nNo admin key existed, so one was made. It is shown only this once:\n\n    %s\n\nKeep it; use it as: Authorization: Bearer <key>\n\n", secret)
	}
	if b.Quotas != nil {
		defer b.Quotas.ReloadOnSIGHUP()()
	}
	if c.Procs == "auto" {
		// Once the store is open: opening and migrating it runs on all.
		gov := procs.New(procs.Config{Log: log})
		gov.Start()
		defer gov.Stop()
	}
	front.Ready(b.Server.Handler())
	attrs := []any{"listen", ln.Addr().String(), "scheme", scheme, "store", b.Store.Dialect(),
		"traces", tel.Traces, "metrics", "prometheus:/metrics," + tel.Metrics}
	if b.Cluster != nil {
		attrs = append(attrs, "replica", b.Cluster.ID(), "advertise", b.Cluster.URL())
	}
	log.Info("cheetah serving", attrs...)
	if certs == nil && !loopback(c.Listen) {
		log.Warn("serving plain HTTP beyond loopback: keys travel in clear unless a TLS proxy is in front; see --tls-cert")
	}

	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}

	// Drain: /readyz answers 503 and new work is refused while the
	// commands in flight run on, up to --shutdown-timeout; the rest are
	// then marked interrupted.
	log.Info("shutting down: draining", "in_flight", b.Registry.InFlight(), "timeout", c.ShutdownTimeout.String())
	dctx, cancelDrain := context.WithTimeout(context.Background(), c.ShutdownTimeout)
	n, err := b.Drain(dctx, shutdownGrace)
	cancelDrain()
	switch {
	case err != nil:
		log.Warn("commands in flight could not all be marked interrupted; the next start marks the rest", "interrupted", n, "err", err)
	case n > 0:
		log.Info("commands still in flight were marked interrupted", "count", n)
	default:
		log.Info("every command in flight ended")
	}
	gctx, cancelGrace := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancelGrace()
	// The callers that waited get their answers; then the listener closes.
	if err := httpSrv.Shutdown(gctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Warn("http shutdown", "err", err)
	}
	// Clients are closed with 1001, history is flushed and the store closed.
	closed = true
	if err := b.Close(gctx); err != nil {
		log.Warn("close", "err", err)
	}
	log.Info("stopped")
	return nil
}

// newLog returns the process's logger on stderr: text or JSON, never a key
// (see server.NewLogHandler); secrets are literals to keep out as well.
func newLog(level, format string, secrets ...string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	h, err := server.NewLogHandler(os.Stderr, format, l, secrets...)
	if err != nil {
		return nil, fmt.Errorf("--log-format: %w", err)
	}
	return slog.New(h), nil
}

// dbPassword is the database URL's password, if any, for the log to redact.
func dbPassword(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.User == nil {
		return ""
	}
	pw, _ := p.User.Password()
	return pw
}

// loopback reports whether addr listens on loopback only; such a broker
// checks the Host header against DNS rebinding.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// advertiseURL is where the other replicas reach this one when
// --advertise-url is not given: the listen address, with this host's name
// in place of an unspecified address (0.0.0.0, ::).
func advertiseURL(scheme, bound, listen string) string {
	host, port, err := net.SplitHostPort(bound)
	if err != nil {
		return scheme + "://" + listen
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if name, err := os.Hostname(); err == nil {
			host = name
		}
	}
	return scheme + "://" + net.JoinHostPort(host, port)
}
