package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/bench/internal/broker"
	"github.com/cheetahbroker/cheetah/bench/internal/peers"
	"github.com/cheetahbroker/cheetah/bench/internal/report"
)

func loadColumns(rate string) []report.Column {
	return []report.Column{
		{Key: "rate", Label: rate, Unit: "/s", Better: report.Higher},
		{Key: "p50", Label: "p50", Unit: "µs", Better: report.Lower},
		{Key: "p99", Label: "p99", Unit: "µs", Better: report.Lower},
	}
}

// machineColumns are the machine's CPU over a closed loop's measured phase
// (trial.machineFigures): every process's, the peers' servers included.
var machineColumns = []report.Column{
	{Key: "machine_cpu_us", Label: "machine CPU per operation (all processes)", Unit: "µs", Better: report.Lower},
	{Key: "machine_busy", Label: "machine busy", Unit: "%", Better: report.Lower},
}

// throughput is scenario 2: every context busy at once, one caller each.
func (e *env) throughput() *report.Scenario {
	c := e.cfg
	s := &report.Scenario{
		Number: 2, Key: "throughput", Title: "Throughput",
		Detail: fmt.Sprintf("%s over %s, one caller per context sending back to back for %s per run (%s warm-up excluded), %d-byte params, %s. "+
			"NATS: %d responder connections in one queue group, the callers spread over %d requester connections.",
			report.Count(c.ThroughputContexts, "context"), report.Count(c.ThroughputClients, "client"), c.ThroughputDuration, c.ThroughputWarmup, c.PayloadBytes, report.Count(c.Repeats, "run"),
			c.ThroughputClients, c.ThroughputClients),
		Columns: append(loadColumns("commands"),
			report.Column{Key: "commits", Label: "store commits", Unit: "/s", Better: report.Lower},
			report.Column{Key: "ops_per_commit", Label: "ops per commit", Unit: "ops", Better: report.Higher},
			cpuColumn),
	}
	s.Columns = append(s.Columns, machineColumns...)
	s.Rows = append(s.Rows,
		e.row(s.Key, peerNATSQueue, false, e.natsThroughput),
		e.row(s.Key, peerCheetahSQL, true, e.cheetahThroughput(broker.SQLite)),
		e.row(s.Key, peerCheetahPG, true, e.cheetahThroughput(broker.Postgres)),
	)
	return s
}

// load runs a closed loop of workers and turns it into the row's figures.
func (e *env) load(t *trial, workers int, warm, dur time.Duration, op func(ctx context.Context, w int) error) (map[string]float64, error) {
	res := closedLoop(t.ctx, t, workers, warm, dur, op)
	t.ops = res.ops
	if err := res.check(); err != nil {
		return nil, err
	}
	p := res.lat.Percentiles(50, 99)
	out := map[string]float64{"rate": res.perSecond(), "p50": p[0], "p99": p[1]}
	t.machineFigures(out)
	if res.errs > 0 {
		out["errors"] = float64(res.errs)
	}
	return out, nil
}

func (e *env) natsThroughput() (func(*trial) (map[string]float64, error), func(), error) {
	if e.natsErr != nil {
		return nil, nil, absent(e.natsErr)
	}
	n := e.cfg.ThroughputClients
	var conns []*nats.Conn
	cleanup := func() {
		for _, c := range conns {
			c.Close()
		}
	}
	subject := fmt.Sprintf("cheetah.bench.%d.tp", os.Getpid())
	for i := range n {
		c, err := peers.DialNATS(e.cfg.NATSURL, fmt.Sprintf("cheetah-bench-worker-%d", i))
		if err != nil {
			return nil, cleanup, absent(err)
		}
		conns = append(conns, c)
		if _, err := c.QueueSubscribe(subject, "workers", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
			return nil, cleanup, err
		}
		if err := c.Flush(); err != nil {
			return nil, cleanup, err
		}
	}
	var requesters []*nats.Conn
	for i := range n {
		c, err := peers.DialNATS(e.cfg.NATSURL, fmt.Sprintf("cheetah-bench-caller-%d", i))
		if err != nil {
			return nil, cleanup, absent(err)
		}
		conns = append(conns, c)
		requesters = append(requesters, c)
	}
	op := func(ctx context.Context, w int) error {
		m, err := requesters[w%n].RequestWithContext(ctx, subject, e.payload)
		if err != nil {
			return err
		}
		if len(m.Data) != len(e.payload) {
			return fmt.Errorf("nats: %d bytes back, sent %d", len(m.Data), len(e.payload))
		}
		return nil
	}
	return func(t *trial) (map[string]float64, error) {
		return e.load(t, e.cfg.ThroughputContexts, e.cfg.ThroughputWarmup, e.cfg.ThroughputDuration, op)
	}, cleanup, nil
}

func (e *env) cheetahThroughput(store broker.Store) runner {
	return func() (func(*trial) (map[string]float64, error), func(), error) {
		b, cleanup, err := e.startBroker(store)
		if err != nil {
			return nil, cleanup, err
		}
		c := e.cfg
		ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
		defer cancel()
		perClient := (c.ThroughputContexts + c.ThroughputClients - 1) / c.ThroughputClients
		if err := b.AddAgents(ctx, "tp", c.ThroughputClients, perClient); err != nil {
			return nil, cleanup, err
		}
		if err := b.WaitIdle(ctx, c.ThroughputContexts); err != nil {
			return nil, cleanup, err
		}
		mgr := b.Manager()
		handles, err := acquireHandles(ctx, c.ThroughputContexts, func(int) *cheetah.Manager { return mgr })
		if err != nil {
			return nil, cleanup, err
		}
		cmd := cheetah.Command{Name: "echo", Params: json.RawMessage(e.payload)}
		op := func(ctx context.Context, w int) error { return sendAndWait(ctx, handles[w], cmd) }
		return func(t *trial) (map[string]float64, error) {
			// The writer's counters span the warm-up too; their ratio is what
			// tells how well group commit groups.
			before, start := b.B.Store.Stats(), time.Now()
			out, err := e.load(t, c.ThroughputContexts, c.ThroughputWarmup, c.ThroughputDuration, op)
			after, d := b.B.Store.Stats(), time.Since(start)
			if n := after.Batches - before.Batches; err == nil && n > 0 {
				out["commits"] = float64(n) / d.Seconds()
				out["ops_per_commit"] = float64(after.Ops-before.Ops) / float64(n)
			}
			if cpu, ok := t.cpuPerOp(t.ops); err == nil && ok {
				out["cpu_us"] = cpu
			}
			return out, err
		}, cleanup, nil
	}
}

// acquireHandles acquires n console contexts of the bench user, the i-th
// through manager(i), one task each.
func acquireHandles(ctx context.Context, n int, manager func(i int) *cheetah.Manager) ([]*cheetah.Handle, error) {
	handles := make([]*cheetah.Handle, n)
	for i := range handles {
		h, err := manager(i).Acquire(ctx, cheetah.AcquireRequest{UserID: broker.User, TaskID: fmt.Sprintf("tp-%d", i), ClientType: cheetah.Console})
		if err != nil {
			return nil, fmt.Errorf("acquire %d: %w", i, err)
		}
		handles[i] = h
	}
	return handles, nil
}
