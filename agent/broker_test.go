package agent_test

import (
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/cheetahbroker/cheetah/agent"
	"github.com/cheetahbroker/cheetah/protocol"
)

// guard bounds every wait in these tests. It is a failure guard, never a way
// to synchronise: a correct agent answers in milliseconds.
const guard = 10 * time.Second

const testToken = "ck_test_key"

// fakeBroker is the broker side of the wire protocol, just enough of it to
// drive an agent: it checks the token, welcomes, answers pings, and hands
// every connection to the test, which reads the agent's frames from it.
type fakeBroker struct {
	url      string
	srv      *httptest.Server
	maxBytes int64
	conns    chan *brokerConn
	hellos   atomic.Int32
	pings    atomic.Int32
	// mute makes the broker stop answering pings, as a broker that hung
	// would.
	mute     atomic.Bool
	handlers sync.WaitGroup

	mu   sync.Mutex
	open []*websocket.Conn
}

// brokerConn is one agent connection as the fake broker sees it.
type brokerConn struct {
	c      *websocket.Conn
	hello  *protocol.Hello
	frames chan frameOrErr // every frame the agent sent, except pings
	done   chan struct{}   // closed when the connection has ended
	wmu    sync.Mutex
}

type frameOrErr struct {
	f    protocol.Frame
	size int
	err  error
}

func newFakeBroker(t *testing.T, maxBytes int64) *fakeBroker {
	t.Helper()
	return newFakeBrokerOn(t, maxBytes, false)
}

// newFakeBrokerOn is newFakeBroker, served on TLS (an https:// URL, with
// httptest's own certificate, b.srv.Certificate()) when useTLS is set.
func newFakeBrokerOn(t *testing.T, maxBytes int64, useTLS bool) *fakeBroker {
	t.Helper()
	b := &fakeBroker{maxBytes: maxBytes, conns: make(chan *brokerConn, 16)}
	b.srv = httptest.NewUnstartedServer(http.HandlerFunc(b.serve))
	if useTLS {
		// Handshakes the tests make fail on purpose are not worth a line.
		b.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
		b.srv.StartTLS()
	} else {
		b.srv.Start()
	}
	b.url = b.srv.URL
	t.Cleanup(func() {
		b.srv.Close()
		// httptest does not wait for hijacked connections, so the broker
		// ends and waits for its own.
		b.mu.Lock()
		for _, c := range b.open {
			c.CloseNow()
		}
		b.mu.Unlock()
		b.handlers.Wait()
	})
	return b
}

func (b *fakeBroker) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/ws/v1/client" {
		http.NotFound(w, r)
		return
	}
	// Counted before the upgrade, while httptest still waits for this
	// request, so that the cleanup's Wait cannot miss it.
	b.handlers.Add(1)
	defer b.handlers.Done()
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	b.mu.Lock()
	b.open = append(b.open, c)
	b.mu.Unlock()
	// The broker reads what the agent sends whatever its size, and the
	// tests check sizes themselves.
	c.SetReadLimit(-1)
	ctx := context.Background()

	_, data, err := c.Read(ctx)
	if err != nil {
		return
	}
	f, err := protocol.Decode(data)
	hello, ok := f.(*protocol.Hello)
	if err != nil || !ok {
		c.Close(websocket.StatusCode(protocol.CloseUnauthorized), "first frame must be hello")
		return
	}
	b.hellos.Add(1)
	bc := &brokerConn{c: c, hello: hello, frames: make(chan frameOrErr, 4096), done: make(chan struct{})}
	defer close(bc.done)
	if hello.Token != testToken {
		bc.write(&protocol.Error{Code: protocol.CodeUnauthorized, Message: "unknown client key"})
		c.Close(websocket.StatusCode(protocol.CloseUnauthorized), protocol.CloseUnauthorized.Reason())
		return
	}
	bc.write(&protocol.Welcome{Protocol: 1, SessionID: "sess-" + hello.ClientID, UserID: "usr_1111",
		HeartbeatS: 20, MaxMessageBytes: b.maxBytes})
	b.conns <- bc
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			return
		}
		if int64(len(data)) > b.maxBytes {
			// What the real broker does, so that a test waiting for more
			// frames fails on the closed connection.
			bc.write(&protocol.Error{Code: protocol.CodeTooLarge, Message: "frame too large"})
			c.Close(websocket.StatusCode(protocol.CloseTooLarge), protocol.CloseTooLarge.Reason())
			return
		}
		f, err := protocol.Decode(data)
		if _, ping := f.(*protocol.Ping); ping {
			b.pings.Add(1)
			if !b.mute.Load() {
				bc.write(&protocol.Pong{})
			}
			continue
		}
		bc.frames <- frameOrErr{f: f, size: len(data), err: err}
	}
}

// accept returns the next connection, welcomed and with its state report
// read.
func (b *fakeBroker) accept(t *testing.T) (*brokerConn, *protocol.State) {
	t.Helper()
	select {
	case bc := <-b.conns:
		return bc, next[*protocol.State](t, bc)
	case <-time.After(guard):
		t.Fatal("no agent connected")
		return nil, nil
	}
}

func (bc *brokerConn) write(f protocol.Frame) error {
	b, err := protocol.Encode(f)
	if err != nil {
		return err
	}
	bc.wmu.Lock()
	defer bc.wmu.Unlock()
	return bc.c.Write(context.Background(), websocket.MessageText, b)
}

func (bc *brokerConn) send(t *testing.T, f protocol.Frame) {
	t.Helper()
	require.NoError(t, bc.write(f))
}

// nextFrame returns the agent's next frame.
func (bc *brokerConn) nextFrame(t *testing.T) protocol.Frame {
	t.Helper()
	select {
	case fe := <-bc.frames:
		require.NoError(t, fe.err, "the agent sent a frame the broker cannot decode")
		return fe.f
	case <-bc.done:
		t.Fatal("connection closed while waiting for a frame")
	case <-time.After(guard):
		t.Fatal("no frame from the agent")
	}
	return nil
}

// next returns the agent's next frame, which must be a T.
func next[T protocol.Frame](t *testing.T, bc *brokerConn) T {
	t.Helper()
	f := bc.nextFrame(t)
	got, ok := f.(T)
	require.Truef(t, ok, "want %T, got %T %+v", got, f, f)
	return got
}

// untilTerminal returns the frames about command id up to and including its
// result or error, failing on frames about other commands.
func (bc *brokerConn) untilTerminal(t *testing.T, id string) []protocol.Frame {
	t.Helper()
	var frames []protocol.Frame
	for {
		f := bc.nextFrame(t)
		require.Equal(t, id, commandID(f), "frame %T about another command", f)
		frames = append(frames, f)
		switch f.(type) {
		case *protocol.Result, *protocol.Error:
			return frames
		}
	}
}

// result runs one command and returns its terminal frame, checking that an
// ack came first.
func (bc *brokerConn) result(t *testing.T, cmd *protocol.Command) protocol.Frame {
	t.Helper()
	bc.send(t, cmd)
	frames := bc.untilTerminal(t, cmd.CommandID)
	require.IsType(t, &protocol.Ack{}, frames[0], "the first answer must be an ack")
	return frames[len(frames)-1]
}

// errorCode runs one command that must fail, and returns its error frame.
func (bc *brokerConn) errorCode(t *testing.T, cmd *protocol.Command) *protocol.Error {
	t.Helper()
	f := bc.result(t, cmd)
	e, ok := f.(*protocol.Error)
	require.Truef(t, ok, "want an error frame, got %T %+v", f, f)
	return e
}

func commandID(f protocol.Frame) string {
	switch f := f.(type) {
	case *protocol.Ack:
		return f.CommandID
	case *protocol.Progress:
		return f.CommandID
	case *protocol.Event:
		return f.CommandID
	case *protocol.Capture:
		return f.CommandID
	case *protocol.Result:
		return f.CommandID
	case *protocol.Error:
		return f.CommandID
	}
	return ""
}

func command(id, contextID, name, params string) *protocol.Command {
	cmd := &protocol.Command{CommandID: id, ContextID: contextID, TaskID: "t-42", Epoch: 17,
		Name: name, ResponseMode: protocol.ResponseRPC}
	if params != "" {
		cmd.Params = []byte(params)
	}
	return cmd
}

// runner is an agent running in the background of a test.
type runner struct {
	a      *agent.Agent
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

func testConfig(b *fakeBroker) agent.Config {
	return agent.Config{
		URL: b.url, Token: testToken, ClientID: "console-1", Name: "test agent", Version: "0.0.1",
		MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond,
	}
}

// start runs a in the background until the test ends.
func start(t *testing.T, a *agent.Agent) *runner {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &runner{a: a, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = a.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(guard):
			t.Error("Run did not return after its context ended")
		}
	})
	return r
}

// wait returns Run's error once Run has returned.
func (r *runner) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-r.done:
		return r.err
	case <-time.After(guard):
		t.Fatal("Run did not return")
		return nil
	}
}

// connected waits until the agent says it is connected.
func connected(t *testing.T, a *agent.Agent) {
	t.Helper()
	select {
	case <-a.Connected():
	case <-time.After(guard):
		t.Fatal("the agent did not connect")
	}
}

// startConnected runs an agent with the given handlers and returns it with
// its first connection, once it can take commands.
func startConnected(t *testing.T, b *fakeBroker, cfg agent.Config, handlers map[string]agent.Handler) (*runner, *brokerConn) {
	t.Helper()
	a := agent.New(cfg)
	for name, h := range handlers {
		a.Handle(name, h)
	}
	r := start(t, a)
	bc, _ := b.accept(t)
	connected(t, a)
	return r, bc
}
