package rig

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/cheetahbroker/cheetah/protocol"
)

// FakeClient is a client that speaks the wire protocol itself, feeds every
// frame it gets to a Checker, and answers commands as their params ask:
// {"act":"ok"} (the default: ack then result), "fail" (an error frame),
// "slow" (the result after "ms" milliseconds), "drop" (no answer at all),
// "chatty" (ack, progress, event, then the result).
type FakeClient struct {
	URL, Key, UserID, ClientID string
	Type                       protocol.ClientType
	Check                      *Checker

	mu     sync.Mutex // guards conn writes and conn
	conn   *websocket.Conn
	pongs  chan struct{}
	errsMu sync.Mutex
	errs   []*protocol.Error // error frames the broker sent
	done   chan struct{}     // closed when the current reader stops
	closed atomic.Bool

	Answered atomic.Int64
	Received atomic.Int64
	timers   sync.WaitGroup
}

// Guard bounds each wait of a fake client. It is a failure guard: a working
// broker answers in milliseconds.
const Guard = 20 * time.Second

// Connect dials and says hello, and waits for the welcome.
func (c *FakeClient) Connect(ctx context.Context) error {
	if c.Type == "" {
		c.Type = protocol.ClientConsole
	}
	dctx, cancel := context.WithTimeout(ctx, Guard)
	defer cancel()
	url := "ws" + strings.TrimPrefix(c.URL, "http") + "/ws/v1/client"
	conn, _, err := websocket.Dial(dctx, url, nil)
	if err != nil {
		return err
	}
	conn.SetReadLimit(-1)
	welcome := make(chan error, 1)
	c.mu.Lock()
	c.conn = conn
	c.pongs = make(chan struct{}, 64)
	c.done = make(chan struct{})
	c.mu.Unlock()
	c.closed.Store(false)
	if c.Check != nil {
		c.Check.Reconnected(c.prefix())
	}
	go c.read(conn, c.done, c.pongs, welcome)
	if err := c.send(&protocol.Hello{Protocol: protocol.ProtocolVersion, Token: c.Key, ClientID: c.ClientID,
		ClientType: c.Type, Name: "reliability"}); err != nil {
		return err
	}
	select {
	case err := <-welcome:
		return err
	case <-dctx.Done():
		return fmt.Errorf("no welcome: %w", dctx.Err())
	}
}

func (c *FakeClient) prefix() string { return c.UserID + "/" + c.ClientID + "/" }

func (c *FakeClient) read(conn *websocket.Conn, done chan struct{}, pongs chan struct{}, welcome chan<- error) {
	defer close(done)
	welcomed := false
	for {
		_, b, err := conn.Read(context.Background())
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
		case *protocol.Pong:
			select {
			case pongs <- struct{}{}:
			default:
			}
		case *protocol.Error:
			if !welcomed {
				welcomed = true
				welcome <- errors.New(string(f.Code) + ": " + f.Message)
			}
			c.errsMu.Lock()
			if len(c.errs) < 1000 {
				c.errs = append(c.errs, f)
			}
			c.errsMu.Unlock()
		case *protocol.Assignment:
			if c.Check != nil {
				c.Check.See(c.prefix(), f)
			}
		case *protocol.Command:
			c.Received.Add(1)
			if c.Check != nil {
				c.Check.See(c.prefix(), f)
			}
			c.answer(conn, f)
		}
	}
}

func (c *FakeClient) answer(conn *websocket.Conn, f *protocol.Command) {
	var p struct {
		Act string `json:"act"`
		MS  int    `json:"ms"`
	}
	_ = json.Unmarshal(f.Params, &p)
	if f.ResponseMode == protocol.ResponseNone {
		_ = c.sendOn(conn, &protocol.Ack{CommandID: f.CommandID})
		return
	}
	id := f.CommandID
	switch p.Act {
	case "drop":
		return
	case "fail":
		_ = c.sendOn(conn, &protocol.Error{CommandID: id, Code: "boom", Message: "asked to fail"})
	case "slow":
		_ = c.sendOn(conn, &protocol.Ack{CommandID: id})
		c.timers.Add(1)
		time.AfterFunc(time.Duration(p.MS)*time.Millisecond, func() {
			defer c.timers.Done()
			_ = c.sendOn(conn, &protocol.Result{CommandID: id, Data: json.RawMessage(`{"ok":true}`)})
		})
		c.Answered.Add(1)
		return
	case "chatty":
		_ = c.sendOn(conn, &protocol.Ack{CommandID: id})
		_ = c.sendOn(conn, &protocol.Progress{CommandID: id, Data: json.RawMessage(`{"p":0.5}`)})
		_ = c.sendOn(conn, &protocol.Event{CommandID: id, Name: "log", Data: json.RawMessage(`{"line":"hi"}`)})
		_ = c.sendOn(conn, &protocol.Result{CommandID: id, Data: json.RawMessage(`{"ok":true}`)})
	default:
		_ = c.sendOn(conn, &protocol.Ack{CommandID: id})
		_ = c.sendOn(conn, &protocol.Result{CommandID: id, Data: json.RawMessage(`{"ok":true}`)})
	}
	c.Answered.Add(1)
}

func (c *FakeClient) send(f protocol.Frame) error {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	return c.sendOn(conn, f)
}

func (c *FakeClient) sendOn(conn *websocket.Conn, f protocol.Frame) error {
	b, err := protocol.Encode(f)
	if err != nil {
		return err
	}
	return c.SendRawOn(conn, b)
}

// SendRaw writes bytes as one text frame on the current connection.
func (c *FakeClient) SendRaw(b []byte) error {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	return c.SendRawOn(conn, b)
}

// SendRawOn writes bytes as one text frame on conn.
func (c *FakeClient) SendRawOn(conn *websocket.Conn, b []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), Guard)
	defer cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	return conn.Write(ctx, websocket.MessageText, b)
}

// Send writes one frame.
func (c *FakeClient) Send(f protocol.Frame) error { return c.send(f) }

// Sync sends a ping and waits for its pong: the broker handles a client's
// frames in order, so everything sent before has been applied.
func (c *FakeClient) Sync() error {
	c.mu.Lock()
	pongs, done := c.pongs, c.done
	c.mu.Unlock()
	if err := c.send(&protocol.Ping{}); err != nil {
		return err
	}
	t := time.NewTimer(Guard)
	defer t.Stop()
	select {
	case <-pongs:
		return nil
	case <-done:
		return errors.New("connection closed before the pong")
	case <-t.C:
		return errors.New("no pong")
	}
}

// Report sends a full state report and waits until the broker applied it.
func (c *FakeClient) Report(contexts ...protocol.ContextReport) error {
	if err := c.send(&protocol.State{Contexts: append([]protocol.ContextReport{}, contexts...)}); err != nil {
		return err
	}
	return c.Sync()
}

// Close closes the connection without a word (as a crash would, but with a
// close frame) and waits for the reader to stop.
func (c *FakeClient) Close() {
	c.mu.Lock()
	conn, done := c.conn, c.done
	c.mu.Unlock()
	if conn == nil {
		return
	}
	c.closed.Store(true)
	conn.CloseNow()
	<-done
}

// Wait waits for the answers still scheduled ("slow") to be written or fail.
func (c *FakeClient) Wait() { c.timers.Wait() }

// Errors returns the error frames the broker sent.
func (c *FakeClient) Errors() []*protocol.Error {
	c.errsMu.Lock()
	defer c.errsMu.Unlock()
	return append([]*protocol.Error(nil), c.errs...)
}

// Done is closed when the current connection's reader stopped.
func (c *FakeClient) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done
}

// Worker is a worker-owned context report.
func Worker(id string) protocol.ContextReport {
	return protocol.ContextReport{ContextID: id, TabID: "tab-" + id, Owner: protocol.OwnerWorker}
}

// Human is a person's context report.
func Human(id string) protocol.ContextReport {
	return protocol.ContextReport{ContextID: id, TabID: "tab-" + id, Owner: protocol.OwnerHuman}
}
