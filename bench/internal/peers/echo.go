package peers

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/coder/websocket"
)

// EchoServer is the floor of the latency scenario and of the connections
// scenario: a coder/websocket server that sends every message back as it
// came, and does nothing else.
type EchoServer struct {
	URL string // ws://127.0.0.1:PORT

	srv    *http.Server
	ln     net.Listener
	cancel context.CancelFunc
	served chan struct{}

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup // the connections being served
	active atomic.Int64
}

// StartEcho listens on a free loopback port and serves.
func StartEcho() (*EchoServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &EchoServer{URL: "ws://" + ln.Addr().String(), ln: ln, cancel: cancel, served: make(chan struct{})}
	e.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !e.enter() {
			return
		}
		defer e.wg.Done()
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
		if err != nil {
			return
		}
		defer c.CloseNow()
		e.active.Add(1)
		defer e.active.Add(-1)
		c.SetReadLimit(4 << 20)
		for {
			typ, b, err := c.Read(ctx) // ends when Close cancels ctx
			if err != nil {
				return
			}
			if err := c.Write(ctx, typ, b); err != nil {
				return
			}
		}
	})}
	go func() {
		defer close(e.served)
		if err := e.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = err // the listener was closed under it; Close reports nothing
		}
	}()
	return e, nil
}

// Active is the number of WebSocket connections open now.
func (e *EchoServer) Active() int { return int(e.active.Load()) }

func (e *EchoServer) enter() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return false
	}
	e.wg.Add(1)
	return true
}

// Close stops the server and ends every connection it holds.
func (e *EchoServer) Close() {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	e.cancel()
	_ = e.srv.Close()
	<-e.served
	e.wg.Wait()
}
