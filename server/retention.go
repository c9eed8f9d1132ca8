package server

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/cheetahbroker/cheetah/history"
)

// DefaultRetentionInterval is how often the broker deletes the history past
// its retention.
const DefaultRetentionInterval = time.Hour

// RetentionConfig configures a Retention.
type RetentionConfig struct {
	Store *history.Store
	// Keep is how long finished commands are kept (by creation time); 0 or
	// less keeps them all, and the Retention does nothing.
	Keep time.Duration
	// Interval is the time between passes (DefaultRetentionInterval).
	Interval time.Duration
	Clock    clockwork.Clock
	Log      *slog.Logger
}

// Retention is history retention: it deletes the finished commands created
// more than Keep ago, with their messages, once at Start and then every
// Interval. Open starts one for the broker (Options.HistoryRetention), and
// the broker's Close stops it.
type Retention struct {
	cfg    RetentionConfig
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	started bool
	closed  bool
	done    chan struct{}
}

// NewRetention makes a Retention; Start starts it.
func NewRetention(cfg RetentionConfig) *Retention {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultRetentionInterval
	}
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Retention{cfg: cfg, ctx: ctx, cancel: cancel, done: make(chan struct{})}
}

// Start runs a pass at once, on a goroutine of its own, and then one every
// Interval until Close. With Keep 0 it does nothing. Start after Close, or
// a second time, does nothing.
func (r *Retention) Start() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started || r.closed || r.cfg.Keep <= 0 {
		return
	}
	r.started = true
	// The ticker is made here rather than on the goroutine, so that a test
	// advancing a fake clock after Start cannot pass it by.
	t := r.cfg.Clock.NewTicker(r.cfg.Interval)
	go r.run(t)
}

func (r *Retention) run(t clockwork.Ticker) {
	defer close(r.done)
	defer t.Stop()
	for {
		_, _ = r.Purge(r.ctx)
		select {
		case <-r.ctx.Done():
			return
		case <-t.Chan():
		}
	}
}

// Purge runs one pass now: it deletes the finished commands created before
// the clock's now less Keep, and logs what it did. It returns how many it
// deleted.
func (r *Retention) Purge(ctx context.Context) (int64, error) {
	if r.cfg.Keep <= 0 {
		return 0, nil
	}
	before := r.cfg.Clock.Now().Add(-r.cfg.Keep)
	n, err := r.cfg.Store.PurgeBefore(ctx, before)
	switch {
	case err != nil && ctx.Err() != nil:
		// Stopped midway: not worth a warning.
	case err != nil:
		r.cfg.Log.Warn("history retention failed; the next pass tries again", "err", err, "next_in", r.cfg.Interval.String())
	case n > 0:
		r.cfg.Log.Info("history retention removed commands", "count", n, "created_before", before.UTC().Format(time.RFC3339))
	default:
		r.cfg.Log.Debug("history retention removed nothing", "created_before", before.UTC().Format(time.RFC3339))
	}
	return n, err
}

// Close stops the loop, cutting a pass in progress short, and waits for it.
// It is idempotent.
func (r *Retention) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	started := r.started
	r.mu.Unlock()
	r.cancel()
	if started {
		<-r.done
	}
}
