package rig

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"

	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/server"
)

// ServeInProcess serves srv on loopback for the test. When the test ends it
// closes the client connections, the listener, srv (its sessions) and reg,
// in that order.
func ServeInProcess(t testing.TB, srv *server.Server, reg *registry.Registry) *httptest.Server {
	return serve(t, srv.Handler(), func(ctx context.Context) {
		_ = srv.Shutdown(ctx)
		reg.Close()
	})
}

// OpenBroker opens a whole broker in process with opts and serves it on
// loopback until the test ends; then the client connections are closed, the
// listener, and the broker.
func OpenBroker(t testing.TB, opts server.Options) (*server.Broker, *httptest.Server) {
	t.Helper()
	b, err := server.Open(context.Background(), opts)
	if err != nil {
		t.Fatalf("rig: open broker: %v", err)
	}
	return b, serve(t, b.Server.Handler(), func(ctx context.Context) { _ = b.Close(ctx) })
}

// serve serves h on loopback until the test ends: then it closes the client
// connections and the listener, and calls stop with a bounded context.
func serve(t testing.TB, h http.Handler, stop func(context.Context)) *httptest.Server {
	hs := httptest.NewServer(h)
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		stop(ctx)
	})
	return hs
}

// Heap is the live heap after a full collection, in bytes: the figure a
// test compares before and after a load.
func Heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
