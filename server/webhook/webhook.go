// Package webhook delivers a command's record to the callback URL its sender
// named, once the command ends (DESIGN §5 "Result delivery by webhook").
//
// Deliveries follow the Standard Webhooks convention: a POST of the record as
// JSON with webhook-id (the command id, the same on every attempt),
// webhook-timestamp and webhook-signature ("v1," and the base64 HMAC-SHA256
// of "<id>.<timestamp>.<body>", keyed with the base64-decoded part of a
// whsec_ secret), plus X-Cheetah-Attempt (1 to 4).
//
// Everything a pending delivery needs lives on the command's row in the
// history store, so nothing depends on this process's memory: the store makes
// the first attempt due when a command with a callback reaches a terminal
// status (in the transaction that records the status), and the Worker polls
// the due rows, claims each one for one attempt with a conditional update,
// makes the attempt, and records the outcome and the next due time. A
// broker that restarts finds its pending deliveries where it left them. The
// worker also wakes at once when a command with a callback ends in this
// process (an in-memory nudge, never the source of truth) and when the
// earliest pending delivery falls due, on the injected clock.
package webhook

import (
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history"
)

// Schedule is when the attempts of a delivery are due, counted from the end
// of the command: the first at once, then 1, 5 and 10 minutes after.
var Schedule = [...]time.Duration{0, time.Minute, 5 * time.Minute, 10 * time.Minute}

// MaxAttempts is how many attempts a delivery gets.
const MaxAttempts = len(Schedule)

// SecretPrefix starts every webhook secret; the signing key is the base64
// text after it.
const SecretPrefix = "whsec_"

// Store is what the worker needs of the history store.
type Store interface {
	Get(ctx context.Context, userID, commandID string) (cheetah.CommandRecord, error)
	Write(ctx context.Context, ops ...history.Op) error
	DueDeliveries(ctx context.Context, now time.Time, limit int) ([]history.PendingDelivery, error)
	NextDeliveryAt(ctx context.Context) (time.Time, bool, error)
	ClaimDelivery(ctx context.Context, commandID string, attempts int, now, until time.Time) (bool, error)
}

// Secrets gives the webhook secret of an API key: "" when the key has none
// (the bootstrap admin key), cheetah.ErrUnauthorized when the key is gone.
// *auth.Keys is one.
type Secrets interface {
	WebhookSecret(ctx context.Context, keyID string) (string, error)
}

// Config wires a Worker. Zero values take the defaults.
type Config struct {
	Store Store
	Keys  Secrets
	// Secret (whsec_…) signs the deliveries of commands that carry no key
	// id: those sent in process with cheetah.WithCallback. Without it such
	// sends are refused.
	Secret string
	// AllowPrivate lets callbacks reach private, loopback, link-local and
	// other non-public addresses, and allows http:// callbacks. Off, such a
	// destination is refused when the command is sent (a literal address or
	// a name like localhost) and again when the worker connects (whatever a
	// name resolves to then, which defeats DNS rebinding).
	AllowPrivate bool
	Clock        clockwork.Clock
	Log          *slog.Logger
	// Timeout bounds one attempt, from dialling to the end of the answer's
	// headers (10 s).
	Timeout time.Duration
	// PollInterval is how often the store is polled for due deliveries when
	// nothing else wakes the worker (30 s). The worker also wakes when the
	// earliest pending delivery falls due and when a command with a
	// callback ends in this process.
	PollInterval time.Duration
	// Concurrency bounds the attempts in flight at once (16).
	Concurrency int
	// MeterProvider makes the worker's metric, cheetah.webhook.deliveries
	// (attempts by outcome); nil records none.
	MeterProvider metric.MeterProvider
}

func (c *Config) fill() {
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
	if c.PollInterval <= 0 {
		c.PollInterval = 30 * time.Second
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 16
	}
}

// Worker delivers pending webhooks. Create it with New, start its loop with
// Start and stop it with Close. Flush runs what is due without the loop.
type Worker struct {
	cfg    Config
	store  Store
	keys   Secrets
	secret []byte // the decoded Config.Secret; nil when none
	clock  clockwork.Clock
	log    *slog.Logger
	client *http.Client
	tr     *http.Transport
	// attempts counts attempts by outcome; outcomes holds their options.
	attempts metric.Int64Counter
	outcomes map[string]metric.AddOption

	// claimFor is how long a claimed delivery is kept from other polls; an
	// attempt cut short by a crash is made again after it.
	claimFor time.Duration

	ctx    context.Context // cancelled by Close: in-flight attempts stop
	cancel context.CancelFunc
	kick   chan struct{}
	stop   chan struct{}
	done   chan struct{}

	passMu sync.Mutex // one poll of the store at a time

	mu       sync.Mutex
	started  bool
	closed   bool
	inflight int
	idle     chan struct{} // closed while inflight is 0
	wg       sync.WaitGroup
}

// New returns a Worker; its loop does not run until Start.
func New(cfg Config) (*Worker, error) {
	cfg.fill()
	if cfg.Store == nil || cfg.Keys == nil {
		return nil, fmt.Errorf("webhook: new: a store and keys are required")
	}
	w := &Worker{
		cfg: cfg, store: cfg.Store, keys: cfg.Keys, clock: cfg.Clock, log: cfg.Log,
		claimFor: max(time.Minute, 2*cfg.Timeout),
		kick:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		idle:     make(chan struct{}),
	}
	close(w.idle)
	if cfg.Secret != "" {
		key, err := DecodeSecret(cfg.Secret)
		if err != nil {
			// The error never repeats the secret.
			return nil, fmt.Errorf("webhook: the broker's webhook secret: %w", err)
		}
		w.secret = key
	}
	if err := w.instrument(cfg.MeterProvider); err != nil {
		return nil, fmt.Errorf("webhook: metrics: %w", err)
	}
	w.client, w.tr = newClient(cfg.Timeout, cfg.AllowPrivate)
	w.ctx, w.cancel = context.WithCancel(context.Background())
	return w, nil
}

// DecodeSecret returns the signing key of a whsec_ secret.
func DecodeSecret(secret string) ([]byte, error) {
	b64, ok := strings.CutPrefix(secret, SecretPrefix)
	if !ok {
		return nil, fmt.Errorf("a webhook secret starts with %q", SecretPrefix)
	}
	key, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(key) == 0 {
		return nil, fmt.Errorf("a webhook secret is %q and standard base64", SecretPrefix)
	}
	return key, nil
}

// Start runs the worker's loop: it delivers what is due now, then whatever
// falls due, until Close.
func (w *Worker) Start() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started || w.closed {
		return
	}
	w.started = true
	go w.run()
}

// Close stops the loop and the attempts in flight, and waits for them. An
// attempt cut short is not counted: it is made again, with the same attempt
// number, once its claim has lapsed (after a restart, within a minute).
// Close is idempotent.
func (w *Worker) Close() {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.closed = true
	started := w.started
	w.mu.Unlock()
	if started {
		close(w.stop)
		<-w.done
	}
	w.passMu.Lock() // a Flush's poll in progress ends first
	w.cancel()
	w.passMu.Unlock()
	w.wg.Wait()
	w.tr.CloseIdleConnections()
}

// Notify wakes the loop to look for due deliveries now. It never blocks.
func (w *Worker) Notify() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// Flush makes every attempt due now and waits until no attempt is in
// flight, or ctx ends. The loop does the same on its own; Flush is for tests
// and for callers that want the due work done before they go on.
func (w *Worker) Flush(ctx context.Context) error {
	if _, err := w.pass(ctx); err != nil {
		return err
	}
	w.mu.Lock()
	idle := w.idle
	w.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (w *Worker) run() {
	defer close(w.done)
	for {
		wait, err := w.pass(w.ctx)
		if err != nil && w.ctx.Err() == nil {
			w.log.Warn("webhook: look for due deliveries", "err", err)
			wait = w.cfg.PollInterval
		}
		t := w.clock.NewTimer(wait)
		select {
		case <-w.stop:
			t.Stop()
			return
		case <-w.kick:
		case <-t.Chan():
		}
		t.Stop()
	}
}

// pass claims and starts the attempts due now, as many as there are free
// slots, and returns how long the loop may wait before the next pass.
func (w *Worker) pass(ctx context.Context) (time.Duration, error) {
	w.passMu.Lock()
	defer w.passMu.Unlock()
	if w.ctx.Err() != nil {
		return w.cfg.PollInterval, nil
	}
	now := w.clock.Now()
	w.mu.Lock()
	free := w.cfg.Concurrency - w.inflight
	w.mu.Unlock()
	if free > 0 {
		due, err := w.store.DueDeliveries(ctx, now, free)
		if err != nil {
			return 0, err
		}
		for _, d := range due {
			ok, err := w.store.ClaimDelivery(ctx, d.CommandID, d.Attempts, now, now.Add(w.claimFor))
			if err != nil {
				return 0, err
			}
			if ok {
				w.begin()
				go w.attempt(d)
			}
		}
	}
	next, ok, err := w.store.NextDeliveryAt(ctx)
	if err != nil {
		return 0, err
	}
	if !ok {
		return w.cfg.PollInterval, nil
	}
	// Something due but not taken waits for a free slot (a finished attempt
	// wakes the loop) or for whoever took it; a second keeps that from
	// spinning.
	return min(max(next.Sub(now), time.Second), w.cfg.PollInterval), nil
}

func (w *Worker) begin() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.inflight == 0 {
		w.idle = make(chan struct{})
	}
	w.inflight++
	w.wg.Add(1)
}

func (w *Worker) end() {
	w.mu.Lock()
	w.inflight--
	if w.inflight == 0 {
		close(w.idle)
	}
	w.mu.Unlock()
	w.wg.Done()
	w.Notify() // a slot is free, and the next due time may have moved
}

// The outcomes of cheetah.webhook.deliveries.
const (
	OutcomeDelivered = "delivered" // a 2xx answer
	OutcomeRetry     = "retry"     // failed; another attempt is scheduled
	OutcomeFailed    = "failed"    // failed, and that was the last attempt
	OutcomeGaveUp    = "gave_up"   // an answer that is not retried, or nothing to sign with
)

func (w *Worker) instrument(mp metric.MeterProvider) error {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	var err error
	w.attempts, err = mp.Meter("github.com/cheetahbroker/cheetah/server/webhook").Int64Counter("cheetah.webhook.deliveries",
		metric.WithUnit("{attempt}"),
		metric.WithDescription("Webhook delivery attempts by outcome: delivered, retry, failed (no attempt left), gave_up."))
	if err != nil {
		return err
	}
	w.outcomes = map[string]metric.AddOption{}
	for _, o := range []string{OutcomeDelivered, OutcomeRetry, OutcomeFailed, OutcomeGaveUp} {
		w.outcomes[o] = metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", o)))
	}
	return nil
}

// count records one attempt's outcome.
func (w *Worker) count(outcome string) {
	w.attempts.Add(context.Background(), 1, w.outcomes[outcome])
}
