package agent_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"

	"github.com/coder/websocket"

	"github.com/cheetahbroker/cheetah/agent"
	"github.com/cheetahbroker/cheetah/protocol"
)

// Example writes a client of its own: an agent with one console flow that
// offers a custom command, "greet", next to the stock "echo". A real agent
// dials `cheetah serve`; here a stand-in broker, demoBroker below, sends two
// greet commands and prints what the agent answers.
func Example() {
	broker := newDemoBroker()
	defer broker.Close()

	a := agent.New(agent.Config{
		URL:      broker.URL, // e.g. "http://127.0.0.1:8420"
		Token:    "ck_demo",  // a client key, made with `cheetah keys`
		ClientID: "build-7",  // keep it stable across restarts
		Name:     "build box 7",
	})
	a.Handle("echo", agent.Echo())
	a.Handle("greet", func(ctx context.Context, cmd *protocol.Command, out agent.Output) (any, error) {
		var p struct {
			Name string `json:"name"`
		}
		if err := agent.ParseParams(cmd, &p); err != nil {
			return nil, err // an error frame with code invalid_params
		}
		if p.Name == "" {
			return nil, &agent.CommandError{Code: "no_name", Message: "say whom to greet"}
		}
		// Progress is best effort: while the agent reconnects it is dropped.
		_ = out.Progress(map[string]string{"status": "thinking"})
		return map[string]string{"greeting": "Hello, " + p.Name + "!"}, nil
	})

	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()

	<-broker.finished // the stand-in broker has seen both commands through
	stop()
	if err := <-done; err != nil {
		fmt.Println("run:", err)
	}

	// Output:
	// agent offers flow-1
	// ack
	// progress {"status":"thinking"}
	// result {"greeting":"Hello, Ada!"}
	// ack
	// error no_name: say whom to greet
}

// demoBroker plays the broker's side of one connection: welcome, two greet
// commands, and a printout of every answer.
type demoBroker struct {
	*httptest.Server
	finished chan struct{}
	wg       sync.WaitGroup
}

func newDemoBroker() *demoBroker {
	b := &demoBroker{finished: make(chan struct{})}
	b.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.wg.Add(1)
		defer b.wg.Done()
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		b.converse(r.Context(), c)
	}))
	return b
}

func (b *demoBroker) Close() {
	b.Server.Close()
	b.wg.Wait()
}

func (b *demoBroker) converse(ctx context.Context, c *websocket.Conn) {
	read := func() protocol.Frame { // nil once the connection is gone
		for {
			_, data, err := c.Read(ctx)
			if err != nil {
				return nil
			}
			if f, err := protocol.Decode(data); err == nil {
				return f
			}
		}
	}
	write := func(f protocol.Frame) {
		data, _ := protocol.Encode(f)
		_ = c.Write(ctx, websocket.MessageText, data)
	}

	read() // hello; a real broker checks its token here
	write(&protocol.Welcome{Protocol: 1, SessionID: "s-1", UserID: "usr_demo",
		HeartbeatS: 20, MaxMessageBytes: 1 << 20})
	if st, ok := read().(*protocol.State); ok {
		fmt.Println("agent offers", st.Contexts[0].ContextID)
	}
	for i, params := range []string{`{"name":"Ada"}`, `{}`} {
		id := fmt.Sprintf("cmd-%d", i)
		write(&protocol.Command{CommandID: id, ContextID: "flow-1", TaskID: "demo", Epoch: 1,
			Name: "greet", Params: []byte(params), ResponseMode: protocol.ResponseRPC})
		for end := false; !end; {
			switch f := read().(type) {
			case *protocol.Ack:
				fmt.Println("ack")
			case *protocol.Progress:
				fmt.Println("progress", string(f.Data))
			case *protocol.Result:
				fmt.Println("result", string(f.Data))
				end = true
			case *protocol.Error:
				fmt.Printf("error %s: %s\n", f.Code, f.Message)
				end = true
			case nil:
				return
			}
		}
	}
	close(b.finished)
	for read() != nil { // until the agent closes the connection
	}
}
