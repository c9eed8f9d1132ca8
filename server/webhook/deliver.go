package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history"
)

// The headers of a delivery.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
	HeaderAttempt   = "X-Cheetah-Attempt"
)

// Sign returns the webhook-signature value of one delivery: "v1," and the
// base64 HMAC-SHA256 of "<id>.<timestamp>.<body>" keyed with key.
func Sign(key []byte, id string, timestamp int64, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write(strconv.AppendInt(nil, timestamp, 10))
	m.Write([]byte{'.'})
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// errNoSecret means a delivery cannot be signed, so it is given up.
var errNoSecret = errors.New("no webhook secret")

// outcome is what one attempt came to.
type outcome int

const (
	delivered outcome = iota
	retry             // a network error, a timeout, 429 or 5xx
	giveUp            // any other answer
)

// attempt makes one attempt of a claimed delivery and records how it went.
func (w *Worker) attempt(d history.PendingDelivery) {
	defer w.end()
	ctx := w.ctx
	n := d.Attempts + 1
	log := w.log.With("command_id", d.CommandID, "attempt", n)
	rec, err := w.store.Get(ctx, d.UserID, d.CommandID)
	if errors.Is(err, cheetah.ErrNotFound) {
		return // deleted meanwhile (history retention): nothing to deliver
	}
	if err != nil {
		// Not counted: the claim lapses and the attempt is made again.
		if ctx.Err() == nil {
			log.Warn("webhook: read the command", "err", err)
		}
		return
	}
	st := history.SetDelivery{CommandID: d.CommandID, Attempts: d.Attempts}
	key, err := w.signingKey(ctx, d.KeyID)
	if errors.Is(err, errNoSecret) {
		log.Warn("webhook: delivery given up", "reason", err.Error())
		w.count(OutcomeGaveUp)
		st.LastError = err.Error()
		w.record(ctx, log, st)
		return
	}
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("webhook: read the signing key", "err", err)
		}
		return
	}
	body, err := json.Marshal(rec)
	if err != nil {
		log.Error("webhook: encode the record", "err", err)
		return
	}
	res, detail := w.post(ctx, d, n, key, body)
	if ctx.Err() != nil {
		return // shutting down: not counted, made again after the restart
	}
	st.Attempts = n
	switch res {
	case delivered:
		st.Delivered = true
		w.count(OutcomeDelivered)
		log.Debug("webhook: delivered")
	case retry:
		st.LastError = detail
		if n < MaxAttempts {
			now := w.clock.Now()
			st.NextAt = nextAttempt(d.FinishedAt, n, now)
			w.count(OutcomeRetry)
			log.Info("webhook: attempt failed, will retry", "error", detail, "next_at", st.NextAt)
		} else {
			w.count(OutcomeFailed)
			log.Warn("webhook: delivery failed, no attempts left", "error", detail)
		}
	case giveUp:
		st.LastError = detail
		w.count(OutcomeGaveUp)
		log.Warn("webhook: delivery given up", "error", detail)
	}
	w.record(ctx, log, st)
}

// nextAttempt returns when attempt done+1 is due: on the schedule counted
// from the command's end, but never sooner than a minute after now, so that
// attempts that fell behind (the broker was down) do not come in a burst.
func nextAttempt(finished time.Time, done int, now time.Time) time.Time {
	if finished.IsZero() {
		finished = now
	}
	return maxTime(finished.Add(Schedule[done]), now.Add(time.Minute))
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// record writes a delivery's state, even while shutting down: the attempt
// was made.
func (w *Worker) record(ctx context.Context, log interface{ Warn(string, ...any) }, st history.SetDelivery) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := w.store.Write(wctx, st); err != nil {
		// The claim lapses and the attempt is made again.
		log.Warn("webhook: record the delivery", "err", err)
	}
}

// signingKey returns the key that signs a command's delivery.
func (w *Worker) signingKey(ctx context.Context, keyID string) ([]byte, error) {
	if keyID == "" {
		if w.secret == nil {
			return nil, fmt.Errorf("%w: the broker has none for in-process sends", errNoSecret)
		}
		return w.secret, nil
	}
	secret, err := w.keys.WebhookSecret(ctx, keyID)
	switch {
	case errors.Is(err, cheetah.ErrUnauthorized), errors.Is(err, cheetah.ErrNotFound):
		return nil, fmt.Errorf("%w: the key %s that sent the command is gone", errNoSecret, keyID)
	case err != nil:
		return nil, err
	case secret == "":
		return nil, fmt.Errorf("%w: the key %s has none", errNoSecret, keyID)
	}
	key, err := DecodeSecret(secret)
	if err != nil {
		return nil, fmt.Errorf("%w: the key %s: %v", errNoSecret, keyID, err)
	}
	return key, nil
}

// post sends one attempt and classifies the answer; detail says what went
// wrong, for last_error.
func (w *Worker) post(ctx context.Context, d history.PendingDelivery, n int, key, body []byte) (outcome, string) {
	actx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, d.URL, bytes.NewReader(body))
	if err != nil {
		return giveUp, "invalid callback URL"
	}
	ts := w.clock.Now().Unix()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "Cheetah-Webhook/1")
	req.Header.Set(HeaderID, d.CommandID)
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
	req.Header.Set(HeaderSignature, Sign(key, d.CommandID, ts, body))
	req.Header.Set(HeaderAttempt, strconv.Itoa(n))
	resp, err := w.client.Do(req)
	if err != nil {
		var ne net.Error
		if ctx.Err() == nil && (errors.Is(actx.Err(), context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()) {
			return retry, fmt.Sprintf("no answer within %s", w.cfg.Timeout)
		}
		// The URL is the caller's own, but it may carry credentials, and
		// the record already shows it: only the cause is kept.
		return retry, deliveryError(err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	switch code := resp.StatusCode; {
	case code >= 200 && code < 300:
		return delivered, ""
	case code == http.StatusTooManyRequests || code >= 500:
		return retry, "HTTP " + resp.Status
	default:
		return giveUp, "HTTP " + resp.Status
	}
}

// newClient returns the HTTP client of the deliveries: no proxy (a proxy
// would connect on the broker's behalf, past the address check), no
// redirects (a 3xx is an answer like any other), and, unless private
// destinations are allowed, a dialer that refuses every address that is not
// public, checked on the address actually dialled.
func newClient(timeout time.Duration, allowPrivate bool) (*http.Client, *http.Transport) {
	dialer := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	if !allowPrivate {
		dialer.Control = refuseNonPublic
	}
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         dialer.DialContext,
		ForceAttemptHTTP2:   true,
		TLSHandshakeTimeout: timeout,
		MaxIdleConns:        64,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
	}
	client := &http.Client{
		Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	return client, tr
}

// refuseNonPublic is the dialer's Control hook: it runs with the resolved
// address just before the socket connects.
func refuseNonPublic(network, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("webhook: refused %s: %w", address, err)
	}
	if why := nonPublicIP(host); why != "" {
		return &refusedError{fmt.Sprintf("refused: %s is %s address (the broker runs without --webhook-allow-private)", host, why)}
	}
	return nil
}

// refusedError is the dialer's refusal of a destination that is not public.
type refusedError struct{ msg string }

func (e *refusedError) Error() string { return e.msg }

// deliveryError says for last_error why an attempt got no answer, in words
// that name nothing of the broker's own network: never its resolver's
// address, its local address, or the URL (which may carry credentials, and
// which the record shows already).
func deliveryError(err error) string {
	var (
		refused *refusedError
		dns     *net.DNSError
		errno   syscall.Errno
		x509err interface{ Error() string }
	)
	switch {
	case errors.As(err, &refused):
		return refused.msg
	case errors.As(err, &dns):
		switch {
		case dns.IsNotFound:
			return "could not resolve host: no such host"
		case dns.IsTimeout:
			return "could not resolve host: the lookup timed out"
		}
		return "could not resolve host"
	case errors.As(err, &errno):
		return "could not connect: " + errno.Error()
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "the connection closed before an answer"
	case tlsError(err, &x509err):
		return "TLS: " + x509err.Error()
	}
	return "could not connect"
}

// tlsError finds a certificate or TLS error in err; their text names the
// destination's certificate, nothing of the broker.
func tlsError(err error, out *interface{ Error() string }) bool {
	var (
		unknown  x509.UnknownAuthorityError
		invalid  x509.CertificateInvalidError
		hostname x509.HostnameError
		verify   *tls.CertificateVerificationError
		alert    tls.AlertError
		record   tls.RecordHeaderError
	)
	switch {
	case errors.As(err, &unknown):
		*out = unknown
	case errors.As(err, &invalid):
		*out = invalid
	case errors.As(err, &hostname):
		*out = hostname
	case errors.As(err, &verify):
		*out = verify.Err
	case errors.As(err, &alert):
		*out = alert
	case errors.As(err, &record):
		*out = errors.New("the destination does not speak TLS")
	default:
		return false
	}
	return true
}
