package server_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/protocol"
)

// With durable leases, the lease wait tells a lease's end once its row is
// deleted: a replica that died before would bring the lease back.
func TestLeaseWaitTellsAnEndOnceDurable(t *testing.T) {
	t.Parallel()
	store := historytest.NewSQLite(t)
	hc := &historytest.Holding{Store: store}
	b := setupRegistry(t, store, registry.Config{Store: hc, DurableLeases: true})
	c := b.connectAgent("agent-1", "flow-1")
	var acq struct{ Lease cheetah.Lease }
	resp := b.do("POST", "/api/v1/acquire", b.appKey, map[string]any{"user_id": user, "task_id": "job", "client_type": "console"}, &acq)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	next[*protocol.Assignment](c)
	lease := []string{"X-Lease", acq.Lease.LeaseToken}

	hc.SetHold(true)
	t.Cleanup(func() { hc.Release() }) // before the broker's own cleanup, whatever happens
	waited := make(chan int, 1)
	go func() {
		waited <- b.do("POST", "/api/v1/lease/wait", b.appKey, map[string]any{"timeout_ms": 30000}, nil, lease...).StatusCode
	}()
	released := make(chan int, 1)
	go func() {
		released <- b.do("POST", "/api/v1/lease/release", b.appKey, nil, nil, lease...).StatusCode
	}()
	select {
	case code := <-waited:
		t.Fatalf("the wait answered %d while the release's row was not deleted", code)
	case <-time.After(200 * time.Millisecond):
	}
	hc.Release()
	require.Equal(t, http.StatusOK, <-released)
	require.Equal(t, http.StatusLocked, <-waited)
}
