package server_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/agent"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/server"
	"github.com/cheetahbroker/cheetah/server/auth"
)

// BenchmarkSendAndWait measures an in-process SendAndWait round trip through
// a real WebSocket client (the agent library answering echo), with the
// command and its messages made durable on each store.
func BenchmarkSendAndWait(b *testing.B) {
	b.Run("sqlite", func(b *testing.B) { benchSendAndWait(b, historytest.NewSQLite(b)) })
	b.Run("postgres", func(b *testing.B) { benchSendAndWait(b, historytest.NewPostgres(b)) })
}

func benchSendAndWait(b *testing.B, store *history.Store) {
	ctx := context.Background()
	reg, err := registry.New(ctx, registry.Config{Store: store})
	if err != nil {
		b.Fatal(err)
	}
	defer reg.Close()
	keys := auth.New(store, "", time.Now)
	srv, err := server.New(server.Config{Registry: reg, Store: store, Keys: keys})
	if err != nil {
		b.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	defer srv.Shutdown(ctx)
	key, err := keys.Create(ctx, auth.Client, user, "bench")
	if err != nil {
		b.Fatal(err)
	}
	a := agent.New(agent.Config{URL: hs.URL, Token: key.Secret, ClientID: "bench", Flows: 1})
	a.Handle("echo", agent.Echo())
	actx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = a.Run(actx); close(done) }()
	defer func() { stop(); <-done }()
	<-a.Connected()

	mgr := cheetah.NewManager(reg)
	h, err := mgr.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "bench", ClientType: cheetah.Console, Wait: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	params := map[string]string{"pad": string(make([]byte, 200))}
	b.ReportAllocs()
	b.ResetTimer()
	before := store.Stats().Batches
	for b.Loop() {
		res, err := h.SendAndWait(ctx, cheetah.Command{Name: "echo", Params: params})
		if err != nil || res.Status != cheetah.StatusCompleted {
			b.Fatalf("%v %v", res.Status, err)
		}
	}
	b.StopTimer()
	// The store's transactions per round trip: what a round trip waits on.
	b.ReportMetric(float64(store.Stats().Batches-before)/float64(b.N), "commits/op")
	_, _ = mgr.Release(ctx, h)
}
