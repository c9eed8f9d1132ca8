package server_test

import (
	"context"
	"errors"
	"net"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/server"
	"github.com/cheetahbroker/cheetah/server/auth"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const user = "usr_1111"

// broker is a whole broker on a real SQLite file, served by httptest.
type broker struct {
	t        *testing.T
	srv      *server.Server
	http     *httptest.Server
	reg      *registry.Registry
	store    *history.Store
	keys     *auth.Keys
	clock    *clockwork.FakeClock // the server's clock: hello timeout, heartbeats
	adminKey string
	appKey   string
	client   string       // a client key of user
	writes   atomic.Int64 // writes of the server's connections
}

// countingListener counts, in n, the writes of the connections it accepts.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{c, l.n}, nil
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.n.Add(1)
	return c.Conn.Write(p)
}

func setup(t *testing.T, tweak ...func(*server.Config)) *broker {
	t.Helper()
	return setupOn(t, historytest.NewSQLite(t), tweak...)
}

// onBothStores runs f on a broker over SQLite and on one over PostgreSQL:
// for what the store is involved in.
func onBothStores(t *testing.T, f func(t *testing.T, b *broker), tweak ...func(*server.Config)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		f(t, setupOn(t, historytest.NewSQLite(t), tweak...))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		f(t, setupOn(t, historytest.NewPostgres(t), tweak...))
	})
}

// setupOn is setup on a given store.
func setupOn(t *testing.T, store *history.Store, tweak ...func(*server.Config)) *broker {
	t.Helper()
	return setupRegistry(t, store, registry.Config{Store: store}, tweak...)
}

// setupRegistry is setupOn with the registry made from rc (its reconnect
// grace set), whose Store may wrap store.
func setupRegistry(t *testing.T, store *history.Store, rc registry.Config, tweak ...func(*server.Config)) *broker {
	t.Helper()
	ctx := context.Background()
	rc.ReconnectGrace = 5 * time.Second
	reg, err := registry.New(ctx, rc)
	require.NoError(t, err)
	keys := auth.New(store, "", time.Now)
	clock := clockwork.NewFakeClock()
	cfg := server.Config{Registry: reg, Store: store, Keys: keys, Clock: clock, MaxMessageBytes: 64 << 10}
	for _, f := range tweak {
		f(&cfg)
	}
	srv, err := server.New(cfg)
	require.NoError(t, err)
	// Served as cheetah serve serves: writes held (HoldWrites), here over
	// connections that count their writes.
	b := &broker{t: t, srv: srv, reg: reg, store: store, keys: keys, clock: clock}
	hs := httptest.NewUnstartedServer(srv.Handler())
	hs.Listener = server.HoldWrites(hs.Config, countingListener{hs.Listener, &b.writes})
	hs.Start()
	b.http = hs
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		hs.Close()
		reg.Close()
	})
	b.adminKey = b.makeKey(auth.Admin, "")
	b.appKey = b.makeKey(auth.App, "")
	b.client = b.makeKey(auth.Client, user)
	return b
}

func (b *broker) makeKey(kind auth.Kind, userID string) string {
	c, err := b.keys.Create(context.Background(), kind, userID, "test")
	require.NoError(b.t, err)
	return c.Secret
}

// wsClient is a raw protocol client for tests.
type wsClient struct {
	t      *testing.T
	conn   *websocket.Conn
	frames chan protocol.Frame
	closed chan error // the read error that ended the connection
}

// dial opens a WebSocket without saying anything.
func (b *broker) dial() *wsClient {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, strings.Replace(b.http.URL, "http", "ws", 1)+"/ws/v1/client", nil)
	require.NoError(b.t, err)
	conn.SetReadLimit(-1)
	c := &wsClient{t: b.t, conn: conn, frames: make(chan protocol.Frame, 1024), closed: make(chan error, 1)}
	b.t.Cleanup(func() { conn.CloseNow() })
	return c
}

// read starts the reader; until then the client reads nothing (a client
// that does not read).
func (c *wsClient) read() *wsClient {
	go func() {
		for {
			_, b, err := c.conn.Read(context.Background())
			if err != nil {
				c.closed <- err
				close(c.frames)
				return
			}
			f, err := protocol.Decode(b)
			if err != nil {
				c.closed <- err
				close(c.frames)
				return
			}
			c.frames <- f
		}
	}()
	return c
}

func (c *wsClient) send(f protocol.Frame) {
	c.t.Helper()
	b, err := protocol.Encode(f)
	require.NoError(c.t, err)
	c.sendRaw(b)
}

func (c *wsClient) sendRaw(b []byte) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(c.t, c.conn.Write(ctx, websocket.MessageText, b))
}

// next returns the next frame of type F, skipping others.
func next[F protocol.Frame](c *wsClient) F {
	c.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case f, ok := <-c.frames:
			if !ok {
				var zero F
				c.t.Fatalf("connection closed before a %T arrived", zero)
				return zero
			}
			if x, is := f.(F); is {
				return x
			}
		case <-timeout:
			var zero F
			c.t.Fatalf("no %T arrived", zero)
			return zero
		}
	}
}

// expectClose asserts that the broker sends an error frame with the close's
// code, then closes with code.
func (c *wsClient) expectClose(code protocol.CloseCode) {
	c.t.Helper()
	e := next[*protocol.Error](c)
	require.Equal(c.t, code.ErrorCode(), e.Code, e.Message)
	select {
	case err := <-c.closed:
		var ce websocket.CloseError
		require.True(c.t, errors.As(err, &ce), "closed without a close frame: %v", err)
		require.Equal(c.t, websocket.StatusCode(code), ce.Code)
	case <-time.After(10 * time.Second):
		c.t.Fatal("the connection was not closed")
	}
}

// hello says hello with key and waits for the welcome.
func (c *wsClient) hello(key, clientID string, typ protocol.ClientType) *protocol.Welcome {
	c.t.Helper()
	c.send(&protocol.Hello{Protocol: 1, Token: key, ClientID: clientID, ClientType: typ, Name: "test"})
	return next[*protocol.Welcome](c)
}

// connectAgent connects a console client with worker contexts and waits
// until the registry lists them.
func (b *broker) connectAgent(clientID string, contexts ...string) *wsClient {
	b.t.Helper()
	c := b.dial().read()
	c.hello(b.client, clientID, protocol.ClientConsole)
	var reps []protocol.ContextReport
	for _, id := range contexts {
		reps = append(reps, protocol.ContextReport{ContextID: id, TabID: "t-" + id, Owner: protocol.OwnerWorker})
	}
	c.send(&protocol.State{Contexts: reps})
	// The state is applied in order after hello; a ping round trip proves it.
	c.send(&protocol.Ping{})
	next[*protocol.Pong](c)
	return c
}

func errorsAs(err error, target any) bool { return errors.As(err, target) }

// requireRevoked revokes the lease on a context, which must carry one.
func requireRevoked(t *testing.T, reg *registry.Registry, userID, clientID, contextID string) {
	t.Helper()
	ok, err := reg.Revoke(context.Background(), userID, clientID, contextID)
	require.NoError(t, err)
	require.True(t, ok, "a lease to revoke on %s", contextID)
}
