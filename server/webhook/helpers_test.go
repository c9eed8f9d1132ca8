package webhook_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/server/auth"
	"github.com/cheetahbroker/cheetah/server/webhook"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// hit is one request a receiver got.
type hit struct {
	header http.Header
	body   []byte
}

// receiver is a webhook endpoint on 127.0.0.1 that answers with codes in
// turn (the last one repeats) and records every request.
type receiver struct {
	*httptest.Server
	hits chan hit

	mu    sync.Mutex
	codes []int
}

func newReceiver(t *testing.T, codes ...int) *receiver {
	t.Helper()
	r := &receiver{hits: make(chan hit, 64), codes: codes}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.hits <- hit{header: req.Header.Clone(), body: body}
		r.mu.Lock()
		code := r.codes[0]
		if len(r.codes) > 1 {
			r.codes = r.codes[1:]
		}
		r.mu.Unlock()
		if code >= 300 && code < 400 {
			w.Header().Set("Location", "https://example.com/elsewhere")
		}
		w.WriteHeader(code)
	}))
	t.Cleanup(r.Close)
	return r
}

// next returns the next request, failing after a bounded wait.
func (r *receiver) next(t *testing.T) hit {
	t.Helper()
	select {
	case h := <-r.hits:
		return h
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery arrived")
		return hit{}
	}
}

// none asserts that no request arrived. After a Flush every attempt made
// has been answered, so there is nothing to wait for.
func (r *receiver) none(t *testing.T) {
	t.Helper()
	select {
	case h := <-r.hits:
		t.Fatalf("unexpected delivery, attempt %s", h.header.Get(webhook.HeaderAttempt))
	default:
	}
}

// env is a store, keys with one app key, a fake clock and a worker.
type env struct {
	t      *testing.T
	store  *history.Store
	keys   *auth.Keys
	clock  *clockwork.FakeClock
	keyID  string // the app key's id
	secret string // its whsec_ secret
	w      *webhook.Worker
	cfg    webhook.Config
}

func newEnv(t *testing.T, store *history.Store, tweak ...func(*webhook.Config)) *env {
	t.Helper()
	e := &env{t: t, store: store, clock: clockwork.NewFakeClock()}
	e.keys = auth.New(store, "", time.Now)
	k, err := e.keys.Create(t.Context(), auth.App, "", "app")
	require.NoError(t, err)
	e.keyID, e.secret = k.ID, k.WebhookSecret
	e.cfg = webhook.Config{Store: store, Keys: e.keys, AllowPrivate: true, Clock: e.clock}
	for _, f := range tweak {
		f(&e.cfg)
	}
	e.w = e.newWorker()
	return e
}

func (e *env) newWorker() *webhook.Worker {
	e.t.Helper()
	cfg := e.cfg
	cfg.Store, cfg.Keys = e.store, e.keys
	w, err := webhook.New(cfg)
	require.NoError(e.t, err)
	e.t.Cleanup(w.Close)
	return w
}

// restart closes the worker and the store, and opens both again on the same
// database, as a restarted broker would; the clock goes on.
func (e *env) restart() {
	e.t.Helper()
	e.w.Close()
	e.store = historytest.Reopen(e.t, e.store)
	e.keys = auth.New(e.store, "", time.Now)
	e.w = e.newWorker()
}

// finished records a command that was sent with a callback and has just
// ended, as the registry would, and returns its id.
func (e *env) finished(url, keyID string) string {
	e.t.Helper()
	rec := cheetah.CommandRecord{
		CommandID: uuid.Must(uuid.NewV7()).String(), UserID: "usr_1", ClientID: "agent", ContextID: "flow-1",
		TaskID: "task-1", Epoch: 7, Name: "echo", Params: json.RawMessage(`{"hi":1}`),
		ResponseMode: cheetah.ModeAsync, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", CreatedAt: e.clock.Now(),
	}
	require.NoError(e.t, e.store.Write(e.t.Context(),
		history.InsertCommand{Rec: rec, CallbackURL: url, CallbackKeyID: keyID},
		history.AppendMessage{CommandID: rec.CommandID, Msg: cheetah.Message{Kind: cheetah.KindResult, Data: json.RawMessage(`{"hi":1}`), At: e.clock.Now()}},
		history.SetStatus{CommandID: rec.CommandID, Status: cheetah.StatusCompleted, At: e.clock.Now()}))
	return rec.CommandID
}

func (e *env) flush() {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 30*time.Second)
	defer cancel()
	require.NoError(e.t, e.w.Flush(ctx))
}

func (e *env) delivery(id string) cheetah.Delivery {
	e.t.Helper()
	rec, err := e.store.Get(e.t.Context(), "usr_1", id)
	require.NoError(e.t, err)
	require.NotNil(e.t, rec.Delivery)
	return *rec.Delivery
}

func (e *env) pending() bool {
	e.t.Helper()
	_, ok, err := e.store.NextDeliveryAt(e.t.Context())
	require.NoError(e.t, err)
	return ok
}

// verify checks a delivery the way a receiver does, written from the
// Standard Webhooks specification rather than with the broker's code: the
// signed content is "<webhook-id>.<webhook-timestamp>.<body>", the key is
// the base64 text after "whsec_", webhook-signature is a space-separated
// list of "<version>,<base64 signature>" of which one "v1" must match, and
// the timestamp must be within five minutes of the receiver's clock.
func verify(secret string, h http.Header, body []byte, now time.Time) bool {
	id, ts, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return false
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || now.Sub(time.Unix(sec, 0)).Abs() > 5*time.Minute {
		return false
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return false
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "." + string(body)))
	want := mac.Sum(nil)
	for _, vs := range strings.Split(sigs, " ") {
		version, sig, ok := strings.Cut(vs, ",")
		if !ok || version != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(sig)
		if err == nil && hmac.Equal(got, want) {
			return true
		}
	}
	return false
}

// stores runs fn on a fresh store of each dialect.
func stores(t *testing.T, fn func(t *testing.T, s *history.Store)) {
	for name, open := range map[string]func(testing.TB, ...historytest.Option) *history.Store{
		"sqlite":   historytest.NewSQLite,
		"postgres": historytest.NewPostgres,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, open(t))
		})
	}
}
