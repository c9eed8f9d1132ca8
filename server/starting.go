package server

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
)

// Starting is the HTTP handler of a broker that is still opening its store,
// so that `cheetah serve` can listen at once, whether the database answers
// or not. Until Ready gives it the broker's handler, /healthz (liveness)
// answers 200 and every other route, /readyz and the API included, 503
// store_unavailable; /metrics is served when a handler for it is given.
// Then it passes every request to the broker's handler.
type Starting struct {
	next    atomic.Pointer[http.Handler]
	metrics http.Handler
}

// NewStarting returns a Starting; metrics, if not nil, serves /metrics
// meanwhile.
func NewStarting(metrics http.Handler) *Starting { return &Starting{metrics: metrics} }

// Ready makes s pass every request to h from now on.
func (s *Starting) Ready(h http.Handler) { s.next.Store(&h) }

func (s *Starting) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h := s.next.Load(); h != nil {
		(*h).ServeHTTP(w, r)
		return
	}
	w.Header().Set(HeaderRequestID, requestID(r.Header.Get(HeaderRequestID)))
	switch {
	case r.URL.Path == "/healthz":
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	case r.URL.Path == "/metrics" && s.metrics != nil:
		s.metrics.ServeHTTP(w, r)
	default:
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, cheetah.Envelope{Error: &cheetah.EnvelopeError{
			Code: cheetah.CodeStoreUnavailable, Message: "the broker is starting: its store is not open yet"}})
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Retry paces OpenRetry: the first wait is Min, each next one twice the
// last, up to Max, each with ±20% jitter (so that brokers that lost their
// database together do not return to it in step).
type Retry struct {
	Min, Max time.Duration
}

// DefaultRetry is what `cheetah serve` uses: 0.5 s doubling to 10 s.
var DefaultRetry = Retry{Min: 500 * time.Millisecond, Max: 10 * time.Second}

// OpenRetry is Open for a broker that must come up by itself once its
// database does: while Open fails because the store is unavailable (the
// database does not answer, refuses connections, or does not exist yet),
// it logs the attempt on o.Log (its number, when the next one is, the error
// without the URL's password) and tries again. It returns Open's first
// other error, or ctx's error once ctx ends.
func OpenRetry(ctx context.Context, o Options, p Retry) (*Broker, error) {
	if p.Min <= 0 {
		p.Min = DefaultRetry.Min
	}
	p.Max = max(p.Max, p.Min)
	wait := p.Min
	for attempt := 1; ; attempt++ {
		b, err := Open(ctx, o)
		if err == nil {
			if attempt > 1 && o.Log != nil {
				o.Log.Info("store open", "attempt", attempt, "database", redactURL(o.DatabaseURL))
			}
			return b, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if !errors.Is(err, cheetah.ErrStoreUnavailable) {
			return nil, err
		}
		next := time.Duration(float64(wait) * (0.8 + 0.4*rand.Float64()))
		if o.Log != nil {
			o.Log.Warn("store not available; serving 503 until it is, trying again",
				"attempt", attempt, "next_try_in", next.Round(time.Millisecond).String(),
				"database", redactURL(o.DatabaseURL), "err", redactErr(err, o.DatabaseURL))
		}
		t := time.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, p.Max)
	}
}

// redactURL is the database URL without its password ("" for the embedded
// SQLite file).
func redactURL(u string) string {
	if u == "" {
		return "sqlite (data dir)"
	}
	p, err := url.Parse(u)
	if err != nil {
		scheme, _, _ := strings.Cut(u, ":")
		return scheme + "://…"
	}
	return p.Redacted()
}

// redactErr is err's text with the database URL's password, if it has one,
// taken out (a driver may repeat the connection string).
func redactErr(err error, dbURL string) string {
	s := err.Error()
	p, perr := url.Parse(dbURL)
	if perr != nil || p.User == nil {
		return s
	}
	pw, ok := p.User.Password()
	if !ok || pw == "" {
		return s
	}
	s = strings.ReplaceAll(s, dbURL, p.Redacted())
	s = strings.ReplaceAll(s, pw, "xxxxx")
	if esc := url.QueryEscape(pw); esc != pw {
		s = strings.ReplaceAll(s, esc, "xxxxx")
	}
	return s
}
