package registry_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/quota"
)

// BenchmarkAcquireRelease measures one acquire+release pair in process,
// with many goroutines contending over a pool of 1,024 contexts.
func BenchmarkAcquireRelease(b *testing.B) {
	store := historytest.NewSQLite(b)
	reg, err := registry.New(context.Background(), registry.Config{Store: store, Clock: clockwork.NewRealClock(), EpochBlock: 1 << 16})
	if err != nil {
		b.Fatal(err)
	}
	defer reg.Close()
	for i := range 16 {
		var reps []protocol.ContextReport
		for j := range 64 {
			reps = append(reps, protocol.ContextReport{ContextID: fmt.Sprintf("w%d", j), Owner: protocol.OwnerWorker})
		}
		att := reg.Connect(registry.ClientInfo{UserID: user, ClientID: fmt.Sprintf("c%d", i), Type: cheetah.Console}, newFakeConn())
		reg.Report(att, reps)
	}
	req := cheetah.AcquireRequest{UserID: user, TaskID: "bench", ClientType: cheetah.Console}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l, err := reg.Acquire(ctx, req)
			if err != nil {
				b.Error(err)
				return
			}
			if _, err := reg.Release(ctx, l); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkChurn64 is the churn of the benchmark harness in process: 64
// acquirers over 1,000 contexts (16 per client), each acquiring a context
// and releasing it back to back. It reports the pair's p99 latency and the
// acquires refused while the next epoch block was being reserved (each
// retried after 1 ms, as the harness does, so a loaded machine does not
// fail the benchmark). The clients' connections carry coalesced notices,
// as the server's do, and never write them.
func BenchmarkChurn64(b *testing.B) { churn64(b, nil) }

// BenchmarkChurn64Quota is BenchmarkChurn64 with a three-level quota in
// force over every acquire (caps it never reaches), to compare with it:
// the cost of the funnel on the acquire path (issue 13's goal: at most
// 1.2 times). Figures are read, never asserted.
func BenchmarkChurn64Quota(b *testing.B) {
	s, err := quota.Parse([]byte(`
quotas:
  - name: consoles
    match: {client_type: console}
    levels: {global: 100000, tenant: 50000, user: 10000}
tenants:
  acme: {consoles: {tenant: 60000}}
`))
	if err != nil {
		b.Fatal(err)
	}
	churn64(b, s)
}

func churn64(b *testing.B, quotas *quota.Set) {
	store := historytest.NewSQLite(b)
	reg, err := registry.New(context.Background(), registry.Config{Store: store, Clock: clockwork.NewRealClock()})
	if err != nil {
		b.Fatal(err)
	}
	defer reg.Close()
	reg.SetQuotas(quotas)
	for i := range 63 {
		var reps []protocol.ContextReport
		for j := range 16 {
			reps = append(reps, protocol.ContextReport{ContextID: fmt.Sprintf("w%d", j), Owner: protocol.OwnerWorker})
		}
		att := reg.Connect(registry.ClientInfo{UserID: user, ClientID: fmt.Sprintf("c%d", i), Type: cheetah.Console}, heldConn{})
		reg.Report(att, reps)
	}
	req := cheetah.AcquireRequest{UserID: user, TaskID: "bench", ClientType: cheetah.Console, TenantID: "acme"}
	ctx := context.Background()
	const acquirers = 64
	var mu sync.Mutex
	var lats []time.Duration
	var failed, refused atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	per := b.N/acquirers + 1
	for range acquirers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := make([]time.Duration, 0, per)
			for range per {
				start := time.Now()
				l, err := reg.Acquire(ctx, req)
				for tries := 0; errors.Is(err, cheetah.ErrStoreUnavailable) && tries < 1000; tries++ {
					// The epoch block ran out and the next is being
					// reserved: retried as the harness does, the wait
					// counted in the pair's latency.
					refused.Add(1)
					time.Sleep(time.Millisecond)
					l, err = reg.Acquire(ctx, req)
				}
				if err != nil {
					failed.Add(1)
					continue
				}
				if _, err := reg.Release(ctx, l); err != nil {
					b.Error(err)
					return
				}
				mine = append(mine, time.Since(start))
			}
			mu.Lock()
			lats = append(lats, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Errorf("%d acquires failed", n)
	}
	b.ReportMetric(float64(refused.Load()), "refused")
	slices.Sort(lats)
	if len(lats) > 0 {
		b.ReportMetric(float64(lats[len(lats)*99/100].Microseconds()), "p99-µs")
		b.ReportMetric(float64(lats[len(lats)/2].Nanoseconds())/1000, "p50-µs")
	}
}
