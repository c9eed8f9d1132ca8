// Package remote is the Go SDK over a broker's HTTP API: the same
// cheetah.Manager and cheetah.Handle as in process, the same records and the
// same typed errors, for an application that does not embed the broker.
//
//	mgr := remote.New("https://cheetah.example.com", appKey)
//	h, err := mgr.Acquire(ctx, cheetah.AcquireRequest{UserID: u, TaskID: "t-1", ClientType: cheetah.Console})
//
// Errors the broker answers come back as the types an in-process caller
// gets: errors.Is(err, cheetah.ErrNoContextAvailable), errors.As into a
// *cheetah.LeaseLostError or *cheetah.NoContextError for the reason, and
// *cheetah.Error with the code for the rest. A 429 answer is a
// *RateLimitedError that wraps the cheetah error and carries Retry-After. A
// request that never got an answer (the network, or the caller's context)
// is neither: it wraps its cause, so errors.Is(err, context.Canceled) works.
//
// Nothing is retried: a command is not idempotent, and whether a send that
// got no answer was admitted cannot be told from here.
package remote

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	cheetah "github.com/cheetahbroker/cheetah"
)

// DefaultUserAgent is sent unless WithUserAgent says otherwise.
const DefaultUserAgent = "cheetah-remote/1"

// maxErrorBody bounds how much of an error answer is read: an envelope is
// small, and a proxy's error page need not be read whole.
const maxErrorBody = 64 << 10

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the Client send its requests through hc. The default
// is a client with no overall timeout, because acquires with a wait and
// send-and-wait calls are long by design: the context of each call bounds
// it. A client given here should not set Timeout either, for the same
// reason.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) {
		if hc != nil {
			c.hc = hc
		}
	}
}

// WithTLSConfig makes the Client connect to an https:// broker with tc,
// such as one whose RootCAs trust a private CA or a self-signed
// certificate. It replaces the HTTP client with one whose transport is
// http.DefaultTransport's settings (proxies from the environment, HTTP/2)
// with tc; give WithHTTPClient instead for more control. The later of the
// two options wins.
func WithTLSConfig(tc *tls.Config) Option {
	return func(c *Client) {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.TLSClientConfig = tc.Clone()
		c.hc = &http.Client{Transport: t}
	}
}

// WithUserAgent sets the User-Agent header of every request.
func WithUserAgent(ua string) Option { return func(c *Client) { c.ua = ua } }

// WithTracerProvider makes the Manager's spans (one per SDK call) with tp;
// the default is otel's global provider. Whatever the provider, every
// request carries the W3C traceparent of the caller's context, so the
// broker's spans of a command continue the caller's trace.
func WithTracerProvider(tp trace.TracerProvider) Option { return func(c *Client) { c.tp = tp } }

// propagator writes the trace context into requests: W3C Trace Context
// (traceparent, tracestate) and Baggage, whatever otel's global propagator
// is.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Client sends requests to a broker's HTTP API with a bearer key. It is the
// low-level half of the package, exported for tools (the admin CLI) that
// call endpoints the Manager does not cover. It is safe for concurrent use.
type Client struct {
	base string // without a trailing slash
	key  string
	hc   *http.Client
	ua   string
	tp   trace.TracerProvider
}

// NewClient returns a client of the broker at baseURL (such as
// "http://127.0.0.1:8420", or one with a path prefix behind a proxy) that
// authenticates with key. It checks nothing; a bad URL fails each request.
func NewClient(baseURL, key string, opts ...Option) *Client {
	c := &Client{base: strings.TrimRight(baseURL, "/"), key: key, hc: &http.Client{}, ua: DefaultUserAgent}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Do sends one request and decodes a 2xx answer's JSON body into out (when
// out is not nil). path is the escaped path and query, such as
// "/api/v1/users/usr_1/commands?limit=10". body, when not nil, is sent as
// JSON; a json.RawMessage or []byte is sent as it is. headers are name,
// value pairs added to the request (X-Lease, X-Callback-Url).
//
// A non-2xx answer in the API's error envelope is returned as
// cheetah.FromCode rebuilds it (a *RateLimitedError around it for 429); one
// that is not in the envelope (a proxy's page) is a *StatusError. A request
// that got no answer returns an error wrapping the cause. A refusal (4xx)
// whose body was cut on the way is sent once more: the broker acted on
// nothing, and its second answer says why.
func (c *Client) Do(ctx context.Context, method, path string, body any, out any, headers ...string) error {
	resp, err := c.send(ctx, method, path, body, headers)
	if err != nil {
		return err
	}
	if resp.StatusCode >= 400 && resp.StatusCode < 500 {
		// A refusal the broker acted on nothing for, whose body was cut on
		// the way (a proxy, a replica between): asked again once, it is
		// refused again, and says why.
		raw, rerr := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		_ = resp.Body.Close()
		if rerr == nil || ctx.Err() != nil {
			return errorOf(resp, raw)
		}
		if resp, err = c.send(ctx, method, path, body, headers); err != nil {
			return err
		}
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return decodeError(resp)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body) // lets the connection be reused
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("remote: %s %s: decode the answer: %w", method, path, err)
	}
	return nil
}

func (c *Client) send(ctx context.Context, method, path string, body any, headers []string) (*http.Response, error) {
	if len(headers)%2 != 0 {
		return nil, fmt.Errorf("remote: %s %s: headers must be name, value pairs", method, path)
	}
	var rd io.Reader
	if body != nil {
		var b []byte
		switch v := body.(type) {
		case json.RawMessage:
			b = v
		case []byte:
			b = v
		default:
			var err error
			if b, err = json.Marshal(v); err != nil {
				return nil, fmt.Errorf("remote: %s %s: encode the body: %w", method, path, err)
			}
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, fmt.Errorf("remote: %s %s: %w", method, path, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.ua != "" {
		req.Header.Set("User-Agent", c.ua)
	}
	for i := 0; i < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	propagator.Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := c.hc.Do(req)
	if err != nil {
		// *url.Error names the URL (never the key, which is a header) and
		// unwraps to the cause, such as context.Canceled.
		return nil, fmt.Errorf("remote: %w", err)
	}
	return resp, nil
}

func decodeError(resp *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	return errorOf(resp, raw)
}

// errorOf is the error of a non-2xx answer whose body is raw.
func errorOf(resp *http.Response, raw []byte) error {
	var env cheetah.Envelope
	var err error
	if json.Unmarshal(raw, &env) == nil {
		err = env.Err()
	}
	if err == nil {
		err = &StatusError{StatusCode: resp.StatusCode, Body: strings.TrimSpace(string(raw))}
	}
	if resp.StatusCode == http.StatusTooManyRequests {
		d, _ := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
		return &RateLimitedError{RetryAfter: d, Err: err}
	}
	return err
}

// StatusError is a non-2xx answer that is not in the API's error envelope,
// such as a proxy's error page. It is not a *cheetah.Error: the broker did
// not say it.
type StatusError struct {
	StatusCode int
	// Body is the start of the answer, for diagnosis.
	Body string
}

// Error names the status and the start of the answer.
func (e *StatusError) Error() string {
	msg := fmt.Sprintf("remote: HTTP %d %s", e.StatusCode, http.StatusText(e.StatusCode))
	if e.Body != "" {
		b := e.Body
		if len(b) > 200 {
			b = b[:200] + "…"
		}
		msg += ": " + b
	}
	return msg
}

// RateLimitedError is a 429 answer. It wraps the error the broker sent
// (errors.Is(err, cheetah.ErrRateLimited) holds) and says how long the
// broker asked the caller to wait.
type RateLimitedError struct {
	// RetryAfter is the answer's Retry-After, zero when it had none.
	RetryAfter time.Duration
	Err        error
}

// Error is the broker's error, with the delay it asked for.
func (e *RateLimitedError) Error() string {
	if e.RetryAfter > 0 {
		return fmt.Sprintf("%v (retry after %s)", e.Err, e.RetryAfter)
	}
	return e.Err.Error()
}

// Unwrap returns the broker's error, so errors.Is(err,
// cheetah.ErrRateLimited) holds.
func (e *RateLimitedError) Unwrap() error { return e.Err }

// RetryAfter returns how long a rate-limited caller should wait before it
// tries again (zero when the answer named no delay), and false when err is
// not a 429 answer.
func RetryAfter(err error) (time.Duration, bool) {
	var rl *RateLimitedError
	if errors.As(err, &rl) {
		return rl.RetryAfter, true
	}
	return 0, false
}

// parseRetryAfter reads delay-seconds or an HTTP date (RFC 9110 §10.2.3).
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0, false
		}
		return time.Duration(min(n, int64(24*time.Hour/time.Second))) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}
