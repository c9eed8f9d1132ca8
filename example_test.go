package cheetah_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/agent"
	"github.com/cheetahbroker/cheetah/server"
	"github.com/cheetahbroker/cheetah/server/auth"
)

// An application embeds the broker, a console agent connects to it, and the
// application borrows one of the agent's flows for a task, sends it a
// command, waits for the resolution and reads the result from history.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "cheetah-example")
	defer os.RemoveAll(dir)

	b, err := server.Open(ctx, server.Options{DataDir: dir})
	if err != nil {
		panic(err)
	}
	defer b.Close(ctx)
	web := httptest.NewServer(b.Server.Handler())
	defer web.Close()

	// A client key for the agent, bound to one user.
	key, _ := b.Keys.Create(ctx, auth.Client, "usr_demo", "example agent")
	a := agent.New(agent.Config{URL: web.URL, Token: key.Secret, ClientID: "agent-1", Flows: 1})
	a.Handle("echo", agent.Echo())
	actx, stop := context.WithCancel(ctx)
	defer stop()
	go a.Run(actx)
	<-a.Connected()

	mgr := b.Manager()
	// The agent's state report may still be on its way: wait up to 5 s.
	h, err := mgr.Acquire(ctx, cheetah.AcquireRequest{
		UserID: "usr_demo", TaskID: "greet", ClientType: cheetah.Console, Wait: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	defer mgr.Release(context.WithoutCancel(ctx), h)

	res, err := h.SendAndWait(ctx, cheetah.Command{Name: "echo", Params: map[string]any{"hello": "world"}},
		cheetah.WithTimeout(10*time.Second))
	if err != nil {
		panic(err)
	}
	rec, err := mgr.History().Read(ctx, "usr_demo", res.CommandID)
	if err != nil {
		panic(err)
	}
	last := rec.Messages[len(rec.Messages)-1]
	fmt.Println(h.ContextID(), res.Status, last.Kind, string(last.Data))
	// Output: flow-1 completed result {"hello":"world"}
}
