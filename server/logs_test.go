package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/internal/syncbuf"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/remote"
	"github.com/cheetahbroker/cheetah/server"
)

// A full scenario with known keys, lease tokens and webhook secrets, logged
// at debug in both formats by the broker and by the agent library: no line
// holds any of them. The handlers are slog's own, without the redaction of
// server.NewLogHandler, so this shows what the code logs. HTTP lines name
// their request, client lines their session.
func TestLogsHoldNoSecret(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var text, js syncbuf.Buffer
	opts := &slog.HandlerOptions{Level: slog.LevelDebug}
	log := slog.New(slog.NewMultiHandler(slog.NewTextHandler(&text, opts), slog.NewJSONHandler(&js, opts)))

	const admin = "admin-key-for-the-log-test-7f3a9c1e5b"
	const brokerSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	b, err := server.Open(ctx, server.Options{DataDir: t.TempDir(), AdminKey: admin, Log: log,
		WebhookAllowPrivate: true, WebhookSecret: brokerSecret, Heartbeat: time.Second})
	require.NoError(t, err)
	hs := httptest.NewServer(b.Server.Handler())
	defer hs.Close()
	hb := &hookBroker{broker: &broker{t: t, srv: b.Server, http: hs, reg: b.Registry, store: b.Store, keys: b.Keys, adminKey: admin}, open: b}
	recv, got := hookReceiver(t)

	// Keys made over the API.
	var client, app struct {
		ID, Key       string
		WebhookSecret string `json:"webhook_secret"`
	}
	resp := hb.do("POST", "/api/v1/admin/keys", admin, map[string]any{"kind": "client", "user_id": user, "name": "agent"}, &client,
		server.HeaderRequestID, "req-known-1")
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, "req-known-1", resp.Header.Get(server.HeaderRequestID), "a well-formed request id is kept and echoed")
	require.Equal(t, http.StatusCreated, hb.do("POST", "/api/v1/admin/keys", admin, map[string]any{"kind": "app", "name": "app"}, &app).StatusCode)
	require.NotEmpty(t, app.WebhookSecret)
	resp = hb.do("GET", "/api/v1/admin/keys", admin, nil, nil, server.HeaderRequestID, "not a valid id!")
	require.Regexp(t, `^[0-9a-f]{24}$`, resp.Header.Get(server.HeaderRequestID), "a malformed one is replaced")

	// The agent library, logging to the same handlers.
	agentCtx, stopAgent := context.WithCancel(ctx)
	agentDone := make(chan error, 1)
	func() {
		a := newAgent(hs.URL, client.Key, "agent-log", nil, log)
		go func() { agentDone <- a.Run(agentCtx) }()
		select {
		case <-a.Connected():
		case <-time.After(10 * time.Second):
			t.Fatal("the agent did not connect")
		}
	}()

	// The application's work, over HTTP.
	mgr := remote.New(hs.URL, app.Key)
	h, err := mgr.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "logged", ClientType: cheetah.Console, Wait: 10 * time.Second})
	require.NoError(t, err)
	token := h.Lease().LeaseToken
	res, err := h.SendAndWait(ctx, cheetah.Command{Name: "echo", Params: map[string]string{"say": "hi"}}, cheetah.WithCallback(recv.URL))
	require.NoError(t, err)
	require.Equal(t, cheetah.StatusCompleted, res.Status)
	nextDelivery(t, got)
	_, err = h.SendAndWait(ctx, cheetah.Command{Name: "no-such-command"})
	require.NoError(t, err)
	require.NoError(t, h.Renew(ctx))
	_, err = mgr.Release(ctx, h)
	require.NoError(t, err)
	_, err = h.Send(ctx, cheetah.Command{Name: "echo"})
	require.ErrorIs(t, err, cheetah.ErrLeaseLost)
	hb.expectError(423, "lease_lost", "unknown_lease", "POST", "/api/v1/commands", app.Key, map[string]any{"name": "echo"},
		"X-Lease", "0123456789abcdef0123456789abcdef")

	// In process, signed with the broker's secret.
	inproc := b.Manager()
	h2, err := inproc.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "logged", ClientType: cheetah.Console, Wait: 10 * time.Second})
	require.NoError(t, err)
	_, err = h2.SendAndWait(ctx, cheetah.Command{Name: "echo"}, cheetah.WithCallback(recv.URL))
	require.NoError(t, err)
	nextDelivery(t, got)

	// Wrong keys, over HTTP and in a hello.
	const wrongKey = "chk_0123456789ab_wrongSecretThatMustNotBeLogged0123456789"
	hb.expectError(401, "unauthorized", "", "GET", "/api/v1/admin/pools", wrongKey, nil)
	hb.expectError(401, "unauthorized", "", "GET", "/api/v1/admin/pools", "plainly-wrong-key-value", nil)
	hb.expectError(403, "forbidden", "", "GET", "/api/v1/admin/pools", app.Key, nil)
	bad := hb.dial().read()
	bad.send(&protocol.Hello{Protocol: 1, Token: wrongKey, ClientID: "intruder", ClientType: protocol.ClientConsole})
	bad.expectClose(protocol.CloseUnauthorized)

	// Revoking the client key disconnects the agent (4403), which then
	// stops for good.
	require.Equal(t, http.StatusOK, hb.do("DELETE", "/api/v1/admin/keys/"+client.ID, admin, nil, nil).StatusCode)
	select {
	case err := <-agentDone:
		require.Error(t, err, "4403 ends Run")
	case <-time.After(10 * time.Second):
		t.Fatal("the agent was not disconnected")
	}
	stopAgent()

	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, b.Close(cctx))

	out := text.String() + js.String()
	require.NotEmpty(t, text.String())
	for what, s := range map[string]string{
		"admin key": admin, "client key": client.Key, "app key": app.Key, "wrong key": wrongKey,
		"plain wrong key": "plainly-wrong-key-value", "app webhook secret": app.WebhookSecret,
		"broker webhook secret": brokerSecret, "lease token": token, "in-process lease token": h2.Lease().LeaseToken,
		// A key is <prefix>_<id>_<secret>, and the secret's alphabet has
		// "_" in it: the secret is all that follows the second one.
		"client key's secret": strings.SplitN(client.Key, "_", 3)[2],
		"app key's secret":    strings.SplitN(app.Key, "_", 3)[2],
	} {
		require.NotContains(t, out, s, "the %s reached a log line", what)
	}

	// Every line is JSON in one format; HTTP lines name their request and
	// the broker's client lines their session.
	sawHTTP, sawSession := false, false
	for line := range strings.SplitSeq(strings.TrimSpace(js.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		switch m["msg"] {
		case "http", "internal error", "store unavailable":
			sawHTTP = true
			require.NotEmpty(t, m["request_id"], line)
		case "client connected", "closing client", "client closed", "client gone", "client connection lost",
			"client connection ended by the broker", "client reported an error":
			sawSession = true
			require.NotEmpty(t, m["session_id"], line)
		case "agent: connected", "agent: command failed", "agent: rejecting a command":
			require.NotEmpty(t, m["session_id"], line)
		}
	}
	require.True(t, sawHTTP)
	require.True(t, sawSession)
	require.Contains(t, js.String(), `"request_id":"req-known-1"`)
}

// The handler of cheetah serve and cheetah agent redacts what has the
// shape of a secret, or a secret's name, in both formats.
func TestLogHandlerRedacts(t *testing.T) {
	t.Parallel()
	const key = "chk_0a1b2c3d4e5f_Zm9vYmFyLWJhei1xdXV4LXNlY3JldC12YWx1ZS0xMjM0"
	const hook = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	const admin = "operator-chosen-admin-key"
	for _, format := range []string{server.LogText, server.LogJSON} {
		var buf bytes.Buffer
		h, err := server.NewLogHandler(&buf, format, slog.LevelDebug, admin, "short")
		require.NoError(t, err)
		log := slog.New(h).With("token", "abc", "key_id", "k1")
		log.Info("saw "+key+" and "+admin, "err", errString("dial: "+hook), "lease_token", "0123", "short", "short",
			slog.Group("g", "Authorization", "Bearer x", "ok", "fine "+admin))
		out := buf.String()
		for _, s := range []string{key, hook, admin, "abc", "0123", "Bearer x"} {
			require.NotContains(t, out, s, format)
		}
		require.Contains(t, out, "[redacted]", format)
		require.Contains(t, out, "k1", "a key id is not a secret")
		require.Contains(t, out, "short", "literals under 8 bytes are not redacted")
		require.Contains(t, out, "fine", format)
	}
	_, err := server.NewLogHandler(&bytes.Buffer{}, "xml", slog.LevelInfo)
	require.Error(t, err)
}

type errString string

func (e errString) Error() string { return string(e) }
