package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/internal/syncbuf"
	"github.com/cheetahbroker/cheetah/internal/tcpproxy"
	"github.com/cheetahbroker/cheetah/server"
)

// attemptLog passes on the records of OpenRetry's failed attempts, and
// writes every record as text into out.
type attemptLog struct {
	ch   chan slog.Record
	text slog.Handler
}

func (h attemptLog) Enabled(context.Context, slog.Level) bool { return true }
func (h attemptLog) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "store not available") {
		select {
		case h.ch <- r:
		default:
		}
	}
	return h.text.Handle(ctx, r)
}
func (h attemptLog) WithAttrs(as []slog.Attr) slog.Handler {
	return attemptLog{ch: h.ch, text: h.text.WithAttrs(as)}
}
func (h attemptLog) WithGroup(g string) slog.Handler {
	return attemptLog{ch: h.ch, text: h.text.WithGroup(g)}
}

func getStatus(t *testing.T, base, path string) (int, cheetah.Envelope) {
	t.Helper()
	resp, err := http.Get(base + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.NotEmpty(t, resp.Header.Get(server.HeaderRequestID))
	var env cheetah.Envelope
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		require.NoError(t, json.Unmarshal(raw, &env), string(raw))
	}
	return resp.StatusCode, env
}

// A broker whose PostgreSQL does not answer at start keeps trying: it
// serves /healthz 200, /readyz and the API 503 store_unavailable
// meanwhile, logs each attempt without the URL's password, and becomes
// ready once the database answers, without a restart.
func TestOpenRetryWaitsForPostgres(t *testing.T) {
	t.Parallel()
	dbURL := historytest.EmptyPostgres(t)
	real, err := url.Parse(dbURL)
	require.NoError(t, err)
	// The broker is pointed at a port nothing listens on yet.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	const password = "pw-not-for-logs-4711"
	u := *real
	u.Host, u.User = addr, url.UserPassword(real.User.Username(), password)

	var text syncbuf.Buffer
	attempts := make(chan slog.Record, 64)
	log := slog.New(attemptLog{ch: attempts, text: slog.NewTextHandler(&text, nil)})
	front := server.NewStarting(nil)
	hs := httptest.NewServer(front)
	defer hs.Close()

	type opened struct {
		b   *server.Broker
		err error
	}
	done := make(chan opened, 1)
	go func() {
		b, err := server.OpenRetry(t.Context(), server.Options{DatabaseURL: u.String(), DataDir: t.TempDir(),
			AdminKey: bootstrapKey, Log: log}, server.Retry{Min: 20 * time.Millisecond, Max: 100 * time.Millisecond})
		done <- opened{b, err}
	}()

	var first slog.Record
	select {
	case first = <-attempts:
	case <-time.After(30 * time.Second):
		t.Fatal("no failed attempt was logged")
	}
	first.Attrs(func(a slog.Attr) bool {
		if a.Key == "attempt" {
			require.EqualValues(t, 1, a.Value.Int64())
		}
		return true
	})
	status, _ := getStatus(t, hs.URL, "/healthz")
	require.Equal(t, http.StatusOK, status, "alive while the store is away")
	status, env := getStatus(t, hs.URL, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, status)
	require.Equal(t, cheetah.CodeStoreUnavailable, env.Error.Code)
	status, env = getStatus(t, hs.URL, "/api/v1/users/"+user+"/commands")
	require.Equal(t, http.StatusServiceUnavailable, status)
	require.Equal(t, cheetah.CodeStoreUnavailable, env.Error.Code)

	// The database comes (back): the broker opens and serves.
	tcpproxy.Start(t, addr, real.Host)
	var o opened
	select {
	case o = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the broker did not open once the database answered")
	}
	require.NoError(t, o.err)
	front.Ready(o.b.Server.Handler())
	defer func() { require.NoError(t, o.b.Close(context.Background())) }()
	status, _ = getStatus(t, hs.URL, "/readyz")
	require.Equal(t, http.StatusOK, status)

	out := text.String()
	require.Contains(t, out, "attempt=1 ")
	require.Contains(t, out, "next_try_in=")
	require.Contains(t, out, addr, "the log names the database")
	require.NotContains(t, out, password)
}

// A signal (ctx) during the wait ends OpenRetry at once; an error that is
// not the store's absence (here a second broker on one data directory) is
// not retried.
func TestOpenRetryStops(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	ctx, cancel := context.WithCancel(t.Context())
	attempts := make(chan slog.Record, 64)
	log := slog.New(attemptLog{ch: attempts, text: slog.DiscardHandler})
	done := make(chan error, 1)
	go func() {
		_, err := server.OpenRetry(ctx, server.Options{DatabaseURL: "postgres://postgres@" + addr + "/x?sslmode=disable", Log: log},
			server.Retry{Min: time.Hour})
		done <- err
	}()
	select {
	case <-attempts:
	case <-time.After(30 * time.Second):
		t.Fatal("no failed attempt was logged")
	}
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)

	dir := t.TempDir()
	b, err := server.Open(t.Context(), server.Options{DataDir: dir})
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Close(context.Background())) }()
	_, err = server.OpenRetry(t.Context(), server.Options{DataDir: dir}, server.Retry{Min: time.Hour})
	require.True(t, err != nil && !errors.Is(err, cheetah.ErrStoreUnavailable), "%v", err)
}

// A database that takes the connection and never answers does not hold
// OpenRetry past its context: a SIGTERM during such an attempt ends it.
func TestOpenRetryStopsDuringHangingAttempt(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	accepted := make(chan net.Conn, 16)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	})
	defer func() {
		_ = l.Close()
		wg.Wait()
		close(accepted)
		for c := range accepted {
			_ = c.Close()
		}
	}()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := server.OpenRetry(ctx, server.Options{DatabaseURL: "postgres://postgres@" + l.Addr().String() + "/x?sslmode=disable"},
			server.Retry{Min: time.Hour})
		done <- err
	}()
	select {
	case c := <-accepted:
		accepted <- c // closed at the end
	case <-time.After(30 * time.Second):
		t.Fatal("no connection attempt")
	}
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(30 * time.Second):
		t.Fatal("OpenRetry did not return after its context ended")
	}
}
