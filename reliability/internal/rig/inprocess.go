package rig

import (
	"context"
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
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		reg.Close()
	})
	return hs
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
	hs := httptest.NewServer(b.Server.Handler())
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = b.Close(ctx)
	})
	return b, hs
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
