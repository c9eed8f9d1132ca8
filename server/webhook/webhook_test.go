package webhook_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/server/auth"
	"github.com/cheetahbroker/cheetah/server/webhook"
)

// A delivery carries the record as a history read shows it, with the
// Standard Webhooks headers, signed with the sending key's secret.
func TestDeliverySignedRecord(t *testing.T) {
	t.Parallel()
	e := newEnv(t, historytest.NewSQLite(t))
	r := newReceiver(t, http.StatusNoContent)
	id := e.finished(r.URL+"/hook?x=1", e.keyID)
	before, err := e.store.Get(t.Context(), "usr_1", id)
	require.NoError(t, err)

	e.flush()
	h := r.next(t)
	require.Equal(t, "application/json", h.header.Get("Content-Type"))
	require.Equal(t, id, h.header.Get("webhook-id"))
	require.Equal(t, "1", h.header.Get("X-Cheetah-Attempt"))
	require.Equal(t, e.clock.Now().Unix(), mustInt(t, h.header.Get("webhook-timestamp")), "the timestamp is the injected clock's")
	require.True(t, verify(e.secret, h.header, h.body, e.clock.Now()), "the signature verifies")
	require.False(t, verify(e.secret, h.header, append([]byte(" "), h.body...), e.clock.Now()), "and covers the body")
	other, err := e.keys.Create(t.Context(), auth.App, "", "other")
	require.NoError(t, err)
	require.False(t, verify(other.WebhookSecret, h.header, h.body, e.clock.Now()), "another key's secret does not verify it")

	// The body is the record a read returned just before the attempt.
	want, err := json.Marshal(before)
	require.NoError(t, err)
	require.JSONEq(t, string(want), string(h.body))
	var got cheetah.CommandRecord
	require.NoError(t, json.Unmarshal(h.body, &got))
	require.Equal(t, cheetah.StatusCompleted, got.Status)
	require.Len(t, got.Messages, 1)

	require.Equal(t, cheetah.Delivery{URL: r.URL + "/hook?x=1", Attempts: 1, Delivered: true}, e.delivery(id))
	require.False(t, e.pending())
	e.clock.Advance(time.Hour)
	e.flush()
	r.none(t)
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	require.NoError(t, err)
	return n
}

// Attempts at 0, 1, 5 and 10 minutes after the end; then it stops.
func TestRetrySchedule(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, s *history.Store) {
		e := newEnv(t, s)
		r := newReceiver(t, http.StatusServiceUnavailable)
		id := e.finished(r.URL, e.keyID)

		e.flush()
		h := r.next(t)
		require.Equal(t, "1", h.header.Get("X-Cheetah-Attempt"))
		require.Equal(t, cheetah.Delivery{URL: r.URL, Attempts: 1, LastError: "HTTP 503 Service Unavailable"}, e.delivery(id))

		for i, step := range []struct{ wait time.Duration }{{time.Minute}, {4 * time.Minute}, {5 * time.Minute}} {
			attempt := i + 2
			e.clock.Advance(step.wait - time.Second)
			e.flush()
			r.none(t)
			require.Equal(t, attempt-1, e.delivery(id).Attempts, "not before its time")
			e.clock.Advance(time.Second)
			e.flush()
			h := r.next(t)
			require.Equal(t, id, h.header.Get("webhook-id"), "the same id on every attempt")
			require.Equal(t, itoa(attempt), h.header.Get("X-Cheetah-Attempt"))
			require.True(t, verify(e.secret, h.header, h.body, e.clock.Now()))
			require.Equal(t, attempt, e.delivery(id).Attempts)
		}
		require.Equal(t, cheetah.Delivery{URL: r.URL, Attempts: 4, LastError: "HTTP 503 Service Unavailable"}, e.delivery(id))
		require.False(t, e.pending(), "four attempts, then it stops")
		e.clock.Advance(24 * time.Hour)
		e.flush()
		r.none(t)
	})
}

func itoa(n int) string { return strconv.Itoa(n) }

// 429 and 5xx wait for the next attempt; any 2xx delivers.
func TestRetryThenDeliver(t *testing.T) {
	t.Parallel()
	e := newEnv(t, historytest.NewSQLite(t))
	r := newReceiver(t, http.StatusTooManyRequests, http.StatusBadGateway, http.StatusAccepted)
	id := e.finished(r.URL, e.keyID)
	e.flush()
	r.next(t)
	require.Equal(t, cheetah.Delivery{URL: r.URL, Attempts: 1, LastError: "HTTP 429 Too Many Requests"}, e.delivery(id))
	e.clock.Advance(time.Minute)
	e.flush()
	require.Equal(t, "2", r.next(t).header.Get("X-Cheetah-Attempt"))
	require.Equal(t, cheetah.Delivery{URL: r.URL, Attempts: 2, LastError: "HTTP 502 Bad Gateway"}, e.delivery(id))
	e.clock.Advance(4 * time.Minute)
	e.flush()
	require.Equal(t, "3", r.next(t).header.Get("X-Cheetah-Attempt"))
	require.Equal(t, cheetah.Delivery{URL: r.URL, Attempts: 3, Delivered: true}, e.delivery(id))
	require.False(t, e.pending())
}

// Any answer other than 2xx, 429 and 5xx gives up after that attempt.
func TestGiveUp(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code int
		want string
	}{
		{http.StatusBadRequest, "HTTP 400 Bad Request"},
		{http.StatusNotFound, "HTTP 404 Not Found"},
		{http.StatusGone, "HTTP 410 Gone"},
		{http.StatusFound, "HTTP 302 Found"}, // redirects are not followed
	} {
		t.Run(itoa(tc.code), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, historytest.NewSQLite(t))
			r := newReceiver(t, tc.code)
			id := e.finished(r.URL, e.keyID)
			e.flush()
			r.next(t)
			require.Equal(t, cheetah.Delivery{URL: r.URL, Attempts: 1, LastError: tc.want}, e.delivery(id))
			require.False(t, e.pending())
			e.clock.Advance(time.Hour)
			e.flush()
			r.none(t)
		})
	}
}

// An answer that takes longer than the timeout is a failed attempt that
// waits for the next one.
func TestTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t, historytest.NewSQLite(t), func(c *webhook.Config) { c.Timeout = 100 * time.Millisecond })
	release := make(chan struct{})
	srv := newReceiver(t, http.StatusOK)
	slow := srv.Config.Handler
	srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		slow.ServeHTTP(w, r)
	})
	t.Cleanup(func() { close(release) })
	id := e.finished(srv.URL, e.keyID)
	e.flush()
	require.Equal(t, cheetah.Delivery{URL: srv.URL, Attempts: 1, LastError: "no answer within 100ms"}, e.delivery(id))
	require.True(t, e.pending())
}

// Pending deliveries are in the store: a broker that restarts between two
// attempts makes the next one on time, as attempt 2 of the same webhook id.
func TestRestartResumes(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, s *history.Store) {
		e := newEnv(t, s)
		r := newReceiver(t, http.StatusInternalServerError, http.StatusOK)
		id := e.finished(r.URL, e.keyID)
		e.w.Start()
		first := r.next(t) // the loop's first pass makes the attempt due now
		require.Equal(t, "1", first.header.Get("X-Cheetah-Attempt"))
		e.flush() // and its outcome is recorded

		e.restart()
		require.Equal(t, cheetah.Delivery{URL: r.URL, Attempts: 1, LastError: "HTTP 500 Internal Server Error"}, e.delivery(id))
		e.w.Start()
		// The loop sleeps until the next attempt is due, on the clock.
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		require.NoError(t, e.clock.BlockUntilContext(ctx, 1))
		e.clock.Advance(time.Minute)
		second := r.next(t)
		require.Equal(t, "2", second.header.Get("X-Cheetah-Attempt"))
		require.Equal(t, id, second.header.Get("webhook-id"))
		require.Equal(t, first.header.Get("webhook-id"), second.header.Get("webhook-id"))
		require.True(t, verify(e.secret, second.header, second.body, e.clock.Now()))
		e.flush()
		require.Equal(t, cheetah.Delivery{URL: r.URL, Attempts: 2, Delivered: true}, e.delivery(id))
	})
}

// When a command with a callback ends, the worker wakes at once: it does not
// wait for its next poll.
func TestNudge(t *testing.T) {
	t.Parallel()
	e := newEnv(t, historytest.NewSQLite(t), func(c *webhook.Config) { c.PollInterval = time.Hour })
	r := newReceiver(t, http.StatusOK)
	e.w.Start()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, e.clock.BlockUntilContext(ctx, 1), "the loop waits for its poll")

	rec := cheetah.CommandRecord{CommandID: "0193a1b2-0000-7000-8000-000000000001", UserID: "usr_1", ClientID: "c",
		ContextID: "x", TaskID: "t", Epoch: 1, Name: "echo", ResponseMode: cheetah.ModeAsync,
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", CreatedAt: e.clock.Now()}
	require.NoError(t, e.store.Write(ctx, history.InsertCommand{Rec: rec, CallbackURL: r.URL, CallbackKeyID: e.keyID}))
	require.NoError(t, e.store.Write(ctx, history.SetStatus{CommandID: rec.CommandID, Status: cheetah.StatusFailed, At: e.clock.Now()}))
	// What the registry tells its subscribers once the end is durable.
	e.w.Observe(registry.Event{Kind: registry.CommandEnded, UserID: rec.UserID, CommandID: rec.CommandID,
		Status: cheetah.StatusFailed, HasCallback: true, Durable: true})
	h := r.next(t) // the clock never moved
	require.Equal(t, rec.CommandID, h.header.Get("webhook-id"))
	e.flush()
	require.True(t, e.delivery(rec.CommandID).Delivered)
}

// Without AllowPrivate the dialer refuses private and loopback addresses,
// whatever name led there: the address checked is the one connected to.
func TestConnectTimeRefusal(t *testing.T) {
	t.Parallel()
	e := newEnv(t, historytest.NewSQLite(t), func(c *webhook.Config) { c.AllowPrivate = false })
	r := newReceiver(t, http.StatusOK)
	port := r.URL[strings.LastIndex(r.URL, ":")+1:]
	// Accepted by a broker that allowed private destinations, delivered by
	// one that does not: the name resolves to a loopback address.
	byName := e.finished("http://localhost:"+port+"/hook", e.keyID)
	byIP := e.finished(r.URL+"/hook", e.keyID)
	e.flush()
	r.none(t)
	for _, id := range []string{byName, byIP} {
		d := e.delivery(id)
		require.Equal(t, 1, d.Attempts)
		require.False(t, d.Delivered)
		require.Contains(t, d.LastError, "loopback address")
		require.Contains(t, d.LastError, "--webhook-allow-private")
		require.NotContains(t, d.LastError, "/hook", "the URL is not repeated")
	}
	require.True(t, e.pending(), "a refused connection is a network error: it waits for the next attempt")
}

// A delivery that cannot be signed is given up without a request.
func TestNoSecretGivesUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t, historytest.NewSQLite(t))
	r := newReceiver(t, http.StatusOK)
	client, err := e.keys.Create(t.Context(), auth.Client, "usr_1", "client")
	require.NoError(t, err)
	noKey := e.finished(r.URL, "")            // in process, but the broker has no secret
	clientKey := e.finished(r.URL, client.ID) // a key without a secret
	gone := e.finished(r.URL, "deadbeef0000")
	e.flush()
	r.none(t)
	require.Contains(t, e.delivery(noKey).LastError, "no webhook secret")
	require.Contains(t, e.delivery(clientKey).LastError, "no webhook secret")
	require.Contains(t, e.delivery(gone).LastError, "is gone")
	require.False(t, e.pending())
}

// In-process sends are signed with the broker's own secret.
func TestBrokerSecret(t *testing.T) {
	t.Parallel()
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	e := newEnv(t, historytest.NewSQLite(t), func(c *webhook.Config) { c.Secret = secret })
	r := newReceiver(t, http.StatusOK)
	e.finished(r.URL, "")
	e.flush()
	h := r.next(t)
	require.True(t, verify(secret, h.header, h.body, e.clock.Now()))
	require.False(t, verify(e.secret, h.header, h.body, e.clock.Now()))

	_, err := webhook.New(webhook.Config{Store: e.store, Keys: e.keys, Secret: "not-a-secret"})
	require.Error(t, err)
	require.NotContains(t, err.Error(), "not-a-secret", "the secret is never repeated")
	_, err = webhook.New(webhook.Config{Store: e.store, Keys: e.keys, Secret: "whsec_!!!"})
	require.Error(t, err)
}

// Sign is the Standard Webhooks scheme, checked against the specification's
// own example.
func TestSignSpecExample(t *testing.T) {
	t.Parallel()
	key, err := webhook.DecodeSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	require.NoError(t, err)
	got := webhook.Sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, []byte(`{"test": 2432232314}`))
	require.Equal(t, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", got)
}

func TestCheck(t *testing.T) {
	t.Parallel()
	store := historytest.NewSQLite(t)
	keys := auth.New(store, "the-bootstrap-admin-key", time.Now)
	app, err := keys.Create(t.Context(), auth.App, "", "app")
	require.NoError(t, err)
	client, err := keys.Create(t.Context(), auth.Client, "usr_1", "client")
	require.NoError(t, err)
	strict, err := webhook.New(webhook.Config{Store: store, Keys: keys})
	require.NoError(t, err)
	t.Cleanup(strict.Close)
	lax, err := webhook.New(webhook.Config{Store: store, Keys: keys, AllowPrivate: true, Secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"})
	require.NoError(t, err)
	t.Cleanup(lax.Close)

	for _, u := range []string{
		"https://hooks.example.com/cheetah", "https://hooks.example.com:8443/x?y=1", "https://93.184.216.34/",
		"https://[2606:2800:220:1:248:1893:25c8:1946]/", "https://user:pass@hooks.example.com/",
	} {
		require.NoError(t, strict.CheckURL(u), u)
		require.NoError(t, lax.CheckURL(u), u)
	}
	for _, u := range []string{
		"https://127.0.0.1/", "https://127.9.9.9:8443/", "https://[::1]/", "https://localhost/x", "https://LocalHost./",
		"https://api.localhost/", "https://10.1.2.3/", "https://172.16.0.1/", "https://192.168.1.1/",
		"https://169.254.169.254/latest/meta-data", "https://[fe80::1%25eth0]/", "https://0.0.0.0/", "https://[::]/",
		"https://224.0.0.1/", "https://[ff02::1]/", "https://100.64.0.1/", "https://[fd00::1]/", "https://[::ffff:127.0.0.1]/",
		"https://255.255.255.255/",
	} {
		err := strict.CheckURL(u)
		require.ErrorIs(t, err, cheetah.ErrInvalidRequest, u)
		require.Contains(t, err.Error(), "--webhook-allow-private", u)
		require.NoError(t, lax.CheckURL(u), u)
	}
	for _, u := range []string{"http://hooks.example.com/", "http://127.0.0.1:9000/"} {
		require.ErrorIs(t, strict.CheckURL(u), cheetah.ErrInvalidRequest, "http needs --webhook-allow-private: %s", u)
		require.NoError(t, lax.CheckURL(u), u)
	}
	for _, u := range []string{"ftp://hooks.example.com/", "/relative", "hooks.example.com", "https://", "https:///x",
		"mailto:a@example.com", "https://exa mple.com/", "https://" + strings.Repeat("a", webhook.MaxURLLen) + ".com/"} {
		require.ErrorIs(t, strict.CheckURL(u), cheetah.ErrInvalidRequest, u)
		require.ErrorIs(t, lax.CheckURL(u), cheetah.ErrInvalidRequest, u)
	}

	ctx := t.Context()
	so := func(mode cheetah.ResponseMode, keyID string) cheetah.SendOptions {
		return cheetah.SendOptions{CallbackURL: "https://hooks.example.com/", ResponseMode: mode, CallbackKeyID: keyID}
	}
	require.NoError(t, strict.Check(ctx, cheetah.SendOptions{ResponseMode: cheetah.ModeNone}), "no callback, nothing to check")
	require.NoError(t, strict.Check(ctx, so(cheetah.ModeAsync, app.ID)))
	require.NoError(t, strict.Check(ctx, so(cheetah.ModeRPC, app.ID)))
	err = strict.Check(ctx, so(cheetah.ModeNone, app.ID))
	require.ErrorIs(t, err, cheetah.ErrInvalidRequest)
	require.Contains(t, err.Error(), "never ends")
	err = strict.Check(ctx, so(cheetah.ModeAsync, auth.BootstrapID))
	require.ErrorIs(t, err, cheetah.ErrInvalidRequest)
	require.Contains(t, err.Error(), "bootstrap admin key")
	require.ErrorIs(t, strict.Check(ctx, so(cheetah.ModeAsync, client.ID)), cheetah.ErrInvalidRequest)
	require.ErrorIs(t, strict.Check(ctx, so(cheetah.ModeAsync, "deadbeef0000")), cheetah.ErrInvalidRequest)
	err = strict.Check(ctx, so(cheetah.ModeAsync, ""))
	require.ErrorIs(t, err, cheetah.ErrInvalidRequest, "in process, without a broker secret")
	require.Contains(t, err.Error(), "WebhookSecret")
	require.NoError(t, lax.Check(ctx, so(cheetah.ModeAsync, "")), "in process, with one")
}
