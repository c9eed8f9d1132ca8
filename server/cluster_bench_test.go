package server_test

import (
	"context"
	"slices"
	"testing"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/server/auth"
)

// BenchmarkClusterRoundTrip measures a durable round trip (send_and_wait
// of echo over HTTP) to a console agent connected to replica 0 of three,
// the caller asking replica 0 itself or another replica: the cost of the
// hop between replicas (docs/cluster.md, "Choice of transport"). It reports
// p50 and p99 in µs; figures are read, never asserted.
func BenchmarkClusterRoundTrip(b *testing.B) {
	rs := startCluster(b, 3)
	appKey := rs[0].key(b, auth.App, "")
	clusterAgent(b, rs[0].URL, rs[0].key(b, auth.Client, user), "bench-agent", 1, nil)
	for _, via := range []struct {
		name    string
		replica int
	}{{"same-replica", 0}, {"cross-replica", 1}} {
		b.Run(via.name, func(b *testing.B) {
			api := rs[via.replica].api(appKey)
			l, err := acquireOn(b, api, map[string]any{"user_id": user, "task_id": "bench", "client_type": "console"})
			if err != nil {
				b.Fatal(err)
			}
			defer func() {
				_ = api.Do(context.Background(), "POST", "/api/v1/lease/release", nil, nil, "X-Lease", l.LeaseToken)
			}()
			body := map[string]any{"name": "echo", "params": map[string]int{"n": 1}}
			var lat []time.Duration
			for b.Loop() {
				start := time.Now()
				var waited struct{ Resolution cheetah.Resolution }
				if err := api.Do(context.Background(), "POST", "/api/v1/commands/wait", body, &waited, "X-Lease", l.LeaseToken); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}
