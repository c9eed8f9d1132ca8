package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/bench/internal/broker"
	"github.com/cheetahbroker/cheetah/bench/internal/report"
)

// Peer names of scenario 6.
const (
	peerSameReplica  = "round trip, caller on the client's replica"
	peerOtherReplica = "round trip, caller on another replica"
)

func peerReplicas(n int) string {
	return fmt.Sprintf("%s on PostgreSQL, over HTTP", report.Count(n, "replica"))
}

// cluster is scenario 6: replicas on one PostgreSQL (docs/cluster.md). The
// round trip through another replica against the same-replica one, and
// durable commands/s over HTTP with 1, 2 and 3 replicas on this machine,
// agents and callers spread over them.
func (e *env) cluster() *report.Scenario {
	c := e.cfg
	s := &report.Scenario{
		Number: 6, Key: "cluster", Title: "Replicas on one PostgreSQL",
		Detail: fmt.Sprintf("Round trips: three replicas, one console agent on the first, %s over HTTP (remote SDK) asking the first replica or the second, %d-byte params, %s. "+
			"Throughput: %s over %s spread over the replicas, one caller per context over HTTP, spread too, for %s per run (%s warm-up). "+
			"Every replica runs in this process, on this machine's cores, beside the database.",
			report.Count(c.RoundTrips, "sequential round trip"), c.PayloadBytes, report.Count(c.Repeats, "run"),
			report.Count(c.ThroughputContexts, "context"), report.Count(c.ThroughputClients, "client"), c.ThroughputDuration, c.ThroughputWarmup),
		// p50 first: every row has it; only the throughput rows have a rate.
		Columns: []report.Column{
			{Key: "p50", Label: "p50", Unit: "µs", Better: report.Lower},
			{Key: "p99", Label: "p99", Unit: "µs", Better: report.Lower},
			{Key: "rate", Label: "commands", Unit: "/s", Better: report.Higher},
		},
	}
	s.Rows = append(s.Rows, e.rows(s.Key, false, []string{peerSameReplica, peerOtherReplica},
		[]runner{e.replicaRoundTrips(0), e.replicaRoundTrips(1)})...)
	for n := 1; n <= 3; n++ {
		s.Rows = append(s.Rows, e.row(s.Key, peerReplicas(n), false, e.replicaThroughput(n)))
	}
	return s
}

// startReplicas starts n replicas on a new PostgreSQL database.
func (e *env) startReplicas(n int) ([]*broker.Broker, func(), error) {
	if e.pgErr != nil {
		return nil, nil, absent(e.pgErr)
	}
	url, drop, err := e.pg.CreateDB(e.ctx, "replicas")
	if err != nil {
		return nil, nil, absent(err)
	}
	rs, err := broker.StartReplicas(e.ctx, broker.Options{Store: broker.Postgres, DatabaseURL: url, Log: brokerLog(e.log)}, n)
	if err != nil {
		drop()
		return nil, nil, err
	}
	return rs, func() {
		for _, r := range rs {
			r.Close()
		}
		drop()
	}, nil
}

// waitIdleRemote waits until the cluster lists n idle contexts.
func waitIdleRemote(ctx context.Context, mgr *cheetah.Manager, n int) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		got, err := mgr.ListAvailable(ctx, broker.User, cheetah.Console)
		if err == nil && len(got) >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d idle contexts after 60 s, want %d (%v)", len(got), n, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// replicaRoundTrips measures round trips to an agent on replica 0, the
// caller asking replica via.
func (e *env) replicaRoundTrips(via int) runner {
	return func() (func(*trial) (map[string]float64, error), func(), error) {
		rs, cleanup, err := e.startReplicas(3)
		if err != nil {
			return nil, cleanup, err
		}
		ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
		defer cancel()
		if err := rs[0].AddAgents(ctx, "rt", 1, 1); err != nil {
			return nil, cleanup, err
		}
		mgr := rs[via].Remote(4)
		if err := waitIdleRemote(ctx, mgr, 1); err != nil {
			return nil, cleanup, err
		}
		h, err := mgr.Acquire(ctx, cheetah.AcquireRequest{UserID: broker.User, TaskID: "latency", ClientType: cheetah.Console})
		if err != nil {
			return nil, cleanup, err
		}
		cmd := cheetah.Command{Name: "echo", Params: json.RawMessage(e.payload)}
		op := func(ctx context.Context) error { return sendAndWait(ctx, h, cmd) }
		return func(t *trial) (map[string]float64, error) { return e.roundTrips(t, op) }, cleanup, nil
	}
}

// replicaThroughput measures durable commands/s with n replicas.
func (e *env) replicaThroughput(n int) runner {
	return func() (func(*trial) (map[string]float64, error), func(), error) {
		rs, cleanup, err := e.startReplicas(n)
		if err != nil {
			return nil, cleanup, err
		}
		c := e.cfg
		ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
		defer cancel()
		perClient := (c.ThroughputContexts + c.ThroughputClients - 1) / c.ThroughputClients
		for i := range c.ThroughputClients {
			if err := rs[i%n].AddAgents(ctx, fmt.Sprintf("tp%d", i), 1, perClient); err != nil {
				return nil, cleanup, err
			}
		}
		mgrs := make([]*cheetah.Manager, n)
		for i, r := range rs {
			mgrs[i] = r.Remote(c.ThroughputContexts)
		}
		if err := waitIdleRemote(ctx, mgrs[0], c.ThroughputContexts); err != nil {
			return nil, cleanup, err
		}
		handles, err := acquireHandles(ctx, c.ThroughputContexts, func(i int) *cheetah.Manager { return mgrs[i%n] })
		if err != nil {
			return nil, cleanup, err
		}
		cmd := cheetah.Command{Name: "echo", Params: json.RawMessage(e.payload)}
		op := func(ctx context.Context, w int) error { return sendAndWait(ctx, handles[w], cmd) }
		return func(t *trial) (map[string]float64, error) {
			return e.load(t, c.ThroughputContexts, c.ThroughputWarmup, c.ThroughputDuration, op)
		}, cleanup, nil
	}
}
