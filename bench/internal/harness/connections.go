package harness

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/cheetahbroker/cheetah/bench/internal/machine"
	"github.com/cheetahbroker/cheetah/bench/internal/report"
	"github.com/cheetahbroker/cheetah/bench/internal/stats"
	"github.com/cheetahbroker/cheetah/protocol"
)

const (
	peerEchoServer     = "raw coder/websocket server (floor)"
	peerCheetahBroker  = "Cheetah broker (SQLite store)"
	connsFileLimitBase = 4096
)

// connections is scenario 5: many idle clients on one server, in a process
// of its own so that its memory is its own.
func (e *env) connections() *report.Scenario {
	c := e.cfg
	s := &report.Scenario{
		Number: 5, Key: "connections", Title: "Idle connections",
		Detail: fmt.Sprintf("%s with one context each, opened by %s against a server in its own process, then left idle; %s, a fresh server each. "+
			"A connect is the WebSocket dial, hello, welcome and the state report. Memory is the server's growth per connection, after a collection, "+
			"as resident set size and as Go heap in use plus goroutine stacks. The floor accepts each socket and echoes what it reads (so hello gets an answer).",
			report.Count(c.Conns, "client"), report.Count(c.ConnDialers, "concurrent dialer"), report.Count(c.Repeats, "run")),
		Columns: []report.Column{
			{Key: "rate", Label: "connects", Unit: "/s", Better: report.Higher},
			{Key: "p99", Label: "connect p99", Unit: "µs", Better: report.Lower},
			{Key: "rss", Label: "RSS per conn", Unit: "KiB", Better: report.Lower},
			{Key: "go", Label: "heap+stacks per conn", Unit: "KiB", Better: report.Lower},
			{Key: "heap", Label: "heap per conn", Unit: "KiB", Better: report.Lower},
			{Key: "stacks", Label: "stacks per conn", Unit: "KiB", Better: report.Lower},
			{Key: "goroutines", Label: "goroutines per conn", Unit: "", Better: report.Lower},
		},
	}
	if got, err := machine.RaiseFileLimit(uint64(2*c.Conns + connsFileLimitBase)); err != nil || got < uint64(c.Conns+connsFileLimitBase/2) {
		reason := fmt.Sprintf("the file limit is %d, too low for %d connections", got, c.Conns)
		if err != nil {
			reason += ": " + err.Error()
		}
		for _, p := range []string{peerEchoServer, peerCheetahBroker} {
			s.Rows = append(s.Rows, &report.Row{Peer: p, Failed: true, Reason: reason})
		}
		return s
	}
	s.Rows = append(s.Rows,
		e.row(s.Key, peerEchoServer, true, e.idleConns(childEcho)),
		e.row(s.Key, peerCheetahBroker, true, e.idleConns(childBroker)),
	)
	return s
}

func (e *env) idleConns(kind string) runner {
	return func() (func(*trial) (map[string]float64, error), func(), error) {
		return func(t *trial) (map[string]float64, error) { return e.idleConnsOnce(t, kind) }, nil, nil
	}
}

func (e *env) idleConnsOnce(t *trial, kind string) (map[string]float64, error) {
	ctx := t.ctx
	ch, err := startChild(ctx, kind, e.log)
	if err != nil {
		return nil, err
	}
	defer ch.stop()
	base, err := ch.mem(ctx, true)
	if err != nil {
		return nil, err
	}
	n := e.cfg.Conns
	conns := make([]*websocket.Conn, n)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.CloseNow()
			}
		}
	}()
	url := ch.hello.URL
	if kind == childBroker {
		url = "ws" + url[len("http"):] + "/ws/v1/client"
	}
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	lats := make([]*stats.Latencies, e.cfg.ConnDialers)
	var wg sync.WaitGroup
	start := time.Now()
	for d := range e.cfg.ConnDialers {
		lats[d] = stats.NewLatencies(n/e.cfg.ConnDialers + 1)
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				t0 := time.Now()
				c, err := connectIdle(ctx, url, ch.hello.Key, i, kind == childEcho)
				if err != nil {
					once.Do(func() { firstErr = fmt.Errorf("client %d: %w", i, err) })
					return
				}
				lats[d].Add(time.Since(t0))
				conns[i] = c
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// Every state report applied (broker) or every socket served (echo).
	deadline := time.Now().Add(time.Minute)
	for {
		m, err := ch.mem(ctx, false)
		if err != nil {
			return nil, err
		}
		if m.Ready >= n {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d clients ready after a minute", m.Ready, n)
		}
		sleep(ctx, 50*time.Millisecond)
	}
	sleep(ctx, 500*time.Millisecond) // let the last handshakes' garbage become garbage
	after, err := ch.mem(ctx, true)
	if err != nil {
		return nil, err
	}
	if t.profile != "" {
		if err := ch.saveHeapProfile(ctx, t.profile+".heap.pprof"); err != nil {
			e.logf("  heap profile: %v", err)
		}
	}
	all := stats.NewLatencies(n)
	for _, l := range lats {
		all.Merge(l)
	}
	perConn := func(a, b uint64) float64 { return (float64(a) - float64(b)) / float64(n) / 1024 }
	return map[string]float64{
		"rate":       float64(n) / elapsed.Seconds(),
		"p99":        all.Percentiles(99)[0],
		"rss":        perConn(after.RSS, base.RSS),
		"go":         perConn(after.HeapInuse+after.StackInuse, base.HeapInuse+base.StackInuse),
		"heap":       perConn(after.HeapInuse, base.HeapInuse),
		"stacks":     perConn(after.StackInuse, base.StackInuse),
		"goroutines": float64(after.Goroutines-base.Goroutines) / float64(n),
	}, nil
}

// connectIdle opens one client: dial, hello, welcome, state. Then a reader
// runs only to answer the server's pings. The echo server answers hello and
// state with themselves, and those answers are read before going idle.
func connectIdle(ctx context.Context, url, key string, i int, echo bool) (*websocket.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*websocket.Conn, error) { c.CloseNow(); return nil, err }
	if key == "" {
		key = "none"
	}
	id := "conn-" + strconv.Itoa(i)
	hello, _ := protocol.Encode(&protocol.Hello{
		Protocol: protocol.ProtocolVersion, Token: key, ClientID: id, ClientType: protocol.ClientConsole,
		Name: "cheetah-bench", Capacity: &protocol.Capacity{MaxContexts: 1},
	})
	if err := c.Write(ctx, websocket.MessageText, hello); err != nil {
		return fail(err)
	}
	_, b, err := c.Read(ctx)
	if err != nil {
		return fail(err)
	}
	if !echo {
		f, err := protocol.Decode(b)
		if err != nil {
			return fail(err)
		}
		if _, ok := f.(*protocol.Welcome); !ok {
			return fail(fmt.Errorf("%s instead of welcome: %s", f.FrameType(), b))
		}
	}
	state, _ := protocol.Encode(&protocol.State{Contexts: []protocol.ContextReport{{ContextID: "flow-1", TabID: "1", Owner: protocol.OwnerWorker}}})
	if err := c.Write(ctx, websocket.MessageText, state); err != nil {
		return fail(err)
	}
	if echo {
		if _, _, err := c.Read(ctx); err != nil {
			return fail(err)
		}
	}
	c.CloseRead(context.Background())
	return c, nil
}
