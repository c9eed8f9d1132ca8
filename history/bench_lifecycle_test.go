package history_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/history/historytest"
)

// BenchmarkLifecycleBatch measures one batch that carries the whole life of
// n commands, as a busy broker's writer sees it: each command inserted,
// dispatched, acknowledged (a message and a status), answered (a result
// message) and completed. One b.N iteration is one Write of 6n ops; cmds/s
// is the commands whose whole life was made durable per second.
func BenchmarkLifecycleBatch(b *testing.B) {
	for _, store := range []struct {
		name string
		open func(testing.TB, ...historytest.Option) *history.Store
	}{{"sqlite", historytest.NewSQLite}, {"postgres", historytest.NewPostgres}} {
		for _, n := range []int{8, 64, 256} {
			b.Run(fmt.Sprintf("%s/cmds=%d", store.name, n), func(b *testing.B) {
				s := store.open(b)
				ctx := b.Context()
				ops := make([]history.Op, 0, 6*n)
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					ops = ops[:0]
					now := time.Now()
					for range n {
						id := uuid.Must(uuid.NewV7()).String()
						ops = append(ops,
							history.InsertCommand{Rec: cheetah.CommandRecord{
								CommandID: id, UserID: "usr_1111", ClientID: "ext-1", ContextID: "tab-1", TaskID: "t",
								Name: "navigate", Params: json.RawMessage(`{"url":"https://example.com/"}`),
								ResponseMode: cheetah.ModeRPC, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", CreatedAt: now,
							}},
							history.SetStatus{CommandID: id, Status: cheetah.StatusDispatched, At: now},
							history.AppendMessage{CommandID: id, Msg: cheetah.Message{Kind: cheetah.KindAck, At: now}},
							history.SetStatus{CommandID: id, Status: cheetah.StatusAcknowledged, At: now},
							history.AppendMessage{CommandID: id, Msg: cheetah.Message{Kind: cheetah.KindResult,
								Data: json.RawMessage(`{"ok":true,"title":"Example Domain"}`), At: now}},
							history.SetStatus{CommandID: id, Status: cheetah.StatusCompleted, At: now},
						)
					}
					if err := s.Write(ctx, ops...); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "cmds/s")
				b.ReportMetric(float64(6*n)*float64(b.N)/b.Elapsed().Seconds(), "ops/s")
			})
		}
	}
}
