package harness

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/bench/internal/broker"
	"github.com/cheetahbroker/cheetah/bench/internal/peers"
	"github.com/cheetahbroker/cheetah/bench/internal/report"
	"github.com/cheetahbroker/cheetah/quota"
)

const (
	peerRedis          = "Redis SET NX PX + DEL"
	peerPGSkipLocked   = "PostgreSQL UPDATE … FOR UPDATE SKIP LOCKED … RETURNING"
	peerCheetahInProc  = "Cheetah in process (PostgreSQL store)"
	peerCheetahOverAPI = "Cheetah over HTTP (remote SDK, PostgreSQL store)"
	peerRegistryAlone  = "Cheetah registry alone (in process, stub clients, PostgreSQL store)"
	peerRegistryQuota  = "Cheetah registry alone, three-level quota in force (in process, stub clients, PostgreSQL store)"
)

// churnQuotas is the three-level quota of the quota row: it governs every
// churn acquire, at caps the churn never reaches, with the tenant's
// override in force, so that each acquire checks and charges all three
// levels (DESIGN §10) and none is refused.
const churnQuotas = `
quotas:
  - name: consoles
    match: {client_type: console}
    levels: {global: 1000000, tenant: 500000, user: 100000}
tenants:
  acme: {consoles: {tenant: 600000}}
`

// churnTenant is the tenant of the registry rows' acquires.
const churnTenant = "acme"

// peerCheetahInProcMany is the row of Cheetah in process with many
// contexts per client.
func peerCheetahInProcMany(perClient int) string {
	return fmt.Sprintf("Cheetah in process (PostgreSQL store), %d contexts per client", perClient)
}

// churn is scenario 3: acquire and release, as fast as the acquirers go.
func (e *env) churn() *report.Scenario {
	c := e.cfg
	s := &report.Scenario{
		Number: 3, Key: "churn", Title: "Acquire/release churn",
		Detail: fmt.Sprintf("%s, %s each acquiring one context and releasing it, back to back, for %s per run (%s warm-up excluded), %s. "+
			"A pair is one acquire and its release; the latency is the pair's. Redis: a random context key taken with SET NX PX (retried on a taken key), then DEL. "+
			"PostgreSQL: the longest-idle free row taken with a conditional UPDATE over SELECT … FOR UPDATE SKIP LOCKED, released with a fenced UPDATE, each statement its own durable commit, a pool of one connection per acquirer. "+
			"Cheetah: the contexts are console flows of real agents, %d per agent, which receive an assignment frame on every acquire and release; "+
			"the registry-alone row has the same contexts on stub clients that drop every frame, so it is the acquire/release path without any WebSocket; "+
			"the quota row is the registry-alone row again with a three-level quota (global, tenant with a per-tenant override, user) governing every acquire at caps it never reaches, "+
			"so each pair checks and charges, then gives back, a slot at each level; both rows acquire for tenant %q, and their runs alternate (one of each in turn).",
			report.Count(c.ChurnContexts, "context"), report.Count(c.ChurnAcquirers, "concurrent acquirer"), c.ChurnDuration, c.ChurnWarmup, report.Count(c.Repeats, "run"), c.ChurnPerClient, churnTenant),
		Columns: append(loadColumns("pairs"),
			report.Column{Key: "per_client", Label: "contexts per client", Unit: "", Better: report.Higher},
			report.Column{Key: "agents", Label: "agents", Unit: "", Better: report.Higher},
			report.Column{Key: "dropped", Label: "agents dropped", Unit: "", Better: report.Lower},
			report.Column{Key: "refused", Label: "acquires refused, store_unavailable, retried (warm-up included)", Unit: "", Better: report.Lower}),
	}
	s.Columns = append(s.Columns, machineColumns...)
	s.Rows = append(s.Rows,
		e.row(s.Key, peerRedis, false, e.redisChurn),
		e.row(s.Key, peerPGSkipLocked, false, e.pgChurn),
		e.row(s.Key, peerCheetahInProc, true, e.cheetahChurn(false, c.ChurnPerClient)),
	)
	if c.churnMany() {
		_, flows := agentsFor(c.ChurnContexts, c.ChurnPerClientMany)
		s.Detail += fmt.Sprintf(" The row with %d contexts per client is the in-process row again with fewer agents holding more contexts each: "+
			"an agent dropped there is one whose connection did not keep up with its many contexts' assignment frames.", flows)
		s.Rows = append(s.Rows, e.row(s.Key, peerCheetahInProcMany(flows), true, e.cheetahChurn(false, c.ChurnPerClientMany)))
	}
	s.Rows = append(s.Rows, e.row(s.Key, peerCheetahOverAPI, true, e.cheetahChurn(true, c.ChurnPerClient)))
	// Run by run in turn: the quota's goal is the ratio of these two.
	s.Rows = append(s.Rows, e.rows(s.Key, true, []string{peerRegistryAlone, peerRegistryQuota},
		[]runner{e.registryChurn(nil), e.registryChurn(quota.Parse)})...)
	return s
}

func (e *env) churnLoad(t *trial, op func(ctx context.Context, w int) error) (map[string]float64, error) {
	return e.load(t, e.cfg.ChurnAcquirers, e.cfg.ChurnWarmup, e.cfg.ChurnDuration, op)
}

func (e *env) redisChurn() (func(*trial) (map[string]float64, error), func(), error) {
	if e.redisErr != nil {
		return nil, nil, absent(e.redisErr)
	}
	c := e.cfg
	rc, err := peers.DialRedis(e.ctx, c.RedisAddr, c.ChurnAcquirers)
	if err != nil {
		return nil, nil, absent(err)
	}
	prefix := fmt.Sprintf("cheetah-bench:%d:ctx:", os.Getpid())
	keys := make([]string, c.ChurnContexts)
	for i := range keys {
		keys[i] = prefix + strconv.Itoa(i)
	}
	cleanup := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for i := 0; i < len(keys); i += 1000 {
			_ = rc.Del(ctx, keys[i:min(i+1000, len(keys))]...).Err()
		}
		rc.Close()
	}
	rngs := make([]*rand.Rand, c.ChurnAcquirers)
	tokens := make([]string, c.ChurnAcquirers)
	for w := range rngs {
		rngs[w] = rand.New(rand.NewPCG(c.Seed, uint64(w)))
		tokens[w] = "worker-" + strconv.Itoa(w)
	}
	op := func(ctx context.Context, w int) error {
		for tries := 0; ; tries++ {
			k := keys[rngs[w].IntN(len(keys))]
			ok, err := rc.SetNX(ctx, k, tokens[w], 5*time.Minute).Result()
			if err != nil {
				return err
			}
			if ok {
				return rc.Del(ctx, k).Err()
			}
			if tries > 1000 {
				return errors.New("redis: no free context in 1,000 tries")
			}
		}
	}
	return func(t *trial) (map[string]float64, error) { return e.churnLoad(t, op) }, cleanup, nil
}

func (e *env) pgChurn() (func(*trial) (map[string]float64, error), func(), error) {
	if e.pgErr != nil {
		return nil, nil, absent(e.pgErr)
	}
	c := e.cfg
	url, drop, err := e.pg.CreateDB(e.ctx, "skiplocked")
	if err != nil {
		return nil, nil, absent(err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		drop()
		return nil, nil, err
	}
	cfg.MaxConns, cfg.MinConns = int32(c.ChurnAcquirers), int32(c.ChurnAcquirers)
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		drop()
		return nil, nil, absent(err)
	}
	cleanup := func() { pool.Close(); drop() }
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	_, err = pool.Exec(ctx, `
CREATE SEQUENCE epochs;
CREATE TABLE contexts (
    id          integer PRIMARY KEY,
    task_id     text,
    epoch       bigint NOT NULL DEFAULT 0,
    lease_token text,
    expires_at  timestamptz,
    idle_since  timestamptz NOT NULL
);
CREATE INDEX contexts_idle ON contexts (idle_since) WHERE lease_token IS NULL;`)
	if err != nil {
		return nil, cleanup, err
	}
	if _, err := pool.Exec(ctx, `INSERT INTO contexts (id, idle_since) SELECT i, clock_timestamp() FROM generate_series(1, $1) AS i`, c.ChurnContexts); err != nil {
		return nil, cleanup, err
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE contexts`); err != nil {
		return nil, cleanup, err
	}
	const acquire = `
UPDATE contexts SET task_id = $1, epoch = nextval('epochs'), lease_token = $2, expires_at = now() + interval '300 seconds'
WHERE id = (SELECT id FROM contexts WHERE lease_token IS NULL ORDER BY idle_since LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id, epoch`
	const release = `UPDATE contexts SET task_id = NULL, lease_token = NULL, expires_at = NULL, idle_since = clock_timestamp() WHERE id = $1 AND epoch = $2`
	tasks := make([]string, c.ChurnAcquirers)
	for w := range tasks {
		tasks[w] = "churn-" + strconv.Itoa(w)
	}
	op := func(ctx context.Context, w int) error {
		var id int32
		var epoch int64
		err := pool.QueryRow(ctx, acquire, tasks[w], tasks[w]).Scan(&id, &epoch)
		if errors.Is(err, pgx.ErrNoRows) {
			return errors.New("postgres: no free context")
		}
		if err != nil {
			return err
		}
		tag, err := pool.Exec(ctx, release, id, epoch)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("postgres: release of %d at epoch %d changed %d rows", id, epoch, tag.RowsAffected())
		}
		return nil
	}
	return func(t *trial) (map[string]float64, error) { return e.churnLoad(t, op) }, cleanup, nil
}

// agentsFor spreads n contexts over as few agents as hold at most per each,
// evenly: it returns the number of agents and of flows per agent.
func agentsFor(n, per int) (agents, flows int) {
	agents = (n + per - 1) / per
	flows = (n + agents - 1) / agents
	return agents, flows
}

func (e *env) cheetahChurn(overHTTP bool, perClient int) runner {
	return func() (func(*trial) (map[string]float64, error), func(), error) {
		b, cleanup, err := e.startBroker(broker.Postgres)
		if err != nil {
			return nil, cleanup, err
		}
		c := e.cfg
		ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
		defer cancel()
		agents, flows := agentsFor(c.ChurnContexts, perClient)
		if err := b.AddAgents(ctx, "churn", agents, flows); err != nil {
			return nil, cleanup, err
		}
		if err := b.WaitIdle(ctx, c.ChurnContexts); err != nil {
			return nil, cleanup, err
		}
		mgr := b.Manager()
		if overHTTP {
			mgr = b.Remote(2 * c.ChurnAcquirers)
		}
		churn := e.managerChurn(mgr, "")
		return func(t *trial) (map[string]float64, error) {
			out, err := churn(t)
			d, n := b.Dropped()
			if err != nil && d > 0 {
				// The drops are the finding: kept, with the failure.
				err = fmt.Errorf("%w; %d of %d agents had lost their connection (CHEETAH_BENCH_BROKER_LOG=warn shows why)", err, d, n)
				return nil, partialError{figures: map[string]float64{"dropped": float64(d), "agents": float64(n), "per_client": float64(flows)}, err: err}
			}
			if out != nil {
				out["dropped"] = float64(d) // counted since setup: agents do not come back to the same session
				out["agents"], out["per_client"] = float64(n), float64(flows)
			}
			return out, err
		}, cleanup, nil
	}
}

// registryChurn is the churn on the registry alone; with parse, under the
// quotas it makes of churnQuotas.
func (e *env) registryChurn(parse func([]byte) (*quota.Set, error)) runner {
	return func() (func(*trial) (map[string]float64, error), func(), error) {
		if e.pgErr != nil {
			return nil, nil, absent(e.pgErr)
		}
		var quotas *quota.Set
		if parse != nil {
			var err error
			if quotas, err = parse([]byte(churnQuotas)); err != nil {
				return nil, nil, err
			}
		}
		url, drop, err := e.pg.CreateDB(e.ctx, "registry")
		if err != nil {
			return nil, nil, absent(err)
		}
		agents, flows := agentsFor(e.cfg.ChurnContexts, e.cfg.ChurnPerClient)
		r, err := broker.StartRegistry(e.ctx, url, "", agents, flows, quotas)
		if err != nil {
			drop()
			return nil, nil, err
		}
		return e.managerChurn(r.Manager(), churnTenant), func() { r.Close(); drop() }, nil
	}
}

// churnRequest is acquirer w's acquire, for tenant (none when empty).
func churnRequest(w int, tenant string) cheetah.AcquireRequest {
	return cheetah.AcquireRequest{UserID: broker.User, TaskID: "churn-" + strconv.Itoa(w), ClientType: cheetah.Console, TenantID: tenant}
}

// managerChurn is the churn loop over an SDK manager. An acquire refused
// with store_unavailable (the registry issues epochs from a block reserved
// in the store, and refuses at once while the next block is being
// reserved) is retried after a millisecond, at most refusedTries times; the
// pair's latency includes the wait and the run counts the refusals. The
// acquires are for tenant (none when empty).
func (e *env) managerChurn(mgr *cheetah.Manager, tenant string) func(*trial) (map[string]float64, error) {
	const refusedTries = 1000
	reqs := make([]cheetah.AcquireRequest, e.cfg.ChurnAcquirers)
	for w := range reqs {
		reqs[w] = churnRequest(w, tenant)
	}
	var refused atomic.Int64
	op := func(ctx context.Context, w int) error {
		h, err := mgr.Acquire(ctx, reqs[w])
		for tries := 0; errors.Is(err, cheetah.ErrStoreUnavailable) && tries < refusedTries && ctx.Err() == nil; tries++ {
			refused.Add(1)
			sleep(ctx, time.Millisecond)
			h, err = mgr.Acquire(ctx, reqs[w])
		}
		if err != nil {
			return err
		}
		ok, err := mgr.Release(ctx, h)
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("cheetah: release cleared nothing")
		}
		return nil
	}
	return func(t *trial) (map[string]float64, error) {
		refused.Store(0)
		out, err := e.churnLoad(t, op)
		if out != nil {
			out["refused"] = float64(refused.Load())
		}
		return out, err
	}
}
