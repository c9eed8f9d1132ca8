package server_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/server"
	"github.com/cheetahbroker/cheetah/server/auth"
)

const bootstrapKey = "bootstrap-admin-key-for-webhook-tests-0123456789"

// hookBroker is a whole broker made by server.Open (webhooks included),
// served by httptest, with an app key and its webhook secret.
type hookBroker struct {
	*broker
	open      *server.Broker
	appSecret string
}

func openBroker(t *testing.T, o server.Options) *hookBroker {
	t.Helper()
	ctx := context.Background()
	o.DataDir = t.TempDir()
	o.AdminKey = bootstrapKey
	b, err := server.Open(ctx, o)
	require.NoError(t, err)
	hs := httptest.NewServer(b.Server.Handler())
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		require.NoError(t, b.Close(cctx))
		hs.Close()
	})
	hb := &hookBroker{
		broker: &broker{t: t, srv: b.Server, http: hs, reg: b.Registry, store: b.Store, keys: b.Keys, adminKey: bootstrapKey},
		open:   b,
	}
	app, err := b.Keys.Create(ctx, auth.App, "", "app")
	require.NoError(t, err)
	hb.appKey, hb.appSecret = app.Secret, app.WebhookSecret
	hb.client = hb.makeKey(auth.Client, user)
	return hb
}

// acquire leases the agent's context and returns its token.
func (b *hookBroker) acquire(task string) string {
	b.t.Helper()
	var acq struct{ Lease cheetah.Lease }
	resp := b.do("POST", "/api/v1/acquire", b.appKey, map[string]any{"user_id": user, "task_id": task, "client_type": "console"}, &acq)
	require.Equal(b.t, http.StatusCreated, resp.StatusCode)
	return acq.Lease.LeaseToken
}

// flush waits until the deliveries due now have been made and recorded.
func (b *hookBroker) flush() {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(b.t, b.open.Webhooks.Flush(ctx))
}

type delivery struct {
	header http.Header
	body   []byte
}

// hookReceiver records what it is sent and answers 200.
func hookReceiver(t *testing.T) (*httptest.Server, chan delivery) {
	t.Helper()
	got := make(chan delivery, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- delivery{header: r.Header.Clone(), body: body}
	}))
	t.Cleanup(srv.Close)
	return srv, got
}

func nextDelivery(t *testing.T, got chan delivery) delivery {
	t.Helper()
	select {
	case d := <-got:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("no webhook delivery arrived")
		return delivery{}
	}
}

// verifySignature checks a delivery as a Standard Webhooks receiver does
// (HMAC-SHA256 of "<id>.<timestamp>.<body>" keyed with the base64 text
// after "whsec_"), written from the specification, not the broker's code.
func verifySignature(t *testing.T, secret string, d delivery) {
	t.Helper()
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	require.NoError(t, err)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(d.header.Get("webhook-id") + "." + d.header.Get("webhook-timestamp") + "." + string(d.body)))
	want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
	require.Contains(t, strings.Split(d.header.Get("webhook-signature"), " "), want)
}

func withoutDelivery(t *testing.T, raw []byte) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(raw, &m))
	delete(m, "delivery")
	return m
}

// X-Callback-Url delivers the record a history read shows, signed with the
// requesting app key's webhook secret, for plain sends and for waits.
func TestWebhookOverHTTP(t *testing.T) {
	t.Parallel()
	b := openBroker(t, server.Options{WebhookAllowPrivate: true})
	recv, got := hookReceiver(t)
	agent := b.connectAgent("agent-1", "flow-1")
	token := b.acquire("hooked")

	var sent cheetah.Sent
	resp := b.do("POST", "/api/v1/commands", b.appKey, map[string]any{"name": "echo", "params": map[string]any{"n": 1}}, &sent,
		"X-Lease", token, "X-Callback-Url", recv.URL+"/hook")
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	answer(agent, 1)
	d := nextDelivery(t, got)
	require.Equal(t, "application/json", d.header.Get("Content-Type"))
	require.Equal(t, sent.CommandID, d.header.Get("webhook-id"))
	require.Equal(t, "1", d.header.Get("X-Cheetah-Attempt"))
	verifySignature(t, b.appSecret, d)

	b.flush()
	var read struct{ Command json.RawMessage }
	b.do("GET", "/api/v1/users/"+user+"/commands/"+sent.CommandID, b.appKey, nil, &read)
	require.Equal(t, withoutDelivery(t, read.Command), withoutDelivery(t, d.body), "the body is the record the read shows")
	var body, after cheetah.CommandRecord
	require.NoError(t, json.Unmarshal(d.body, &body))
	require.NoError(t, json.Unmarshal(read.Command, &after))
	require.Equal(t, cheetah.StatusCompleted, body.Status)
	require.Equal(t, &cheetah.Delivery{URL: recv.URL + "/hook"}, body.Delivery, "as it stood before the attempt")
	require.Equal(t, &cheetah.Delivery{URL: recv.URL + "/hook", Attempts: 1, Delivered: true}, after.Delivery)

	// send-and-wait with a callback.
	done := make(chan struct{})
	go func() { defer close(done); answer(agent, 1) }()
	var res struct{ Resolution cheetah.Resolution }
	resp = b.do("POST", "/api/v1/commands/wait", b.appKey, map[string]any{"name": "echo"}, &res,
		"X-Lease", token, "X-Callback-Url", recv.URL+"/wait")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	<-done
	require.Equal(t, cheetah.StatusCompleted, res.Resolution.Status)
	d = nextDelivery(t, got)
	require.Equal(t, res.Resolution.CommandID, d.header.Get("webhook-id"))
	verifySignature(t, b.appSecret, d)
}

// What the HTTP API refuses with 400 before anything is recorded.
func TestWebhookRefusedAtSend(t *testing.T) {
	t.Parallel()
	b := openBroker(t, server.Options{})
	b.connectAgent("agent-1", "flow-1")
	token := b.acquire("refused")
	send := func(key, url string, body map[string]any) {
		t.Helper()
		b.expectError(400, "invalid_request", "", "POST", "/api/v1/commands", key, body, "X-Lease", token, "X-Callback-Url", url)
	}
	echo := map[string]any{"name": "echo"}
	// The bootstrap admin key has no webhook secret to sign with.
	send(bootstrapKey, "https://hooks.example.com/x", echo)
	// A response_mode none command never ends.
	send(b.appKey, "https://hooks.example.com/x", map[string]any{"name": "echo", "response_mode": "none"})
	// Private and loopback destinations, and plain http, need
	// --webhook-allow-private.
	for _, u := range []string{"https://127.0.0.1:9/x", "https://localhost/x", "https://[::1]/", "https://10.0.0.8/",
		"https://169.254.169.254/", "http://hooks.example.com/", "not a url"} {
		send(b.appKey, u, echo)
	}
	page, err := b.store.List(context.Background(), user, cheetah.ListQuery{})
	require.NoError(t, err)
	require.Empty(t, page.Commands, "nothing was recorded")
}

// A Server made without webhooks refuses X-Callback-Url, as before.
func TestWebhookNotEnabled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.connectAgent("agent-1", "flow-1")
	var acq struct{ Lease cheetah.Lease }
	b.do("POST", "/api/v1/acquire", b.appKey, map[string]any{"user_id": user, "task_id": "t", "client_type": "console"}, &acq)
	b.expectError(400, "invalid_request", "", "POST", "/api/v1/commands", b.appKey, map[string]any{"name": "echo"},
		"X-Lease", acq.Lease.LeaseToken, "X-Callback-Url", "https://hooks.example.com/")
}

// In-process sends with WithCallback are signed with Options.WebhookSecret;
// without one they are refused.
func TestWebhookInProcess(t *testing.T) {
	t.Parallel()
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	ctx := context.Background()
	b := openBroker(t, server.Options{WebhookAllowPrivate: true, WebhookSecret: secret})
	recv, got := hookReceiver(t)
	agent := b.connectAgent("agent-1", "flow-1")
	mgr := b.open.Manager()
	h, err := mgr.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "sdk", ClientType: cheetah.Console})
	require.NoError(t, err)
	id, err := h.Send(ctx, cheetah.Command{Name: "echo"}, cheetah.WithCallback(recv.URL))
	require.NoError(t, err)
	answer(agent, 1)
	d := nextDelivery(t, got)
	require.Equal(t, id, d.header.Get("webhook-id"))
	verifySignature(t, secret, d)

	_, err = h.Send(ctx, cheetah.Command{Name: "echo"}, cheetah.WithCallback(recv.URL), cheetah.WithResponseMode(cheetah.ModeNone))
	require.ErrorIs(t, err, cheetah.ErrInvalidRequest)
	_, err = h.SendAndWait(ctx, cheetah.Command{Name: "echo"}, cheetah.WithCallback("ftp://x"))
	require.ErrorIs(t, err, cheetah.ErrInvalidRequest)

	plain := openBroker(t, server.Options{WebhookAllowPrivate: true})
	plain.connectAgent("agent-1", "flow-1")
	h, err = plain.open.Manager().Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "sdk", ClientType: cheetah.Console})
	require.NoError(t, err)
	_, err = h.Send(ctx, cheetah.Command{Name: "echo"}, cheetah.WithCallback(recv.URL))
	require.ErrorIs(t, err, cheetah.ErrInvalidRequest, "no broker secret to sign with")
	require.Contains(t, err.Error(), "WebhookSecret")
}
