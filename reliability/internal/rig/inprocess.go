package rig

import (
	"context"
	"net/http/httptest"
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
