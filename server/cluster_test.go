package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/agent"
	"github.com/cheetahbroker/cheetah/cluster"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/internal/tcpproxy"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/remote"
	"github.com/cheetahbroker/cheetah/server"
	"github.com/cheetahbroker/cheetah/server/auth"
	"github.com/cheetahbroker/cheetah/server/clustertest"
)

type replica struct{ *clustertest.Replica }

const clusterAdminKey = clustertest.AdminKey

func startCluster(t testing.TB, n int) []*replica { return startClusterVia(t, n, nil, nil) }

// startClusterVia is startCluster with replica 0's requests to the others
// carried by via (nil: the default), and opts (if any) applied to every
// replica.
func startClusterVia(t testing.TB, n int, via http.RoundTripper, opts func(*server.Options)) []*replica {
	t.Helper()
	rs := make([]*replica, n)
	first := true
	for i, r := range clustertest.Start(t, n, func(o *server.Options) {
		if opts != nil {
			opts(o)
		}
		if first {
			o.PeerTransport, first = via, false
		}
	}) {
		rs[i] = &replica{r}
	}
	return rs
}

func (r *replica) api(key string) *remote.Client { return remote.NewClient(r.URL, key) }

// host is the replica's host:port.
func (r *replica) host() string {
	u, _ := url.Parse(r.URL)
	return u.Host
}

// front is a path of a client's own to the replica: Retarget it to send
// the client's next connection to another one, Cut it to drop it.
func (r *replica) front(t testing.TB) *tcpproxy.Proxy {
	return tcpproxy.Start(t, "127.0.0.1:0", r.host())
}

func (r *replica) key(t testing.TB, kind auth.Kind, userID string) string {
	t.Helper()
	k, err := r.Broker.Keys.Create(context.Background(), kind, userID, "cluster-test")
	require.NoError(t, err)
	return k.Secret
}

// clusterAgent connects a console agent with flows contexts to base.
func clusterAgent(t testing.TB, base, key, clientID string, flows int, handlers map[string]agent.Handler) *agent.Agent {
	t.Helper()
	a := agent.New(agent.Config{URL: base, Token: key, ClientID: clientID, Name: "cluster-test", Flows: flows,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	a.Handle("echo", agent.Echo())
	for name, h := range handlers {
		a.Handle(name, h)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	select {
	case <-a.Connected():
	case err := <-done:
		t.Fatalf("agent stopped: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("agent did not connect")
	}
	// Connected says the report was sent; the broker applies it soon after.
	waitContexts(t, base, clientID, flows)
	return a
}

// waitContexts waits until every replica's view shows clientID connected
// with flows live contexts, none of them not live.
func waitContexts(t testing.TB, base, clientID string, flows int) {
	t.Helper()
	admin := remote.NewClient(base, clusterAdminKey)
	require.Eventually(t, func() bool {
		var clients struct{ Clients []registry.ClientView }
		var pools struct{ Pools []registry.PoolView }
		if admin.Do(context.Background(), "GET", "/api/v1/admin/clients", nil, &clients) != nil ||
			admin.Do(context.Background(), "GET", "/api/v1/admin/pools", nil, &pools) != nil {
			return false
		}
		live := false
		for _, c := range clients.Clients {
			live = live || (c.ClientID == clientID && c.Connected && c.Contexts == flows)
		}
		for _, p := range pools.Pools {
			live = live && p.Contexts[cheetah.StateNotLive] == 0
		}
		return live
	}, 20*time.Second, 5*time.Millisecond, "client %s and its %d contexts are live", clientID, flows)
}

type leaseAnswer struct {
	Lease cheetah.Lease `json:"lease"`
}

func acquireOn(t testing.TB, c *remote.Client, body map[string]any) (cheetah.Lease, error) {
	t.Helper()
	var got leaseAnswer
	err := c.Do(context.Background(), "POST", "/api/v1/acquire", body, &got)
	return got.Lease, err
}

func requireLost(t *testing.T, err error, reason cheetah.LostReason) {
	t.Helper()
	var lost *cheetah.LeaseLostError
	require.ErrorAs(t, err, &lost)
	require.Equal(t, reason, lost.Reason)
}

// Every route works on every replica, whichever replica holds the client.
func TestClusterAnyReplicaServesAnything(t *testing.T) {
	t.Parallel()
	rs := startCluster(t, 3)
	ctx := context.Background()
	appKey := rs[1].key(t, auth.App, "")
	clientKey := rs[2].key(t, auth.Client, user)
	clusterAgent(t, rs[0].URL, clientKey, "agent-a", 2, nil)
	holder := rs[0].Broker.Cluster.ID()

	// Acquired on replica 2: the context is on replica 0.
	l, err := acquireOn(t, rs[2].api(appKey), map[string]any{"user_id": user, "task_id": "t1", "client_type": "console"})
	require.NoError(t, err)
	require.Equal(t, "agent-a", l.ClientID)
	tag, _ := registry.TokenTagOf(l.LeaseToken)
	require.Equal(t, holder, tag, "the token names the replica that holds the lease")

	// Sent and waited for through replica 1.
	var waited struct{ Resolution cheetah.Resolution }
	require.NoError(t, rs[1].api(appKey).Do(ctx, "POST", "/api/v1/commands/wait",
		map[string]any{"name": "echo", "params": map[string]int{"n": 1}}, &waited, "X-Lease", l.LeaseToken))
	require.Equal(t, cheetah.StatusCompleted, waited.Resolution.Status)
	// Its record is in the one history, readable anywhere.
	var read struct{ Command cheetah.CommandRecord }
	require.NoError(t, rs[2].api(appKey).Do(ctx, "GET", "/api/v1/users/"+user+"/commands/"+waited.Resolution.CommandID, nil, &read))
	require.Equal(t, cheetah.StatusCompleted, read.Command.Status)

	// Renewed through replica 2.
	var renewed leaseAnswer
	require.NoError(t, rs[2].api(appKey).Do(ctx, "POST", "/api/v1/lease/renew", map[string]any{"ttl_s": 120}, &renewed, "X-Lease", l.LeaseToken))
	require.Equal(t, l.Epoch, renewed.Lease.Epoch)
	require.Equal(t, 120, renewed.Lease.TTLSeconds)

	// Views cover the cluster, from any replica.
	for i, r := range rs {
		var task struct{ Leases []cheetah.Lease }
		require.NoError(t, r.api(appKey).Do(ctx, "GET", "/api/v1/users/"+user+"/tasks/t1/leases", nil, &task))
		require.Len(t, task.Leases, 1, "replica %d", i)
		require.Equal(t, l.Epoch, task.Leases[0].Epoch)
		require.Empty(t, task.Leases[0].LeaseToken)

		var avail struct{ Contexts []cheetah.ContextSnapshot }
		require.NoError(t, r.api(appKey).Do(ctx, "GET", "/api/v1/users/"+user+"/contexts/available", nil, &avail))
		require.Len(t, avail.Contexts, 1, "replica %d: one of two contexts is leased", i)

		var clients struct{ Clients []registry.ClientView }
		require.NoError(t, r.api(clusterAdminKey).Do(ctx, "GET", "/api/v1/admin/clients", nil, &clients))
		require.Len(t, clients.Clients, 1)
		require.Equal(t, holder, clients.Clients[0].Replica)

		var pools struct{ Pools []registry.PoolView }
		require.NoError(t, r.api(clusterAdminKey).Do(ctx, "GET", "/api/v1/admin/pools", nil, &pools))
		require.Len(t, pools.Pools, 1)
		require.Equal(t, 1, pools.Pools[0].Leases)
		require.Equal(t, 1, pools.Pools[0].Contexts[cheetah.StateIdle])

		var leases struct{ Leases []cheetah.Lease }
		require.NoError(t, r.api(clusterAdminKey).Do(ctx, "GET", "/api/v1/admin/leases", nil, &leases))
		require.Len(t, leases.Leases, 1)
	}

	// Released through replica 1; every replica then says so.
	var rel struct{ Released bool }
	require.NoError(t, rs[1].api(appKey).Do(ctx, "POST", "/api/v1/lease/release", nil, &rel, "X-Lease", l.LeaseToken))
	require.True(t, rel.Released)
	for _, r := range rs {
		err := r.api(appKey).Do(ctx, "POST", "/api/v1/commands", map[string]any{"name": "echo"}, nil, "X-Lease", l.LeaseToken)
		requireLost(t, err, cheetah.LostReleased)
	}

	// Release-all from any replica finds the leases wherever they are.
	l1, err := acquireOn(t, rs[1].api(appKey), map[string]any{"user_id": user, "task_id": "t2", "client_type": "console"})
	require.NoError(t, err)
	l2, err := acquireOn(t, rs[2].api(appKey), map[string]any{"user_id": user, "task_id": "t2", "client_type": "console"})
	require.NoError(t, err)
	require.NotEqual(t, l1.ContextID, l2.ContextID)
	var all struct{ Released int }
	require.NoError(t, rs[2].api(appKey).Do(ctx, "POST", "/api/v1/lease/release-all",
		map[string]any{"lease_tokens": []string{l1.LeaseToken, l2.LeaseToken, "0123"}}, &all))
	require.Equal(t, 2, all.Released)

	// An admin on replica 2 revokes a lease that replica 0 holds.
	l3, err := acquireOn(t, rs[1].api(appKey), map[string]any{"user_id": user, "task_id": "t3", "client_type": "console"})
	require.NoError(t, err)
	var revoked struct{ Revoked bool }
	require.NoError(t, rs[2].api(clusterAdminKey).Do(ctx, "POST",
		"/api/v1/admin/users/"+user+"/clients/agent-a/contexts/"+l3.ContextID+"/revoke", nil, &revoked))
	require.True(t, revoked.Revoked)
	err = rs[1].api(appKey).Do(ctx, "POST", "/api/v1/commands", map[string]any{"name": "echo"}, nil, "X-Lease", l3.LeaseToken)
	requireLost(t, err, cheetah.LostRevoked)

	// Each replica's metrics say how many replicas it sees, and that it
	// acts; no label names a replica.
	resp, err := http.Get(rs[1].URL + "/metrics")
	require.NoError(t, err)
	metrics, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Regexp(t, `(?m)^cheetah_replicas(\{[^}]*\})? 3$`, string(metrics))
	require.Regexp(t, `(?m)^cheetah_replica_valid(\{[^}]*\})? 1$`, string(metrics))
	require.NotContains(t, string(metrics), rs[0].Broker.Cluster.ID())

	// A token of no replica is an unknown lease everywhere.
	err = rs[1].api(appKey).Do(ctx, "POST", "/api/v1/commands", map[string]any{"name": "echo"}, nil, "X-Lease", "ffffffff000000000000000000000000")
	requireLost(t, err, cheetah.LostUnknownLease)
}

// An acquire that waits on one replica gets the context another replica's
// client frees, and a key revoked on one replica disconnects its client on
// another.
func TestClusterWaitAndRevokeKeyAcrossReplicas(t *testing.T) {
	t.Parallel()
	rs := startCluster(t, 2)
	ctx := context.Background()
	appKey := rs[0].key(t, auth.App, "")
	clientKey := rs[0].key(t, auth.Client, user)
	a := clusterAgent(t, rs[0].URL, clientKey, "agent-w", 1, nil)

	held, err := acquireOn(t, rs[0].api(appKey), map[string]any{"user_id": user, "task_id": "t1", "client_type": "console"})
	require.NoError(t, err)

	got := make(chan error, 1)
	var waited cheetah.Lease
	go func() {
		var err error
		waited, err = acquireOn(t, rs[1].api(appKey), map[string]any{"user_id": user, "task_id": "t2", "client_type": "console", "wait_ms": 20000})
		got <- err
	}()
	// The waiter is parked on replica 1 until the release below.
	require.Eventually(t, func() bool {
		var pools struct{ Pools []registry.PoolView }
		return rs[1].api(clusterAdminKey).Do(ctx, "GET", "/api/v1/admin/pools", nil, &pools) == nil &&
			len(pools.Pools) == 1 && pools.Pools[0].Waiters == 1
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, rs[0].api(appKey).Do(ctx, "POST", "/api/v1/lease/release", nil, nil, "X-Lease", held.LeaseToken))
	select {
	case err := <-got:
		require.NoError(t, err)
		require.Equal(t, held.ContextID, waited.ContextID)
		require.Greater(t, waited.Epoch, held.Epoch)
	case <-time.After(30 * time.Second):
		t.Fatal("the waiting acquire never got the freed context")
	}

	// The client key is revoked through replica 1; its client is on 0.
	var keys struct {
		Keys []struct {
			ID   string `json:"id"`
			Kind string `json:"kind"`
		}
	}
	require.NoError(t, rs[1].api(clusterAdminKey).Do(ctx, "GET", "/api/v1/admin/keys", nil, &keys))
	var clientKeyID string
	for _, k := range keys.Keys {
		if k.Kind == string(auth.Client) {
			clientKeyID = k.ID
		}
	}
	require.NotEmpty(t, clientKeyID)
	var rk struct{ Disconnected int }
	require.NoError(t, rs[1].api(clusterAdminKey).Do(ctx, "DELETE", "/api/v1/admin/keys/"+clientKeyID, nil, &rk))
	require.Equal(t, 1, rk.Disconnected)
	require.Eventually(t, func() bool { return !connected(a) }, 10*time.Second, 5*time.Millisecond)

	// An app key used on every replica (each caches it), revoked on one,
	// is refused on every one at once.
	for _, r := range rs {
		require.NoError(t, r.api(appKey).Do(ctx, "GET", "/api/v1/users/"+user+"/contexts/available", nil, nil))
	}
	appKeyID := ""
	require.NoError(t, rs[0].api(clusterAdminKey).Do(ctx, "GET", "/api/v1/admin/keys", nil, &keys))
	for _, k := range keys.Keys {
		if k.Kind == string(auth.App) {
			appKeyID = k.ID
		}
	}
	require.NoError(t, rs[0].api(clusterAdminKey).Do(ctx, "DELETE", "/api/v1/admin/keys/"+appKeyID, nil, nil))
	for i, r := range rs {
		err := r.api(appKey).Do(ctx, "GET", "/api/v1/users/"+user+"/contexts/available", nil, nil)
		require.ErrorIs(t, err, cheetah.ErrUnauthorized, "replica %d", i)
	}
}

// A replica cut off from PostgreSQL stops acting: it answers 503, closes
// its clients, and a lease it held is not served by anyone; healed, it
// takes clients again.
func TestClusterCutOffReplicaStopsActing(t *testing.T) {
	t.Parallel()
	rs := startCluster(t, 2)
	ctx := context.Background()
	appKey := rs[1].key(t, auth.App, "")
	clientKey := rs[1].key(t, auth.Client, user)
	a := clusterAgent(t, rs[0].URL, clientKey, "agent-f", 1, nil)
	l, err := acquireOn(t, rs[1].api(appKey), map[string]any{"user_id": user, "task_id": "t1", "client_type": "console"})
	require.NoError(t, err)

	rs[0].Link.Cut()
	require.Eventually(t, func() bool { return !rs[0].Broker.Cluster.Valid() }, 10*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { return !connected(a) }, 10*time.Second, 5*time.Millisecond)
	resp, err := http.Get(rs[0].URL + "/readyz")
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	err = rs[0].api(appKey).Do(ctx, "POST", "/api/v1/commands", map[string]any{"name": "echo"}, nil, "X-Lease", l.LeaseToken)
	require.ErrorIs(t, err, cheetah.ErrStoreUnavailable)
	// Through the other replica the send fails too, never succeeds: the
	// fenced replica refuses what is passed to it.
	err = rs[1].api(appKey).Do(ctx, "POST", "/api/v1/commands", map[string]any{"name": "echo"}, nil, "X-Lease", l.LeaseToken)
	require.Error(t, err)

	rs[0].Link.Heal()
	require.Eventually(t, rs[0].Broker.Cluster.Valid, 10*time.Second, 5*time.Millisecond)
	select {
	case <-a.Connected():
	case <-time.After(20 * time.Second):
		t.Fatal("the agent did not connect again")
	}
}

func connected(a *agent.Agent) bool {
	_, ok := a.Session()
	return ok
}

// A client that reconnects to another replica (a balancer sent it there)
// keeps its leases and their epochs, as a reconnect to one node does;
// requests with the old token, through any replica, reach it there.
func TestClusterClientMovesWithItsLeases(t *testing.T) {
	t.Parallel()
	rs := startCluster(t, 3)
	ctx := context.Background()
	appKey := rs[0].key(t, auth.App, "")
	clientKey := rs[0].key(t, auth.Client, user)
	front := rs[0].front(t)
	clusterAgent(t, "http://"+front.Addr(), clientKey, "agent-m", 2, nil)

	l, err := acquireOn(t, rs[1].api(appKey), map[string]any{"user_id": user, "task_id": "t1", "client_type": "console"})
	require.NoError(t, err)
	tag, _ := registry.TokenTagOf(l.LeaseToken)
	require.Equal(t, rs[0].Broker.Cluster.ID(), tag)

	// The connection drops; the agent comes back through replica 1.
	front.Retarget(rs[1].host())
	front.Cut()
	front.Heal()
	require.Eventually(t, func() bool {
		var clients struct{ Clients []registry.ClientView }
		return rs[2].api(clusterAdminKey).Do(ctx, "GET", "/api/v1/admin/clients", nil, &clients) == nil &&
			len(clients.Clients) == 1 && clients.Clients[0].Connected && clients.Clients[0].Replica == rs[1].Broker.Cluster.ID()
	}, 20*time.Second, 10*time.Millisecond, "the agent is on replica 1")
	waitContexts(t, rs[2].URL, "agent-m", 2)

	// The old token works through every replica, on the same epoch.
	for i, r := range rs {
		var waited struct{ Resolution cheetah.Resolution }
		require.NoError(t, r.api(appKey).Do(ctx, "POST", "/api/v1/commands/wait", map[string]any{"name": "echo"}, &waited,
			"X-Lease", l.LeaseToken), "through replica %d", i)
		require.Equal(t, cheetah.StatusCompleted, waited.Resolution.Status)
		var rec struct{ Command cheetah.CommandRecord }
		require.NoError(t, r.api(appKey).Do(ctx, "GET", "/api/v1/users/"+user+"/commands/"+waited.Resolution.CommandID, nil, &rec))
		require.Equal(t, l.Epoch, rec.Command.Epoch)
		require.Equal(t, l.ContextID, rec.Command.ContextID)
	}
	var leases struct{ Leases []cheetah.Lease }
	require.NoError(t, rs[0].api(clusterAdminKey).Do(ctx, "GET", "/api/v1/admin/leases", nil, &leases))
	require.Len(t, leases.Leases, 1, "the lease moved; it is not held twice")
	require.Equal(t, l.Epoch, leases.Leases[0].Epoch)

	// Released through the replica that issued it, it ends where it is.
	var rel struct{ Released bool }
	require.NoError(t, rs[0].api(appKey).Do(ctx, "POST", "/api/v1/lease/release", nil, &rel, "X-Lease", l.LeaseToken))
	require.True(t, rel.Released)
	err = rs[2].api(appKey).Do(ctx, "POST", "/api/v1/commands", map[string]any{"name": "echo"}, nil, "X-Lease", l.LeaseToken)
	requireLost(t, err, cheetah.LostReleased)
}

// A replica cut off from everything (its database link and its clients'
// connections) loses no lease: it forgets what it held once it may no
// longer act, the others reap it, and the replica its client reconnects to
// adopts the lease rows with their epochs. The old token works through
// every replica, the cut-off one too once it is back, and the lease is held
// once.
func TestClusterLeasesSurviveTheirReplica(t *testing.T) {
	t.Parallel()
	rs := startCluster(t, 3)
	ctx := context.Background()
	appKey := rs[1].key(t, auth.App, "")
	clientKey := rs[1].key(t, auth.Client, user)
	front := rs[0].front(t)
	clusterAgent(t, "http://"+front.Addr(), clientKey, "agent-s", 2, nil)

	l, err := acquireOn(t, rs[1].api(appKey), map[string]any{"user_id": user, "task_id": "t1", "client_type": "console"})
	require.NoError(t, err)
	lost := rs[0].Broker.Cluster.ID()
	tag, _ := registry.TokenTagOf(l.LeaseToken)
	require.Equal(t, lost, tag)

	// Replica 0 is cut off; its client comes back through replica 1.
	rs[0].Link.Cut()
	front.Retarget(rs[1].host())
	front.Cut()
	front.Heal()
	require.Eventually(t, func() bool { return !rs[0].Broker.Cluster.Valid() }, 20*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		for _, r := range rs[1:] {
			for _, p := range r.Broker.Cluster.Peers() {
				if p.ID == lost {
					return false
				}
			}
		}
		return rs[1].Broker.Registry.Holds(l.LeaseToken)
	}, 30*time.Second, 10*time.Millisecond, "replica 1 adopts the lease once replica 0 is reaped")
	waitContexts(t, rs[1].URL, "agent-s", 2) // live again, the report in

	send := func(r *replica) cheetah.CommandRecord {
		t.Helper()
		var waited struct{ Resolution cheetah.Resolution }
		require.NoError(t, r.api(appKey).Do(ctx, "POST", "/api/v1/commands/wait", map[string]any{"name": "echo"}, &waited,
			"X-Lease", l.LeaseToken))
		require.Equal(t, cheetah.StatusCompleted, waited.Resolution.Status)
		var rec struct{ Command cheetah.CommandRecord }
		require.NoError(t, r.api(appKey).Do(ctx, "GET", "/api/v1/users/"+user+"/commands/"+waited.Resolution.CommandID, nil, &rec))
		return rec.Command
	}
	for _, r := range rs[1:] {
		rec := send(r)
		require.Equal(t, l.Epoch, rec.Epoch)
		require.Equal(t, l.ContextID, rec.ContextID)
	}

	// Back on the database, replica 0 holds nothing and passes the token on.
	rs[0].Link.Heal()
	require.Eventually(t, rs[0].Broker.Cluster.Valid, 20*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return len(rs[1].Broker.Cluster.Peers()) == 2 }, 20*time.Second, 10*time.Millisecond)
	require.False(t, rs[0].Broker.Registry.Holds(l.LeaseToken))
	require.Equal(t, l.Epoch, send(rs[0]).Epoch)
	var leases struct{ Leases []cheetah.Lease }
	require.NoError(t, rs[2].api(clusterAdminKey).Do(ctx, "GET", "/api/v1/admin/leases", nil, &leases))
	require.Len(t, leases.Leases, 1, "held once")
}

// A replica passes on the key it authenticated the caller with (a console
// session has none to pass): the receiver takes it when the request is
// signed, and ignores it when not.
func TestClusterPeerKeyNeedsASignature(t *testing.T) {
	t.Parallel()
	rs := startCluster(t, 2)
	k, err := rs[0].Broker.Keys.Create(context.Background(), auth.Admin, "", "peer-key-test")
	require.NoError(t, err)
	get := func(sign bool) int {
		req, err := http.NewRequest("GET", rs[1].URL+"/api/v1/admin/pools", nil)
		require.NoError(t, err)
		req.Header.Set(cluster.PeerKeyHeader, k.ID)
		if sign {
			require.NoError(t, rs[0].Broker.Cluster.Sign(req))
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, get(true))
	require.Equal(t, http.StatusUnauthorized, get(false))
}

// PostgreSQL goes away under a load on three replicas (every replica's
// link cut) and comes back: the replicas fail closed (nothing succeeds
// while they cannot reach it; acquires and sends answer 503), recover
// without a restart, and every command id a caller was given has a record
// that ends.
func TestClusterDatabaseAwayAndBack(t *testing.T) {
	t.Parallel()
	rs := startCluster(t, 3)
	ctx := context.Background()
	appKey := rs[0].key(t, auth.App, "")
	clientKey := rs[0].key(t, auth.Client, user)
	for i := range 3 {
		clusterAgent(t, rs[i].URL, clientKey, fmt.Sprintf("agent-%d", i), 2, nil)
	}
	var mu sync.Mutex
	var ids []string
	var okDuringOutage atomic.Int64
	var away atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			api := rs[w%3].api(appKey)
			for {
				select {
				case <-stop:
					return
				default:
				}
				l, err := acquireOn(t, api, map[string]any{"user_id": user, "task_id": fmt.Sprintf("w%d", w), "client_type": "console", "wait_ms": 100})
				if err != nil {
					continue
				}
				if away.Load() {
					okDuringOutage.Add(1)
				}
				var sent cheetah.Sent
				if api.Do(ctx, "POST", "/api/v1/commands", map[string]any{"name": "echo"}, &sent, "X-Lease", l.LeaseToken) == nil {
					if away.Load() {
						okDuringOutage.Add(1)
					}
					mu.Lock()
					ids = append(ids, sent.CommandID)
					mu.Unlock()
				}
				_ = api.Do(ctx, "POST", "/api/v1/lease/release", nil, nil, "X-Lease", l.LeaseToken)
			}
		})
	}
	// Some work goes through, then the database goes away for everyone.
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(ids) >= 20 }, 30*time.Second, 5*time.Millisecond)
	for _, r := range rs {
		r.Link.Cut()
	}
	require.Eventually(t, func() bool {
		for _, r := range rs {
			if r.Broker.Cluster.Valid() {
				return false
			}
		}
		return true
	}, 30*time.Second, 5*time.Millisecond, "every replica fences")
	away.Store(true)
	for _, r := range rs {
		_, err := acquireOn(t, r.api(appKey), map[string]any{"user_id": user, "task_id": "probe", "client_type": "console"})
		require.ErrorIs(t, err, cheetah.ErrStoreUnavailable)
	}
	away.Store(false)
	before := func() int { mu.Lock(); defer mu.Unlock(); return len(ids) }()
	for _, r := range rs {
		r.Link.Heal()
	}
	// Back without a restart: work goes through again.
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(ids) >= before+20 }, 60*time.Second, 10*time.Millisecond)
	close(stop)
	wg.Wait()
	require.Zero(t, okDuringOutage.Load(), "nothing succeeded while every replica was fenced")
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		require.Eventually(t, func() bool {
			var rec struct{ Command cheetah.CommandRecord }
			return rs[0].api(appKey).Do(ctx, "GET", "/api/v1/users/"+user+"/commands/"+id, nil, &rec) == nil && rec.Command.Status.Terminal()
		}, 30*time.Second, 10*time.Millisecond, "command %s ends", id)
	}
}

// A client that moves twice (0 → 1 → 2, as behind a balancer without
// stickiness) keeps its lease reachable through every replica: each
// replica it left passes requests on to where it went.
func TestClusterClientMovesTwice(t *testing.T) {
	t.Parallel()
	rs := startCluster(t, 3)
	ctx := context.Background()
	appKey := rs[0].key(t, auth.App, "")
	clientKey := rs[0].key(t, auth.Client, user)
	front := rs[0].front(t)
	clusterAgent(t, "http://"+front.Addr(), clientKey, "agent-2m", 1, nil)
	l, err := acquireOn(t, rs[0].api(appKey), map[string]any{"user_id": user, "task_id": "t1", "client_type": "console"})
	require.NoError(t, err)
	for _, to := range []int{1, 2} {
		front.Retarget(rs[to].host())
		front.Cut()
		front.Heal()
		require.Eventually(t, func() bool {
			var clients struct{ Clients []registry.ClientView }
			return rs[to].api(clusterAdminKey).Do(ctx, "GET", "/api/v1/admin/clients", nil, &clients) == nil &&
				len(clients.Clients) == 1 && clients.Clients[0].Connected && clients.Clients[0].Replica == rs[to].Broker.Cluster.ID()
		}, 20*time.Second, 10*time.Millisecond)
		waitContexts(t, rs[to].URL, "agent-2m", 1)
	}
	for i, r := range rs {
		require.NoError(t, r.api(appKey).Do(ctx, "POST", "/api/v1/commands/wait", map[string]any{"name": "echo"}, nil,
			"X-Lease", l.LeaseToken), "through replica %d", i)
	}
}

// A replica draining (a rolling restart) has nothing to give an acquire:
// an acquire that may wait still waits, and gets the context freed here.
func TestClusterDrainingPeerDoesNotFailAcquires(t *testing.T) {
	t.Parallel()
	rs := startCluster(t, 2)
	appKey := rs[0].key(t, auth.App, "")
	clusterAgent(t, rs[0].URL, rs[0].key(t, auth.Client, user), "agent-d", 1, nil)
	l, err := acquireOn(t, rs[0].api(appKey), map[string]any{"user_id": user, "task_id": "t1", "client_type": "console"})
	require.NoError(t, err)
	rs[1].Broker.Server.Drain()
	rs[1].Broker.Registry.Drain()
	got := make(chan error, 1)
	go func() {
		_, err := acquireOn(t, rs[0].api(appKey), map[string]any{"user_id": user, "task_id": "t2", "client_type": "console", "wait_ms": 20000})
		got <- err
	}()
	require.Eventually(t, func() bool { return rs[0].Broker.Registry.Stats().Waiters > 0 }, 10*time.Second, 5*time.Millisecond)
	_, err = rs[0].Broker.Registry.Release(context.Background(), l)
	require.NoError(t, err)
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the acquire never got the freed context")
	}
}

// A replica cut off from the database just long enough to fence, and back
// before the others reap it, gives up what it held before it acts again:
// the lease of its client, now connected elsewhere, is adopted there
// rather than stuck on a live replica that forgot it.
func TestClusterShortOutageGivesLeasesUp(t *testing.T) {
	t.Parallel()
	rs := startCluster(t, 3)
	ctx := context.Background()
	appKey := rs[1].key(t, auth.App, "")
	front := rs[0].front(t)
	clusterAgent(t, "http://"+front.Addr(), rs[1].key(t, auth.Client, user), "agent-so", 1, nil)
	l, err := acquireOn(t, rs[1].api(appKey), map[string]any{"user_id": user, "task_id": "t1", "client_type": "console"})
	require.NoError(t, err)

	rs[0].Link.Cut()
	front.Retarget(rs[1].host())
	require.Eventually(t, func() bool { return !rs[0].Broker.Cluster.Valid() }, 20*time.Second, 5*time.Millisecond)
	rs[0].Link.Heal() // back before the others reap it
	require.Eventually(t, rs[0].Broker.Cluster.Valid, 20*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { return rs[1].Broker.Registry.Holds(l.LeaseToken) }, 20*time.Second, 10*time.Millisecond,
		"the client's replica adopts the lease the fenced one gave up")
	// The lease may come back before the client's report does (its
	// context waited for it from the hello on): not_live until then.
	waitContexts(t, rs[1].URL, "agent-so", 1)
	for i, r := range rs {
		var waited struct{ Resolution cheetah.Resolution }
		require.NoError(t, r.api(appKey).Do(ctx, "POST", "/api/v1/commands/wait", map[string]any{"name": "echo"}, &waited,
			"X-Lease", l.LeaseToken), "through replica %d", i)
		require.Equal(t, cheetah.StatusCompleted, waited.Resolution.Status)
	}
}

// A replica that would advertise the URL of a live one refuses to start:
// joining would take that one's row while it still acts. (A previous life
// at the URL, where nothing answers, is replaced as before.)
func TestClusterRefusesATakenURL(t *testing.T) {
	t.Parallel()
	rs := startCluster(t, 2)
	_, err := server.Open(context.Background(), server.Options{DatabaseURL: rs[0].DatabaseURL, DataDir: t.TempDir(),
		AdminKey: clustertest.AdminKey, AdvertiseURL: rs[0].URL})
	require.ErrorIs(t, err, cluster.ErrURLTaken)
	require.ErrorContains(t, err, rs[0].Broker.Cluster.ID())
	require.True(t, rs[0].Broker.Cluster.Valid())
	rs[1].Broker.Cluster.Refresh(context.Background())
	require.Equal(t, []cluster.Peer{{ID: rs[0].Broker.Cluster.ID(), URL: rs[0].URL}}, rs[1].Broker.Cluster.Peers(),
		"its row is still there")
	resp, err := http.Get(rs[0].URL + "/healthz")
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, rs[0].Broker.Cluster.ID(), resp.Header.Get(cluster.ReplicaHeader), "every answer names its replica")
}

// Acquires that wait on different replicas get a context freed on any
// replica first come first served, as on one registry: each waits in every
// replica's queue at once, and the waits it did not need are withdrawn.
func TestClusterWaitersAreServedInOrder(t *testing.T) {
	t.Parallel()
	rs := startCluster(t, 3)
	ctx := context.Background()
	appKey := rs[0].key(t, auth.App, "")
	// The one context is on the last replica, where a wait held by its own
	// registry would come first were the queues not one.
	clusterAgent(t, rs[2].URL, rs[2].key(t, auth.Client, user), "agent-fifo", 1, nil)
	held, err := acquireOn(t, rs[0].api(appKey), map[string]any{"user_id": user, "task_id": "t0", "client_type": "console"})
	require.NoError(t, err)

	const waiters = 7
	var mu sync.Mutex
	var served []string
	var wg sync.WaitGroup
	errs := make(chan error, waiters)
	for i := range waiters {
		task := fmt.Sprintf("w%d", i)
		r := rs[(i+1)%len(rs)] // starting with another replica than the client's
		wg.Go(func() {
			l, err := acquireOn(t, r.api(appKey), map[string]any{"user_id": user, "task_id": task, "client_type": "console", "wait_ms": 60000})
			if err != nil {
				errs <- fmt.Errorf("%s: %w", task, err)
				return
			}
			mu.Lock()
			served = append(served, task)
			mu.Unlock()
			errs <- r.api(appKey).Do(ctx, "POST", "/api/v1/lease/release", nil, nil, "X-Lease", l.LeaseToken)
		})
		// The next comes once this one waits on every replica.
		require.Eventually(t, func() bool {
			own := 0
			for _, r := range rs {
				st := r.Broker.Registry.Stats()
				if st.Waiters+st.StandIns != i+1 {
					return false
				}
				own += st.Waiters
			}
			return own == i+1
		}, 10*time.Second, 2*time.Millisecond, "waiter %d waits on every replica", i)
	}
	require.NoError(t, rs[0].api(appKey).Do(ctx, "POST", "/api/v1/lease/release", nil, nil, "X-Lease", held.LeaseToken))
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	want := make([]string, waiters)
	for i := range want {
		want[i] = fmt.Sprintf("w%d", i)
	}
	require.Equal(t, want, served, "served first come first served")
	// Nothing is left waiting or held on any replica.
	require.Eventually(t, func() bool {
		for _, r := range rs {
			st := r.Broker.Registry.Stats()
			if st.Waiters+st.StandIns+st.Leases != 0 {
				return false
			}
		}
		return true
	}, 10*time.Second, 5*time.Millisecond)
}

// A waiting acquire that runs out of time withdraws its waits everywhere.
// (A withdrawal that overtakes its wait: TestStandInsWithdraw.)
func TestClusterWaitRunsOutEverywhere(t *testing.T) {
	t.Parallel()
	rs := startCluster(t, 3)
	appKey := rs[0].key(t, auth.App, "")
	clusterAgent(t, rs[1].URL, rs[1].key(t, auth.Client, user), "agent-out", 1, nil)
	_, err := acquireOn(t, rs[0].api(appKey), map[string]any{"user_id": user, "task_id": "t0", "client_type": "console"})
	require.NoError(t, err)
	start := time.Now()
	_, err = acquireOn(t, rs[2].api(appKey), map[string]any{"user_id": user, "task_id": "t1", "client_type": "console", "wait_ms": 300})
	var nc *cheetah.NoContextError
	require.ErrorAs(t, err, &nc)
	require.Equal(t, cheetah.ReasonNoIdleWorker, nc.Reason)
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	for i, r := range rs {
		st := r.Broker.Registry.Stats()
		require.Zero(t, st.Waiters+st.StandIns, "replica %d", i)
	}
}

// A lease that no replica holds while its row is there (its replica died,
// and the replica its client reconnected to has not adopted it yet) is
// answered 503 on every replica, never lease_lost: it is back in a moment.
// A revoke of its context is 503 too, never "no lease".
func TestClusterLeaseAwaitingAdoptionIsUnavailable(t *testing.T) {
	t.Parallel()
	rs := startCluster(t, 2)
	ctx := context.Background()
	appKey := rs[0].key(t, auth.App, "")
	// The token of a replica that is no member (it died and was reaped),
	// whose row is still there.
	token := "dead0000" + "0123456789abcdef01234567"
	require.NoError(t, rs[0].Broker.Store.Write(ctx, history.PutLease{Kind: history.LeaseNew, TokenDigest: registry.TokenDigest(token),
		UserID: user, ClientID: "gone", ContextID: "w1", TaskID: "t", Epoch: 7, TTL: time.Minute, ExpiresAt: time.Now().Add(time.Minute)}))
	for i, r := range rs {
		for _, route := range []string{"/api/v1/lease/renew", "/api/v1/commands", "/api/v1/lease/release"} {
			err := r.api(appKey).Do(ctx, "POST", route, map[string]any{"name": "echo"}, nil, "X-Lease", token)
			require.ErrorIs(t, err, cheetah.ErrStoreUnavailable, "replica %d, %s", i, route)
		}
	}
	// Nor does a revoke of its context find no lease once the row is an
	// orphan (its replica gave it up); a context without one has none.
	revoke := func(r *replica, contextID string) (bool, error) {
		var revoked struct{ Revoked bool }
		err := r.api(clusterAdminKey).Do(ctx, "POST", "/api/v1/admin/users/"+user+"/clients/gone/contexts/"+contextID+"/revoke", nil, &revoked)
		return revoked.Revoked, err
	}
	require.NoError(t, rs[0].Broker.Store.AbandonReplica(ctx, rs[0].Broker.Cluster.ID(), time.Now()))
	for i, r := range rs {
		_, err := revoke(r, "w1")
		require.ErrorIs(t, err, cheetah.ErrStoreUnavailable, "replica %d, revoke", i)
		revoked, err := revoke(r, "w2")
		require.NoError(t, err)
		require.False(t, revoked, "replica %d: no row, no lease", i)
	}
	// A token without a row is lost, as on one node.
	err := rs[1].api(appKey).Do(ctx, "POST", "/api/v1/lease/renew", nil, nil, "X-Lease", "dead0000"+"fedcba9876543210fedcba98")
	requireLost(t, err, cheetah.LostUnknownLease)
}

// losingAnswers carries requests to the other replicas, and loses the
// answer of those whose path ends with one of suffixes after the peer
// acted on them, as when a replica dies right after doing a request's work.
type losingAnswers struct{ suffixes []string }

func (l losingAnswers) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	for _, s := range l.suffixes {
		if strings.HasSuffix(req.URL.Path, s) {
			_ = resp.Body.Close()
			return nil, io.ErrUnexpectedEOF
		}
	}
	return resp, nil
}

// An action that another replica may have done without its answer coming
// back is answered 503, never as if it had not been done: an acquire (the
// lease made there is held by nobody, so none is made on top of it), a
// revoke, a release-all.
func TestClusterLostAnswersAreUnknown(t *testing.T) {
	t.Parallel()
	rs := startClusterVia(t, 2, losingAnswers{suffixes: []string{"/api/v1/acquire", "/revoke", "/release-all"}}, nil)
	ctx := context.Background()
	appKey := rs[1].key(t, auth.App, "")
	clusterAgent(t, rs[1].URL, rs[1].key(t, auth.Client, user), "agent-lost", 2, nil)

	// Replica 0 passes the acquire to replica 1, which leases a context.
	_, err := acquireOn(t, rs[0].api(appKey), map[string]any{"user_id": user, "task_id": "t1", "client_type": "console"})
	require.ErrorIs(t, err, cheetah.ErrStoreUnavailable)
	require.Equal(t, 1, rs[1].Broker.Registry.Stats().Leases, "the lease whose answer was lost")

	held, err := acquireOn(t, rs[1].api(appKey), map[string]any{"user_id": user, "task_id": "t2", "client_type": "console"})
	require.NoError(t, err)
	err = rs[0].api(clusterAdminKey).Do(ctx, "POST", "/api/v1/admin/users/"+user+"/clients/agent-lost/contexts/"+held.ContextID+"/revoke", nil, nil)
	require.ErrorIs(t, err, cheetah.ErrStoreUnavailable)
	requireLost(t, rs[1].api(appKey).Do(ctx, "POST", "/api/v1/lease/renew", nil, nil, "X-Lease", held.LeaseToken), cheetah.LostRevoked)

	again, err := acquireOn(t, rs[1].api(appKey), map[string]any{"user_id": user, "task_id": "t3", "client_type": "console"})
	require.NoError(t, err)
	err = rs[0].api(appKey).Do(ctx, "POST", "/api/v1/lease/release-all", map[string]any{"lease_tokens": []string{again.LeaseToken}}, nil)
	require.ErrorIs(t, err, cheetah.ErrStoreUnavailable)
	requireLost(t, rs[1].api(appKey).Do(ctx, "POST", "/api/v1/lease/renew", nil, nil, "X-Lease", again.LeaseToken), cheetah.LostReleased)
}

// heldHandOvers carries requests to the other replicas, and holds each
// hand-over request until release is closed or the request is given up:
// asked hears of each one as it arrives, done as it ends.
type heldHandOvers struct {
	release     chan struct{}
	asked, done chan error
}

func (h *heldHandOvers) RoundTrip(req *http.Request) (*http.Response, error) {
	if !strings.HasSuffix(req.URL.Path, "/hand-over") {
		return http.DefaultTransport.RoundTrip(req)
	}
	h.asked <- nil
	var err error
	select {
	case <-h.release:
	case <-req.Context().Done():
		err = req.Context().Err()
	}
	var resp *http.Response
	if err == nil {
		resp, err = http.DefaultTransport.RoundTrip(req)
	}
	h.done <- err
	return resp, err
}

// A hello under way when its replica fences (waiting on the other replicas
// here; on the database in an outage) ends with its connection: it does
// not go on to take the client over from the replica the client is
// connected to now, which would close that live connection (4409) and take
// its leases into a replica that forgot its clients.
func TestClusterHelloCutByAFenceTakesNothing(t *testing.T) {
	t.Parallel()
	held := &heldHandOvers{release: make(chan struct{}), asked: make(chan error, 1), done: make(chan error, 1)}
	rs := startClusterVia(t, 2, held, func(o *server.Options) {
		o.ReplicaTTL = time.Second
	})
	defer rs[0].Link.Heal()
	appKey := rs[1].key(t, auth.App, "")
	clientKey := rs[1].key(t, auth.Client, user)
	a := clusterAgent(t, rs[1].URL, clientKey, "agent-h", 1, nil)
	l, err := acquireOn(t, rs[1].api(appKey), map[string]any{"user_id": user, "task_id": "t1", "client_type": "console"})
	require.NoError(t, err)

	// A connection of the same client says hello to replica 0, which asks
	// replica 1 for the client; meanwhile replica 0 fences.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, strings.Replace(rs[0].URL, "http", "ws", 1)+"/ws/v1/client", nil)
	require.NoError(t, err)
	defer ws.CloseNow()
	hello, err := protocol.Encode(&protocol.Hello{Protocol: 1, Token: clientKey, ClientID: "agent-h", ClientType: protocol.ClientConsole})
	require.NoError(t, err)
	require.NoError(t, ws.Write(ctx, websocket.MessageText, hello))
	<-held.asked
	rs[0].Link.Cut()
	for {
		if _, _, err := ws.Read(ctx); err != nil {
			require.Equal(t, websocket.StatusGoingAway, websocket.CloseStatus(err), "%v", err)
			break
		}
	}
	require.False(t, rs[0].Broker.Cluster.Valid())
	close(held.release)
	<-held.done

	require.True(t, connected(a), "the client's connection to replica 1 is still there")
	require.True(t, rs[1].Broker.Registry.Holds(l.LeaseToken), "its lease is still held there")
	require.False(t, rs[0].Broker.Registry.Connected(user, "agent-h"))
	require.Zero(t, rs[0].Broker.Registry.Stats().Leases)
}

// A replica that hands a client over makes orphans of the leases' rows it
// gives up: when the answer never reaches the replica the client went to
// (or that replica fences before it adopts the client), that replica
// adopts the leases from their rows instead of leaving their contexts to
// wait out their expiry, held by nobody. It does so also when it hands the
// client over while it cannot reach the database (and has not fenced):
// once it can again.
func TestClusterHandOverLostLeavesOrphans(t *testing.T) {
	t.Parallel()
	for _, outage := range []bool{false, true} {
		t.Run(fmt.Sprintf("through an outage %v", outage), func(t *testing.T) {
			t.Parallel()
			rs := startClusterVia(t, 2, losingAnswers{suffixes: []string{"/hand-over"}}, func(o *server.Options) {
				o.ReplicaTTL = 30 * time.Second // replica 1 does not fence in the outage
			})
			ctx := context.Background()
			appKey := rs[1].key(t, auth.App, "")
			clientKey := rs[1].key(t, auth.Client, user)
			front := rs[1].front(t)
			clusterAgent(t, "http://"+front.Addr(), clientKey, "agent-o", 1, nil)
			l, err := acquireOn(t, rs[1].api(appKey), map[string]any{"user_id": user, "task_id": "t1", "client_type": "console", "ttl_s": 600})
			require.NoError(t, err)

			// The agent comes back through replica 0; replica 1 hands it
			// over, and the answer is lost on the way.
			if outage {
				rs[1].Link.Cut()
			}
			front.Retarget(rs[0].host())
			front.Cut()
			front.Heal()
			if outage {
				require.Eventually(t, func() bool { return !rs[1].Broker.Registry.Connected(user, "agent-o") }, 20*time.Second,
					10*time.Millisecond, "replica 1 handed the client over")
				time.Sleep(7 * time.Second) // the outage's length
				require.True(t, rs[1].Broker.Cluster.Valid(), "replica 1 did not fence")
				rs[1].Link.Heal()
			}
			require.Eventually(t, func() bool { return rs[0].Broker.Registry.Holds(l.LeaseToken) }, 30*time.Second, 10*time.Millisecond,
				"replica 0 adopts the lease from its row")
			require.False(t, rs[1].Broker.Registry.Holds(l.LeaseToken))
			waitContexts(t, rs[0].URL, "agent-o", 1)
			var waited struct{ Resolution cheetah.Resolution }
			require.NoError(t, rs[1].api(appKey).Do(ctx, "POST", "/api/v1/commands/wait", map[string]any{"name": "echo"}, &waited,
				"X-Lease", l.LeaseToken))
			require.Equal(t, cheetah.StatusCompleted, waited.Resolution.Status)
		})
	}
}

// answeredAs carries requests to the other replicas, and makes the answers
// to revokes name replica as the one that answered, as when a replica
// started again at the address of one that died answers there before the
// others read the members again.
type answeredAs struct{ replica string }

func (a answeredAs) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err == nil && strings.HasSuffix(req.URL.Path, "/revoke") {
		resp.Header.Set(cluster.ReplicaHeader, a.replica)
	}
	return resp, err
}

// A revoke that no replica could do finds "no lease" only where no lease
// row stands that a replica which did not answer holds: the replica asked
// must answer itself, not another one at its address.
func TestClusterRevokeCountsOnlyWhoAnswered(t *testing.T) {
	t.Parallel()
	for _, stranger := range []bool{false, true} {
		t.Run(fmt.Sprintf("answered by another replica %v", stranger), func(t *testing.T) {
			t.Parallel()
			var via http.RoundTripper // nil: the default
			if stranger {
				via = answeredAs{replica: "feedbeef"}
			}
			rs := startClusterVia(t, 2, via, nil)
			ctx := context.Background()
			// A row of replica 1 that its registry does not hold (written
			// as if the lease were on its way out).
			require.NoError(t, rs[1].Broker.Store.Write(ctx, history.PutLease{Kind: history.LeaseNew,
				TokenDigest: registry.TokenDigest(rs[1].Broker.Cluster.ID() + "00112233445566778899aabb"), UserID: user, ClientID: "c",
				ContextID: "w1", TaskID: "t", Epoch: 3, TTL: time.Minute, ExpiresAt: time.Now().Add(time.Minute)}))
			var revoked struct{ Revoked bool }
			err := rs[0].api(clusterAdminKey).Do(ctx, "POST", "/api/v1/admin/users/"+user+"/clients/c/contexts/w1/revoke", nil, &revoked)
			if stranger {
				require.ErrorIs(t, err, cheetah.ErrStoreUnavailable, "the row's replica did not answer")
				return
			}
			require.NoError(t, err)
			require.False(t, revoked.Revoked, "the row's replica answered that it holds no lease there")
		})
	}
}

// afterRevokes carries requests to the other replicas, and runs then once
// after each revoke a replica answered, before the answer comes back.
type afterRevokes struct{ then func() }

func (a afterRevokes) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err == nil && strings.HasSuffix(req.URL.Path, "/revoke") {
		a.then()
	}
	return resp, err
}

// An orphaned lease that a replica claims right after it answered a
// revoke "not here" was a lease all along: the revoke is 503, not "no
// lease", although the row is that replica's by the time the answers are
// in.
func TestClusterRevokeAcrossAClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	claim := make(chan func(), 1)
	rs := startClusterVia(t, 2, afterRevokes{then: func() { (<-claim)() }}, nil)
	token := rs[1].Broker.Cluster.ID() + "00112233445566778899aabb"
	require.NoError(t, rs[1].Broker.Store.Write(ctx, history.PutLease{Kind: history.LeaseNew, TokenDigest: registry.TokenDigest(token),
		UserID: user, ClientID: "c", ContextID: "w1", TaskID: "t", Epoch: 3, TTL: time.Minute, ExpiresAt: time.Now().Add(time.Minute)}))
	require.NoError(t, rs[1].Broker.Store.AbandonReplica(ctx, rs[1].Broker.Cluster.ID(), time.Now()))
	claim <- func() {
		rows, err := rs[1].Broker.Store.ClaimOrphanedLeases(ctx, user, "c")
		assert.NoError(t, err)
		assert.Len(t, rows, 1, "replica 1 claims the orphan")
	}
	err := rs[0].api(clusterAdminKey).Do(ctx, "POST", "/api/v1/admin/users/"+user+"/clients/c/contexts/w1/revoke", nil, nil)
	require.ErrorIs(t, err, cheetah.ErrStoreUnavailable)
	require.Empty(t, claim, "the claim ran between the answer and the revoke's own")
}
