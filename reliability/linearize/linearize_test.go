package linearize

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/reliability/internal/rig"
	"github.com/cheetahbroker/cheetah/server"
	"github.com/cheetahbroker/cheetah/server/clustertest"
)

var (
	histories  = flag.Int("linearize.histories", 24, "histories checked against the registry in process (a quarter as many over HTTP)")
	goroutines = flag.Int("linearize.goroutines", 4, "concurrent callers per history")
	opsEach    = flag.Int("linearize.ops", 25, "operations per caller")
)

const nContexts = 3

// check runs porcupine and, on failure, writes the visualisation.
func check(t *testing.T, name string, h []porcupine.Operation) {
	t.Helper()
	res, info := porcupine.CheckOperationsVerbose(Model(nContexts), h, time.Minute)
	switch res {
	case porcupine.Ok:
	case porcupine.Unknown:
		t.Fatalf("%s: porcupine timed out on %d operations", name, len(h))
	default:
		f, err := os.CreateTemp("", "cheetah-linearize-*.html")
		if err == nil {
			_ = porcupine.Visualize(Model(nContexts), info, f)
			f.Close()
		}
		t.Fatalf("%s: the history of %d operations is not linearizable (visualisation: %s): %s", name, len(h), f.Name(), Describe(h))
	}
}

// nullConn takes frames and answers nothing: sends stay in flight, which
// the model does not care about.
type nullConn struct{}

func (nullConn) Send(protocol.Frame) bool         { return true }
func (nullConn) Close(protocol.CloseCode, string) {}

type regDriver struct {
	reg  *registry.Registry
	user string
}

func (d regDriver) Acquire(ctx context.Context) (cheetah.Lease, error) {
	req := cheetah.AcquireRequest{UserID: d.user, TaskID: "lin", ClientType: cheetah.Console, TTL: time.Hour}
	l, err := d.reg.Acquire(ctx, req)
	if errors.Is(err, cheetah.ErrStoreUnavailable) {
		// The block of epochs ran out before the next one was reserved (an
		// acquire never waits for the store): nothing was assigned. With
		// the store up, one more try after the reservation succeeds.
		if rerr := d.reg.ReserveEpochs(ctx); rerr == nil {
			l, err = d.reg.Acquire(ctx, req)
		}
	}
	return l, err
}
func (d regDriver) Release(ctx context.Context, l cheetah.Lease) (bool, error) {
	return d.reg.Release(ctx, l)
}
func (d regDriver) Renew(ctx context.Context, l cheetah.Lease) error {
	_, err := d.reg.Renew(ctx, l, 0)
	return err
}
func (d regDriver) Send(ctx context.Context, l cheetah.Lease) error {
	_, err := d.reg.Send(ctx, l, cheetah.Command{Name: "noop"}, cheetah.SendOptions{ResponseMode: cheetah.ModeNone})
	return err
}
func (d regDriver) Revoke(_ context.Context, i int) (bool, error) {
	return d.reg.Revoke(context.Background(), d.user, "lin-client", fmt.Sprintf("c%d", i))
}
func (d regDriver) ContextIndex(id string) int { return ContextIndex(id) }

// TestRegistryLinearizable checks histories recorded against the registry
// in process, each on a fresh registry over one SQLite store.
func TestRegistryLinearizable(t *testing.T) {
	t.Parallel()
	store := historytest.NewSQLite(t)
	ops := 0
	for i := range *histories {
		reg, err := registry.New(context.Background(), registry.Config{Store: store, EpochBlock: 16})
		require.NoError(t, err)
		att := reg.Connect(registry.ClientInfo{UserID: "usr_lin", ClientID: "lin-client", Type: cheetah.Console}, nullConn{})
		reg.Report(att, Reports(nContexts))
		h := Record(regDriver{reg: reg, user: "usr_lin"}, uint64(i), *goroutines, *opsEach)
		check(t, fmt.Sprintf("registry history %d", i), h)
		ops += len(h)
		if i == 0 {
			t.Logf("history 0: %s", Describe(h))
		}
		reg.Close()
	}
	t.Logf("%d histories, %d operations, all linearizable", *histories, ops)
}

// TestBrokerLinearizable checks histories recorded over the HTTP API of a
// whole broker, with a fake client answering on the contexts.
func TestBrokerLinearizable(t *testing.T) {
	t.Parallel()
	const admin = "linearize-admin-key-0123456789abcdef"
	_, hs := rig.OpenBroker(t, server.Options{DataDir: t.TempDir(), AdminKey: admin})
	n, ops := linearizeOver(t, hs.URL, admin, max(1, *histories/4))
	t.Logf("%d histories over HTTP, %d operations, all linearizable", n, ops)
}

// TestClusterLinearizable is TestBrokerLinearizable against three replicas
// on one PostgreSQL behind a round-robin balancer: every request and the
// fake client's connection land on whichever replica comes next.
func TestClusterLinearizable(t *testing.T) {
	t.Parallel()
	// Not a test of fencing: a TTL no stall of a loaded machine outlasts.
	lb := clustertest.Balancer(t, clustertest.Start(t, 3, func(o *server.Options) { o.ReplicaTTL = 15 * time.Second }))
	n, ops := linearizeOver(t, lb, clustertest.AdminKey, max(1, *histories/4))
	t.Logf("%d histories over three replicas, %d operations, all linearizable", n, ops)
}

// linearizeOver records n histories over the HTTP API at base, one user
// each, and checks each.
func linearizeOver(t *testing.T, base, admin string, n int) (histories, ops int) {
	t.Helper()
	ctx := context.Background()
	api := rig.NewAPI(base)
	defer api.HC.CloseIdleConnections()
	app := api.MakeKey(t, admin, "app", "")
	for i := range n {
		user := fmt.Sprintf("usr_lin_%d", i)
		fc := &rig.FakeClient{URL: base, Key: api.MakeKey(t, admin, "client", user), UserID: user, ClientID: "lin-client", Check: rig.NewChecker()}
		require.NoError(t, fc.Connect(ctx))
		require.NoError(t, fc.Report(Reports(nContexts)...))
		h := Record(HTTPDriver{API: api, App: app, User: user, Client: "lin-client", Admin: admin}, uint64(1000+i), *goroutines, *opsEach)
		check(t, fmt.Sprintf("HTTP history %d", i), h)
		require.Empty(t, fc.Check.Errors())
		fc.Close()
		ops += len(h)
	}
	return n, ops
}

// TestModelRejects makes sure the model is not vacuous: histories that
// break the contract are refused.
func TestModelRejects(t *testing.T) {
	op := func(c int, call, ret int64, in Input, out Output) porcupine.Operation {
		return porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret}
	}
	bad := map[string][]porcupine.Operation{
		"two leases on one context": {
			op(0, 0, 1, Input{Kind: Acquire}, Output{OK: true, Context: 0, Epoch: 1, Lease: 0}),
			op(1, 2, 3, Input{Kind: Acquire}, Output{OK: true, Context: 0, Epoch: 2, Lease: 1}),
		},
		"not the longest idle": {
			op(0, 0, 1, Input{Kind: Acquire}, Output{OK: true, Context: 1, Epoch: 1, Lease: 0}),
		},
		"epoch goes back": {
			op(0, 0, 1, Input{Kind: Acquire}, Output{OK: true, Context: 0, Epoch: 5, Lease: 0}),
			op(1, 2, 3, Input{Kind: Acquire}, Output{OK: true, Context: 1, Epoch: 4, Lease: 1}),
		},
		"send through a released lease": {
			op(0, 0, 1, Input{Kind: Acquire}, Output{OK: true, Context: 0, Epoch: 1, Lease: 0}),
			op(0, 2, 3, Input{Kind: Release, Lease: 0}, Output{OK: true}),
			op(1, 4, 5, Input{Kind: Send, Lease: 0}, Output{OK: true}),
		},
		"wrong reason": {
			op(0, 0, 1, Input{Kind: Acquire}, Output{OK: true, Context: 0, Epoch: 1, Lease: 0}),
			op(0, 2, 3, Input{Kind: Revoke, Context: 0}, Output{OK: true}),
			op(0, 4, 5, Input{Kind: Renew, Lease: 0}, Output{Reason: "released"}),
		},
		"release twice clears twice": {
			op(0, 0, 1, Input{Kind: Acquire}, Output{OK: true, Context: 0, Epoch: 1, Lease: 0}),
			op(0, 2, 3, Input{Kind: Release, Lease: 0}, Output{OK: true}),
			op(0, 4, 5, Input{Kind: Release, Lease: 0}, Output{OK: true}),
		},
		"no context although one is idle": {
			op(0, 0, 1, Input{Kind: Acquire}, Output{}),
		},
	}
	for name, h := range bad {
		require.False(t, porcupine.CheckOperations(Model(nContexts), h), name)
	}
	good := []porcupine.Operation{
		// Two concurrent acquires: the one that returned the lower epoch
		// took the longest idle context first.
		op(0, 0, 10, Input{Kind: Acquire}, Output{OK: true, Context: 1, Epoch: 7, Lease: 0}),
		op(1, 1, 11, Input{Kind: Acquire}, Output{OK: true, Context: 0, Epoch: 3, Lease: 1}),
		op(0, 12, 13, Input{Kind: Revoke, Context: 0}, Output{OK: true}),
		op(0, 14, 15, Input{Kind: Send, Lease: 1}, Output{Reason: "revoked"}),
		op(1, 16, 17, Input{Kind: Release, Lease: 0}, Output{OK: true}),
		op(1, 18, 19, Input{Kind: Acquire}, Output{OK: true, Context: 2, Epoch: 9, Lease: 2}),
		op(1, 20, 21, Input{Kind: Acquire}, Output{OK: true, Context: 0, Epoch: 10, Lease: 3}),
		op(0, 22, 23, Input{Kind: Renew, Lease: 1}, Output{Reason: "reassigned"}),
		op(0, 24, 25, Input{Kind: Release, Lease: 1}, Output{}),
		op(0, 26, 27, Input{Kind: Send, Lease: -1}, Output{Reason: "unknown_lease"}),
	}
	require.True(t, porcupine.CheckOperations(Model(nContexts), good))
	require.True(t, porcupine.CheckOperations(FaultModel(nContexts), good), "what holds without faults holds with them")

	// With a replica's death: what the fault model lets through, and what
	// it still refuses.
	const never = math.MaxInt64
	unknownAcquire := op(2, 0, never, Input{Kind: Acquire}, Output{Unknown: true})
	faultBad := map[string][]porcupine.Operation{
		"two leases on one context": {
			op(0, 0, 1, Input{Kind: Acquire}, Output{OK: true, Context: 1, Epoch: 1, Lease: 0}),
			op(1, 2, 3, Input{Kind: Acquire}, Output{OK: true, Context: 1, Epoch: 2, Lease: 1}),
		},
		"epoch goes back": {
			op(0, 0, 1, Input{Kind: Acquire}, Output{OK: true, Context: 0, Epoch: 5, Lease: 0}),
			op(1, 2, 3, Input{Kind: Acquire}, Output{OK: true, Context: 1, Epoch: 4, Lease: 1}),
		},
		"a released lease comes back": {
			op(0, 0, 1, Input{Kind: Acquire}, Output{OK: true, Context: 0, Epoch: 1, Lease: 0}),
			op(0, 2, 3, Input{Kind: Release, Lease: 0}, Output{OK: true}),
			op(1, 4, 5, Input{Kind: Renew, Lease: 0}, Output{OK: true}),
		},
		"a revoked lease comes back": {
			op(0, 0, 1, Input{Kind: Acquire}, Output{OK: true, Context: 0, Epoch: 1, Lease: 0}),
			op(0, 2, 3, Input{Kind: Revoke, Context: 0}, Output{OK: true}),
			op(1, 4, 5, Input{Kind: Send, Lease: 0}, Output{OK: true}),
		},
		"a token never issued is not_live": {
			op(1, 0, 1, Input{Kind: Send, Lease: -1}, Output{Reason: "not_live"}),
		},
		"a release finds no lease that holds on": {
			op(0, 0, 1, Input{Kind: Acquire}, Output{OK: true, Context: 0, Epoch: 1, Lease: 0}),
			op(0, 2, 3, Input{Kind: Release, Lease: 0}, Output{}),
			op(1, 4, 5, Input{Kind: Renew, Lease: 0}, Output{OK: true}),
		},
		"an active lease is unknown": {
			op(0, 0, 1, Input{Kind: Acquire}, Output{OK: true, Context: 0, Epoch: 1, Lease: 0}),
			op(1, 2, 3, Input{Kind: Send, Lease: 0}, Output{Reason: "unknown_lease"}),
		},
		"a lost answer takes a context held": {
			op(0, 0, 1, Input{Kind: Acquire}, Output{OK: true, Context: 0, Epoch: 1, Lease: 0}),
			op(0, 2, 3, Input{Kind: Acquire}, Output{OK: true, Context: 1, Epoch: 2, Lease: 1}),
			op(0, 4, 5, Input{Kind: Acquire}, Output{OK: true, Context: 2, Epoch: 3, Lease: 2}),
			unknownAcquire,
			op(1, 6, 7, Input{Kind: Release, Lease: 0}, Output{OK: true}),
			op(1, 8, 9, Input{Kind: Revoke, Context: 0}, Output{OK: true}),
			op(1, 10, 11, Input{Kind: Revoke, Context: 0}, Output{OK: true}),
		},
	}
	for name, h := range faultBad {
		require.False(t, porcupine.CheckOperations(FaultModel(nContexts), h), name)
	}
	faultGood := []porcupine.Operation{
		// The client is away: nothing found, then a context not the
		// longest idle; a send fails not_live; a revoke finds nothing
		// (not yet held to the sequential rule, see FaultModel).
		op(0, 0, 1, Input{Kind: Acquire}, Output{}),
		op(0, 2, 3, Input{Kind: Acquire}, Output{OK: true, Context: 2, Epoch: 4, Lease: 0}),
		op(0, 4, 5, Input{Kind: Send, Lease: 0}, Output{Reason: "not_live"}),
		op(0, 6, 7, Input{Kind: Revoke, Context: 2}, Output{}),
		op(0, 8, 9, Input{Kind: Renew, Lease: 0}, Output{OK: true}),

		// An acquire whose answer was lost took context 0 (or not): a
		// revoke may find it held.
		unknownAcquire,
		op(1, 10, 11, Input{Kind: Acquire}, Output{OK: true, Context: 1, Epoch: 6, Lease: 1}),
		op(1, 12, 13, Input{Kind: Acquire}, Output{}),
		op(1, 14, 15, Input{Kind: Revoke, Context: 0}, Output{OK: true}),
		op(1, 16, 17, Input{Kind: Acquire}, Output{OK: true, Context: 0, Epoch: 8, Lease: 2}),
		// How a lease ended died with its replica.
		op(1, 18, 19, Input{Kind: Revoke, Context: 0}, Output{OK: true}),
		op(1, 20, 21, Input{Kind: Renew, Lease: 2}, Output{Reason: "unknown_lease"}),
		// Or its replica tells first that its context is not live.
		op(1, 22, 23, Input{Kind: Send, Lease: 2}, Output{Reason: "not_live"}),
	}
	require.True(t, porcupine.CheckOperations(FaultModel(nContexts), faultGood))
	require.False(t, porcupine.CheckOperations(Model(nContexts), faultGood), "without faults, none of that holds")
}
