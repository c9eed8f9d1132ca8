package registry_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jonboulle/clockwork"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/protocol"
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
