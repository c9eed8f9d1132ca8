package sdktest

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/agent"
	"github.com/cheetahbroker/cheetah/protocol"
)

// guard bounds every wait of the suite. It is a failure guard, never a way to
// synchronise: a working broker answers in milliseconds.
const guard = 10 * time.Second

// The command names the suite's agents offer besides "echo".
const (
	cmdFail = "fail" // ends with an error frame: code "boom", data {"n":1}
	cmdHold = "hold" // runs until its context ends or the agent stops
	cmdHang = "hang" // ignores its context; runs until the agent stops
)

// testAgent is a console client built on the agent library, as a user of the
// broker would write one.
type testAgent struct {
	id      string
	started chan string   // the ids of hold and hang commands as they start
	release chan struct{} // closed when the test ends: hold and hang return
}

// agent connects a console client with flows contexts (flow-1…flow-N) for
// user and waits until the broker lists them as available.
func (s *suite) agent(user, clientID string, flows int, labels map[string]string) *testAgent {
	s.t.Helper()
	return s.agentRoom(user, clientID, flows, flows, labels)
}

// agentRoom is agent with room for maxFlows flows: it opens more when the
// broker asks (create_context).
func (s *suite) agentRoom(user, clientID string, flows, maxFlows int, labels map[string]string) *testAgent {
	t := s.t
	t.Helper()
	ta := &testAgent{id: clientID, started: make(chan string, 16), release: make(chan struct{})}
	a := agent.New(agent.Config{
		URL: s.env.URL, Token: s.env.ClientKey(t, user), ClientID: clientID, Name: "sdktest",
		Labels: labels, Flows: flows, MaxFlows: maxFlows, MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
	})
	a.Handle("echo", agent.Echo())
	a.Handle(cmdFail, func(context.Context, *protocol.Command, agent.Output) (any, error) {
		return nil, &agent.CommandError{Code: "boom", Message: "it broke", Data: map[string]int{"n": 1}}
	})
	a.Handle(cmdHold, func(ctx context.Context, cmd *protocol.Command, _ agent.Output) (any, error) {
		ta.started <- cmd.CommandID
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-ta.release:
			return "released", nil
		}
	})
	a.Handle(cmdHang, func(_ context.Context, cmd *protocol.Command, _ agent.Output) (any, error) {
		ta.started <- cmd.CommandID
		<-ta.release
		return "released", nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		close(ta.release)
		cancel()
		select {
		case <-done:
		case <-time.After(guard):
			t.Errorf("agent %s did not stop", clientID)
		}
	})
	select {
	case <-a.Connected():
	case err := <-done:
		t.Fatalf("agent %s stopped: %v", clientID, err)
	case <-time.After(guard):
		t.Fatalf("agent %s did not connect", clientID)
	}
	s.waitAvailable(user, clientID, flows)
	return ta
}

// waitStarted returns the id of the next hold or hang command that started.
func (a *testAgent) waitStarted(t *testing.T) string {
	t.Helper()
	select {
	case id := <-a.started:
		return id
	case <-time.After(guard):
		t.Fatalf("no command started on %s", a.id)
		return ""
	}
}

// waitAvailable waits until n contexts of clientID are available.
func (s *suite) waitAvailable(user, clientID string, n int) {
	s.t.Helper()
	s.eventually(func() bool {
		list, err := s.m.ListAvailable(s.ctx, user, cheetah.Console)
		if err != nil {
			return false
		}
		got := 0
		for _, c := range list {
			if c.ClientID == clientID {
				got++
			}
		}
		return got == n
	}, "%d contexts of %s available", n, clientID)
}

// rawClient speaks the wire protocol itself, for what the agent library
// cannot do: drop one context from its state report, or hand a context to a
// person.
type rawClient struct {
	t     *testing.T
	conn  *websocket.Conn
	pongs chan struct{}
	done  chan struct{}
	// creates receives the broker's create_context frames.
	creates chan *protocol.CreateContext
	// assignments receives the broker's assignment frames.
	assignments chan *protocol.Assignment
}

// raw connects a console client that reports contexts, and waits until the
// broker applied the report.
func (s *suite) raw(user, clientID string, contexts ...protocol.ContextReport) *rawClient {
	s.t.Helper()
	return s.rawRoom(user, clientID, 0, contexts...)
}

// rawRoom is raw for a client whose hello says it can hold maxContexts.
func (s *suite) rawRoom(user, clientID string, maxContexts int, contexts ...protocol.ContextReport) *rawClient {
	t := s.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	url := "ws" + strings.TrimPrefix(s.env.URL, "http") + "/ws/v1/client"
	conn, _, err := websocket.Dial(ctx, url, nil)
	require.NoError(t, err)
	c := &rawClient{t: t, conn: conn, pongs: make(chan struct{}, 16), done: make(chan struct{}),
		creates: make(chan *protocol.CreateContext, 16), assignments: make(chan *protocol.Assignment, 64)}
	welcome := make(chan error, 1)
	go c.read(welcome)
	t.Cleanup(func() {
		conn.CloseNow()
		<-c.done
	})
	c.send(&protocol.Hello{Protocol: protocol.ProtocolVersion, Token: s.env.ClientKey(t, user),
		ClientID: clientID, ClientType: protocol.ClientConsole, Name: "sdktest-raw",
		Capacity: &protocol.Capacity{MaxContexts: maxContexts}})
	select {
	case err := <-welcome:
		require.NoError(t, err, "hello")
	case <-time.After(guard):
		t.Fatal("no welcome")
	}
	c.report(contexts...)
	return c
}

// read drains the connection: it reports the welcome (or why none came) and
// every pong, and ignores the rest (assignments).
func (c *rawClient) read(welcome chan<- error) {
	defer close(c.done)
	welcomed := false
	for {
		_, b, err := c.conn.Read(context.Background())
		if err != nil {
			if !welcomed {
				welcome <- err
			}
			return
		}
		f, err := protocol.Decode(b)
		if err != nil {
			continue
		}
		switch f := f.(type) {
		case *protocol.Welcome:
			welcomed = true
			welcome <- nil
		case *protocol.Error:
			if !welcomed {
				welcomed = true
				welcome <- errors.New(string(f.Code) + ": " + f.Message)
			}
		case *protocol.Pong:
			c.pongs <- struct{}{}
		case *protocol.CreateContext:
			c.creates <- f
		case *protocol.Assignment:
			select {
			case c.assignments <- f:
			default: // nobody reads them: drop
			}
		}
	}
}

func (c *rawClient) send(f protocol.Frame) {
	c.t.Helper()
	b, err := protocol.Encode(f)
	require.NoError(c.t, err)
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	require.NoError(c.t, c.conn.Write(ctx, websocket.MessageText, b))
}

// report sends a full state report and returns once the broker applied it:
// the broker handles a client's frames in order, so its pong to the ping
// that follows proves it.
func (c *rawClient) report(contexts ...protocol.ContextReport) {
	c.t.Helper()
	c.send(&protocol.State{Contexts: slices.Clone(contexts)})
	c.send(&protocol.Ping{})
	select {
	case <-c.pongs:
	case <-time.After(guard):
		c.t.Fatal("no pong after the state report")
	}
}

func worker(id string) protocol.ContextReport {
	return protocol.ContextReport{ContextID: id, TabID: "tab-" + id, Owner: protocol.OwnerWorker}
}

func human(id string) protocol.ContextReport {
	return protocol.ContextReport{ContextID: id, TabID: "tab-" + id, Owner: protocol.OwnerHuman}
}

// nextAssignment returns the next assignment frame of the given state.
func (c *rawClient) nextAssignment(state protocol.AssignmentState) *protocol.Assignment {
	c.t.Helper()
	deadline := time.After(guard)
	for {
		select {
		case f := <-c.assignments:
			if f.State == state {
				return f
			}
		case <-deadline:
			c.t.Fatalf("no %s assignment", state)
			return nil
		}
	}
}

// nextCreate returns the next create_context the broker sent.
func (c *rawClient) nextCreate() *protocol.CreateContext {
	c.t.Helper()
	select {
	case f := <-c.creates:
		return f
	case <-time.After(guard):
		c.t.Fatal("no create_context arrived")
		return nil
	}
}

func createdAs(id, requestID string) protocol.ContextReport {
	r := worker(id)
	r.RequestID = requestID
	return r
}
