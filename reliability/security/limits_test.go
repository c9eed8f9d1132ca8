package security

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/reliability/internal/rig"
	"github.com/cheetahbroker/cheetah/server"
	"github.com/cheetahbroker/cheetah/server/auth"
)

// expectClose reads until the broker closes, and returns the error frames
// it sent first and the close code.
func expectClose(t *testing.T, conn *websocket.Conn, within time.Duration) ([]*protocol.Error, websocket.StatusCode) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	var errs []*protocol.Error
	for {
		_, b, err := conn.Read(ctx)
		if err != nil {
			var ce websocket.CloseError
			if errors.As(err, &ce) {
				return errs, ce.Code
			}
			t.Fatalf("no close frame: %v", err)
		}
		if f, _ := protocol.Decode(b); f != nil {
			if e, ok := f.(*protocol.Error); ok {
				errs = append(errs, e)
			}
		}
	}
}

// TestOversized sends a frame over max_message_bytes (4413), a body over
// the HTTP limit (413), a command that would make a frame over the limit
// (413, nothing recorded) and a state report over the per-client bound
// (refused, the previous state stands).
func TestOversized(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	c := e.client(userA, "laptop", "tab-1")
	l := e.acquire(userA, "", "big")

	// HTTP bodies: at the limit is read, one byte over is not.
	limit := 256 << 10
	pad := func(n int) []byte {
		body := `{"user_id":"` + userA + `","task_id":"pad","client_type":"console"}`
		return []byte(body + strings.Repeat(" ", n-len(body)))
	}
	at := e.do("POST", "/api/v1/acquire", e.app, pad(limit))
	require.Contains(t, []int{201, 409}, at.Status, "a body at the limit is read: %s", at)
	over := e.do("POST", "/api/v1/acquire", e.app, pad(limit+1))
	require.Equal(t, 413, over.Status)
	require.Equal(t, cheetah.CodePayloadTooLarge, over.Code())
	huge := e.do("POST", "/api/v1/acquire", e.app, []byte(`{"user_id":"`+strings.Repeat("u", 8<<20)+`"}`))
	require.Equal(t, 413, huge.Status)

	// A command whose frame would exceed max_message_bytes (64 KiB here) is
	// refused before anything is recorded.
	before := e.do("GET", "/api/v1/users/"+userA+"/commands?limit=500", e.app, nil)
	var pb cheetah.CommandPage
	require.NoError(t, before.Decode(&pb))
	big := e.do("POST", "/api/v1/commands", e.app, map[string]any{"name": "work", "params": map[string]string{"p": strings.Repeat("b", 70<<10)}}, "X-Lease", l.LeaseToken)
	require.Equal(t, 413, big.Status, big.String())
	after := e.do("GET", "/api/v1/users/"+userA+"/commands?limit=500", e.app, nil)
	var pa cheetah.CommandPage
	require.NoError(t, after.Decode(&pa))
	require.Equal(t, len(pb.Commands), len(pa.Commands), "an oversized command was recorded")

	// A state report over the per-client bound: refused, the old state
	// stands.
	var many []protocol.ContextReport
	for i := range 257 {
		many = append(many, rig.Worker(fmt.Sprintf("ctx-%d", i)))
	}
	require.NoError(t, c.Send(&protocol.State{Contexts: many}))
	require.NoError(t, c.Sync())
	found := false
	for _, f := range c.Errors() {
		found = found || f.Code == "too_many_contexts"
	}
	require.True(t, found, "a report of 257 contexts is refused")
	renew := e.do("POST", "/api/v1/lease/renew", e.app, nil, "X-Lease", l.LeaseToken)
	require.Equal(t, 200, renew.Status, "the previous state stands: %s", renew)

	// A frame over max_message_bytes: error frame too_large, close 4413.
	wsURL := "ws" + strings.TrimPrefix(e.hs.URL, "http") + "/ws/v1/client"
	for _, first := range []bool{true, false} {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		conn, _, err := websocket.Dial(dctx, wsURL, nil)
		cancel()
		require.NoError(t, err)
		conn.SetReadLimit(-1)
		if !first {
			hello, _ := protocol.Encode(&protocol.Hello{Protocol: 1, Token: e.keys[userA], ClientID: "big", ClientType: protocol.ClientConsole})
			require.NoError(t, conn.Write(ctx, websocket.MessageText, hello))
		}
		frame := []byte(`{"type":"ping","pad":"` + strings.Repeat("p", 64<<10) + `"}`)
		require.NoError(t, conn.Write(ctx, websocket.MessageText, frame))
		errs, code := expectClose(t, conn, 10*time.Second)
		require.Equal(t, websocket.StatusCode(protocol.CloseTooLarge), code, "oversized frame (before hello: %v)", first)
		require.NotEmpty(t, errs)
		require.Equal(t, protocol.CodeTooLarge, errs[len(errs)-1].Code)
		conn.CloseNow()
	}
}

// TestHelloFlood opens many connections that never say hello. Each must be
// closed with 4408 (after an error frame) once the hello timeout passes,
// a real client must be served meanwhile, and everything the flood took
// must come back.
//
// It does not run in parallel: its goroutine count must not see other
// tests' goroutines.
func TestHelloFlood(t *testing.T) {
	ctx := context.Background()
	const helloTimeout = 750 * time.Millisecond
	n := *flood
	// Room for the flood and the real client: TestPendingHelloCap shows
	// what happens past the cap.
	hs, reg, clientKey := helloServer(t, server.Config{HelloTimeout: helloTimeout, MaxPendingHellos: n + 1})

	baseline := goleak.IgnoreCurrent()
	baseHeap := rig.Heap()
	wsURL := "ws" + strings.TrimPrefix(hs.URL, "http") + "/ws/v1/client"
	type result struct {
		code  websocket.StatusCode
		errs  []*protocol.Error
		after time.Duration
		err   error
	}
	results := make(chan result, n)
	opened := make(chan struct{}, n)
	var wg sync.WaitGroup
	start := time.Now()
	for range n {
		wg.Go(func() {
			dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			dialled := time.Now() // before the broker's hello timer starts
			conn, _, err := websocket.Dial(dctx, wsURL, nil)
			if err != nil {
				results <- result{err: err}
				opened <- struct{}{}
				return
			}
			defer conn.CloseNow()
			opened <- struct{}{}
			var r result
			for {
				_, b, err := conn.Read(dctx)
				if err != nil {
					var ce websocket.CloseError
					if errors.As(err, &ce) {
						r.code = ce.Code
					} else {
						r.err = err
					}
					break
				}
				if f, _ := protocol.Decode(b); f != nil {
					if e, ok := f.(*protocol.Error); ok {
						r.errs = append(r.errs, e)
					}
				}
			}
			r.after = time.Since(dialled)
			results <- r
		})
	}
	for range n {
		<-opened
	}
	var peak runtime.MemStats
	runtime.ReadMemStats(&peak)
	peakGoroutines := runtime.NumGoroutine()

	// Meanwhile a real client says hello and is served.
	real := &rig.FakeClient{URL: hs.URL, Key: clientKey, UserID: userA, ClientID: "real"}
	helloStart := time.Now()
	require.NoError(t, real.Connect(ctx), "a real client is served during the flood")
	require.NoError(t, real.Report(rig.Worker("w")))
	served := time.Since(helloStart)
	_, err := reg.Acquire(ctx, cheetah.AcquireRequest{UserID: userA, TaskID: "t", ClientType: cheetah.Console})
	require.NoError(t, err)

	wg.Wait()
	close(results)
	closed, slowest := 0, time.Duration(0)
	for r := range results {
		require.NoError(t, r.err)
		require.Equal(t, websocket.StatusCode(protocol.CloseTimeout), r.code)
		require.NotEmpty(t, r.errs, "an error frame says why before the close")
		require.Equal(t, protocol.CodeTimeout, r.errs[0].Code)
		require.GreaterOrEqual(t, r.after, helloTimeout-100*time.Millisecond, "closed before the hello timeout")
		slowest = max(slowest, r.after)
		closed++
	}
	require.Equal(t, n, closed)
	require.Less(t, slowest, helloTimeout+10*time.Second, "a silent connection outlived the hello timeout by far")
	real.Close()
	hs.CloseClientConnections()
	require.NoError(t, goleak.Find(baseline), "goroutines the flood left behind")
	t.Logf("%d connections without hello: all closed 4408 (slowest %s after dialling, hello timeout %s, flood took %s); at peak +%d goroutines and +%d KiB heap (%d B per connection, this process holds both ends); a real client's hello and report took %s meanwhile; heap after %+d KiB",
		n, slowest.Round(time.Millisecond), helloTimeout, time.Since(start).Round(time.Millisecond), peakGoroutines, (int64(peak.HeapAlloc)-int64(baseHeap))>>10,
		(int64(peak.HeapAlloc)-int64(baseHeap))/int64(n), served.Round(time.Millisecond), (int64(rig.Heap())-int64(baseHeap))>>10)
}

// TestPendingHelloCap: connections that have not said hello are bounded in
// number as well as in time. Past the cap an upgrade is refused with 503
// overloaded and Retry-After (nothing is upgraded, so nothing is held); a
// place comes back when a waiting connection says hello, when the broker
// closes one (its hello timeout), and when one goes away by itself.
func TestPendingHelloCap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	const cap = 4
	hs, _, clientKey := helloServer(t, server.Config{Clock: clock, MaxPendingHellos: cap})
	var conns []*websocket.Conn
	defer func() {
		// Nobody reads these: closed first, the broker's shutdown does not
		// wait out their close handshakes.
		for _, c := range conns {
			c.CloseNow()
		}
	}()
	wsURL := "ws" + strings.TrimPrefix(hs.URL, "http") + "/ws/v1/client"
	dial := func() (*websocket.Conn, *http.Response, error) {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		conn, resp, err := websocket.Dial(dctx, wsURL, nil)
		if conn != nil {
			conns = append(conns, conn)
		}
		return conn, resp, err
	}
	refused := func(why string) {
		t.Helper()
		_, resp, err := dial()
		require.Error(t, err, why)
		require.NotNil(t, resp, why)
		require.Equal(t, 503, resp.StatusCode, why)
		require.Equal(t, "1", resp.Header.Get("Retry-After"))
		var env struct{ Error struct{ Code string } }
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&env))
		require.Equal(t, cheetah.CodeOverloaded, env.Error.Code)
	}

	silent := make([]*websocket.Conn, cap)
	for i := range silent {
		conn, _, err := dial()
		require.NoError(t, err)
		silent[i] = conn
	}
	refused("past the cap")

	// One says hello: its place is free once the welcome arrives.
	hello, _ := protocol.Encode(&protocol.Hello{Protocol: 1, Token: clientKey, ClientID: "real", ClientType: protocol.ClientConsole})
	require.NoError(t, silent[0].Write(ctx, websocket.MessageText, hello))
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, b, err := silent[0].Read(rctx)
	require.NoError(t, err)
	f, err := protocol.Decode(b)
	require.NoError(t, err)
	require.IsType(t, &protocol.Welcome{}, f)
	conn, _, err := dial()
	require.NoError(t, err, "a place came back with the hello")
	silent[0] = conn
	refused("full again")

	// The hello timeout closes them all: their places come back as the
	// error frame goes out, before the close.
	clock.Advance(11 * time.Second)
	for _, c := range silent {
		errs, code := expectClose(t, c, 10*time.Second)
		require.Equal(t, websocket.StatusCode(protocol.CloseTimeout), code)
		require.NotEmpty(t, errs)
	}
	for range cap {
		_, _, err := dial()
		require.NoError(t, err, "the places came back with the timeouts")
	}
	refused("full once more")
}

// helloServer serves a registry and a server made with cfg (its registry,
// store and keys filled in) on loopback until the test ends, and returns a
// client key of userA.
func helloServer(t *testing.T, cfg server.Config) (*httptest.Server, *registry.Registry, string) {
	t.Helper()
	ctx := context.Background()
	store := historytest.NewSQLite(t)
	reg, err := registry.New(ctx, registry.Config{Store: store})
	require.NoError(t, err)
	cfg.Registry, cfg.Store, cfg.Keys = reg, store, auth.New(store, "", time.Now)
	srv, err := server.New(cfg)
	require.NoError(t, err)
	hs := rig.ServeInProcess(t, srv, reg)
	ck, err := cfg.Keys.Create(ctx, auth.Client, userA, "real")
	require.NoError(t, err)
	return hs, reg, ck.Secret
}
