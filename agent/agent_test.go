package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/cheetahbroker/cheetah/agent"
	"github.com/cheetahbroker/cheetah/internal/syncbuf"
	"github.com/cheetahbroker/cheetah/protocol"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestHelloStateAndSession(t *testing.T) {
	t.Parallel()
	b := newFakeBroker(t, 1<<20)
	cfg := testConfig(b)
	cfg.Flows = 2
	cfg.Labels = map[string]string{"region": "eu"}
	cfg.Effects = map[string]string{"echo": agent.EchoEffect, "exec": agent.ExecEffect}
	a := agent.New(cfg)
	r := start(t, a)

	bc, state := b.accept(t)
	require.Equal(t, &protocol.Hello{
		Protocol: 1, Token: testToken, ClientID: "console-1", ClientType: protocol.ClientConsole,
		Name: "test agent", Version: "0.0.1", Labels: map[string]string{"region": "eu"},
		Capacity: &protocol.Capacity{MaxContexts: 2},
		Effects:  map[string]string{"echo": protocol.EffectObserve, "exec": protocol.EffectMutate},
	}, bc.hello)
	require.Equal(t, []protocol.ContextReport{
		{ContextID: "flow-1", TabID: "1", Owner: protocol.OwnerWorker},
		{ContextID: "flow-2", TabID: "2", Owner: protocol.OwnerWorker},
	}, state.Contexts)

	connected(t, a)
	s, ok := a.Session()
	require.True(t, ok)
	require.Equal(t, agent.Session{ID: "sess-console-1", UserID: "usr_1111",
		Heartbeat: 20 * time.Second, MaxMessageBytes: 1 << 20}, s)

	r.cancel()
	require.NoError(t, r.wait(t), "Run returns nil when its context ends")
	_, ok = a.Session()
	require.False(t, ok)
	select {
	case <-bc.done: // the agent closed its connection
	case <-time.After(guard):
		t.Fatal("the connection outlived Run")
	}
}

func TestURLForms(t *testing.T) {
	t.Parallel()
	b := newFakeBroker(t, 1<<20)
	for _, u := range []string{
		b.url + "/",
		b.url + "/ws/v1/client",
		"ws" + strings.TrimPrefix(b.url, "http"),
	} {
		cfg := testConfig(b)
		cfg.URL = u
		start(t, agent.New(cfg))
		bc, _ := b.accept(t)
		require.Equal(t, "console-1", bc.hello.ClientID, u)
	}
}

func TestConfigErrorsReturnAtOnce(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]agent.Config{
		"bad scheme":    {URL: "ftp://127.0.0.1:1", Token: testToken, ClientID: "c1"},
		"bad client id": {URL: "http://127.0.0.1:1", Token: testToken, ClientID: "-nope"},
		"no token":      {URL: "http://127.0.0.1:1", ClientID: "c1"},
	} {
		err := agent.New(cfg).Run(context.Background())
		require.Error(t, err, name)
	}
}

func TestEchoAcksThenReturnsParams(t *testing.T) {
	t.Parallel()
	b := newFakeBroker(t, 1<<20)
	_, bc := startConnected(t, b, testConfig(b), map[string]agent.Handler{"echo": agent.Echo()})

	params := `{"b": [1, 2.50],  "a": "<&>"}`
	bc.send(t, command("c1", "flow-1", "echo", params))
	frames := bc.untilTerminal(t, "c1")
	require.Len(t, frames, 2)
	require.Equal(t, &protocol.Ack{CommandID: "c1"}, frames[0])
	require.Equal(t, params, string(frames[1].(*protocol.Result).Data), "params come back byte for byte")
}

func TestOutputFrames(t *testing.T) {
	t.Parallel()
	b := newFakeBroker(t, 1<<20)
	leaked := make(chan agent.Output, 1)
	_, bc := startConnected(t, b, testConfig(b), map[string]agent.Handler{
		"shoot": func(_ context.Context, _ *protocol.Command, out agent.Output) (any, error) {
			if err := errors.Join(
				out.Progress(map[string]float64{"loaded": 0.5}),
				out.Event("console", map[string]string{"text": "hi"}),
				out.Capture("image/png", []byte{0x89, 'P', 'N', 'G'}),
			); err != nil {
				return nil, err
			}
			leaked <- out
			return json.RawMessage(`{"ok":true}`), nil
		},
	})

	bc.send(t, command("c1", "flow-1", "shoot", ""))
	frames := bc.untilTerminal(t, "c1")
	require.Equal(t, []protocol.Frame{
		&protocol.Ack{CommandID: "c1"},
		&protocol.Progress{CommandID: "c1", Data: json.RawMessage(`{"loaded":0.5}`)},
		&protocol.Event{CommandID: "c1", Name: "console", Data: json.RawMessage(`{"text":"hi"}`)},
		protocol.NewCapture("c1", "image/png", []byte{0x89, 'P', 'N', 'G'}),
		&protocol.Result{CommandID: "c1", Data: json.RawMessage(`{"ok":true}`)},
	}, frames)
	require.ErrorIs(t, (<-leaked).Progress("late"), agent.ErrCommandDone)
}

func TestCommandErrors(t *testing.T) {
	t.Parallel()
	b := newFakeBroker(t, 1<<20)
	_, bc := startConnected(t, b, testConfig(b), map[string]agent.Handler{
		"echo": agent.Echo(),
		"exec": agent.Exec([]string{"sh"}),
		"fail": func(context.Context, *protocol.Command, agent.Output) (any, error) {
			return nil, errors.New("boom")
		},
		"navigate": func(context.Context, *protocol.Command, agent.Output) (any, error) {
			return nil, &agent.CommandError{Code: "navigation_failed", Message: "no such host",
				Data: map[string]string{"host": "example.invalid"}}
		},
		"panic": func(context.Context, *protocol.Command, agent.Output) (any, error) {
			panic("handler bug")
		},
	})

	for _, tc := range []struct {
		cmd  *protocol.Command
		code string
		msg  string
		data string
	}{
		{cmd: command("e1", "flow-9", "echo", `{}`), code: agent.CodeUnknownContext},
		{cmd: command("e2", "flow-1", "nope", `{}`), code: agent.CodeUnknownCommandName},
		{cmd: command("e3", "flow-1", "exec", `{"argv":"sh"}`), code: agent.CodeInvalidParams},
		{cmd: command("e4", "flow-1", "exec", `{"argv":[]}`), code: agent.CodeInvalidParams},
		{cmd: command("e5", "flow-1", "exec", `{"argv":["sh"],"bogus":1}`), code: agent.CodeInvalidParams},
		{cmd: command("e6", "flow-1", "exec", ``), code: agent.CodeInvalidParams},
		{cmd: command("e7", "flow-1", "fail", ``), code: agent.CodeFailed, msg: "boom"},
		{cmd: command("e8", "flow-1", "navigate", ``), code: "navigation_failed", msg: "no such host",
			data: `{"host":"example.invalid"}`},
		{cmd: command("e9", "flow-1", "panic", ``), code: agent.CodeInternal, msg: "handler panicked: handler bug"},
	} {
		e := bc.errorCode(t, tc.cmd)
		require.Equal(t, tc.code, string(e.Code), tc.cmd.CommandID)
		if tc.msg != "" {
			require.Equal(t, tc.msg, e.Message, tc.cmd.CommandID)
		}
		if tc.data != "" {
			require.JSONEq(t, tc.data, string(e.Data), tc.cmd.CommandID)
		}
	}

	// The panic did not take the agent down.
	_, ok := bc.result(t, command("ok", "flow-1", "echo", `{"still":"here"}`)).(*protocol.Result)
	require.True(t, ok)
}

func TestTraceparentAndOptionsDoNotChangeTheResult(t *testing.T) {
	t.Parallel()
	b := newFakeBroker(t, 1<<20)
	_, bc := startConnected(t, b, testConfig(b), map[string]agent.Handler{"echo": agent.Echo()})

	cmd := command("c1", "flow-1", "echo", `{"x":1}`)
	cmd.Traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	cmd.Options = json.RawMessage(`{"whatever":true}`)
	cmd.Target = json.RawMessage(`{"tab_id":"1"}`)
	cmd.ResponseMode = protocol.ResponseAsync
	require.IsType(t, &protocol.Result{}, bc.result(t, cmd))
}

// Each command is a span that continues the trace the frame's traceparent
// names, ended before the terminal message leaves; the handler's context
// carries it. A frame without a usable traceparent starts a trace.
func TestCommandSpanContinuesTheTrace(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	b := newFakeBroker(t, 1<<20)
	cfg := testConfig(b)
	cfg.TracerProvider = tp
	seen := make(chan trace.SpanContext, 4)
	_, bc := startConnected(t, b, cfg, map[string]agent.Handler{
		"look": func(ctx context.Context, _ *protocol.Command, _ agent.Output) (any, error) {
			seen <- trace.SpanContextFromContext(ctx)
			return nil, nil
		},
		"fail": func(context.Context, *protocol.Command, agent.Output) (any, error) {
			return nil, &agent.CommandError{Code: "nope"}
		},
	})

	cmd := command("c1", "flow-1", "look", `{}`)
	cmd.Traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	require.IsType(t, &protocol.Result{}, bc.result(t, cmd))
	spans := exp.GetSpans()
	require.Len(t, spans, 1, "ended before the result was sent")
	sp := spans[0]
	require.Equal(t, "cheetah.agent.command", sp.Name)
	require.Equal(t, trace.SpanKindConsumer, sp.SpanKind)
	require.Equal(t, "0af7651916cd43dd8448eb211c80319c", sp.SpanContext.TraceID().String())
	require.Equal(t, "b7ad6b7169203331", sp.Parent.SpanID().String())
	require.True(t, sp.Parent.IsRemote())
	require.Equal(t, sp.SpanContext.SpanID(), (<-seen).SpanID(), "the handler runs inside the span")
	var events []string
	for _, e := range sp.Events {
		events = append(events, e.Name)
	}
	require.Equal(t, []string{"send ack", "send result"}, events, "a quick command's ack goes with its result")

	exp.Reset()
	cmd = command("c2", "flow-1", "fail", `{}`)
	cmd.Traceparent = "not a traceparent"
	require.IsType(t, &protocol.Error{}, bc.result(t, cmd))
	sp = exp.GetSpans()[0]
	require.False(t, sp.Parent.IsValid(), "a trace of its own")
	require.Equal(t, codes.Error, sp.Status.Code)
	require.Equal(t, "nope", sp.Status.Description)
}

// A command's log lines name the session, the command and its context,
// for a command that failed and for one the agent rejected.
func TestCommandLogsNameTheCommand(t *testing.T) {
	t.Parallel()
	logs := &syncbuf.Buffer{}
	b := newFakeBroker(t, 1<<20)
	cfg := testConfig(b)
	cfg.Log = slog.New(slog.NewTextHandler(logs, nil))
	_, bc := startConnected(t, b, cfg, map[string]agent.Handler{
		"fail": func(context.Context, *protocol.Command, agent.Output) (any, error) {
			return nil, &agent.CommandError{Code: "nope"}
		},
	})
	require.IsType(t, &protocol.Error{}, bc.result(t, command("c1", "flow-1", "fail", `{}`)))
	require.IsType(t, &protocol.Error{}, bc.result(t, command("c2", "flow-1", "missing", `{}`)))
	lines := map[string]string{}
	for line := range strings.Lines(logs.String()) {
		for _, msg := range []string{"agent: command failed", "agent: rejecting a command"} {
			if strings.Contains(line, msg) {
				lines[msg] = line
			}
		}
	}
	for msg, want := range map[string]string{
		"agent: command failed":      "command_id=c1 command=fail context_id=flow-1",
		"agent: rejecting a command": "command_id=c2 command=missing context_id=flow-1",
	} {
		require.Contains(t, lines[msg], want, msg)
		require.Contains(t, lines[msg], "session_id=", msg)
	}
}

// blocker is a handler that runs until the test lets it end or its context
// ends, and tells the test when it starts.
func blocker(started chan<- string, release <-chan struct{}) agent.Handler {
	return func(ctx context.Context, cmd *protocol.Command, _ agent.Output) (any, error) {
		started <- cmd.CommandID
		select {
		case <-release:
			return "released", nil
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

func TestTimeout(t *testing.T) {
	t.Parallel()
	b := newFakeBroker(t, 1<<20)
	_, bc := startConnected(t, b, testConfig(b), map[string]agent.Handler{
		"block": blocker(make(chan string, 1), nil),
	})

	cmd := command("c1", "flow-1", "block", "")
	cmd.TimeoutMS = 50
	e := bc.errorCode(t, cmd)
	require.Equal(t, agent.CodeTimeout, string(e.Code))
	require.Contains(t, e.Message, "50ms")
}

func TestCancelRunningCommand(t *testing.T) {
	t.Parallel()
	b := newFakeBroker(t, 1<<20)
	started := make(chan string, 1)
	_, bc := startConnected(t, b, testConfig(b), map[string]agent.Handler{
		"block": blocker(started, nil),
	})

	bc.send(t, command("c1", "flow-1", "block", ""))
	require.Equal(t, &protocol.Ack{CommandID: "c1"}, bc.nextFrame(t))
	require.Equal(t, "c1", receive(t, started))
	bc.send(t, &protocol.Cancel{CommandID: "c1", Reason: "caller cancelled"})
	e := next[*protocol.Error](t, bc)
	require.Equal(t, &protocol.Error{CommandID: "c1", Code: agent.CodeCancelled,
		Message: "command cancelled by the broker: caller cancelled"}, e)
}

func TestCancelQueuedCommandAnswersAtOnce(t *testing.T) {
	t.Parallel()
	b := newFakeBroker(t, 1<<20)
	started := make(chan string, 2)
	release := make(chan struct{})
	_, bc := startConnected(t, b, testConfig(b), map[string]agent.Handler{
		"block": blocker(started, release),
	})

	bc.send(t, command("first", "flow-1", "block", ""))
	bc.send(t, command("queued", "flow-1", "block", ""))
	require.Equal(t, "first", receive(t, started))
	// Both are acknowledged while they wait (the first while it runs, the
	// other while it is queued), each on its own timer, in either order.
	require.ElementsMatch(t, []protocol.Frame{&protocol.Ack{CommandID: "first"}, &protocol.Ack{CommandID: "queued"}},
		[]protocol.Frame{bc.nextFrame(t), bc.nextFrame(t)})

	// The queued command ends while the first one still runs.
	bc.send(t, &protocol.Cancel{CommandID: "queued"})
	e := next[*protocol.Error](t, bc)
	require.Equal(t, "queued", e.CommandID)
	require.Equal(t, agent.CodeCancelled, string(e.Code))

	close(release)
	require.Equal(t, "first", next[*protocol.Result](t, bc).CommandID)
	// A command on the same flow after "queued" runs; "queued" never did.
	bc.send(t, command("after", "flow-1", "block", ""))
	require.Equal(t, "after", receive(t, started))
}

func TestPerContextFIFOAndParallelContexts(t *testing.T) {
	t.Parallel()
	b := newFakeBroker(t, 1<<20)
	var mu sync.Mutex
	var log []string
	record := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		log = append(log, s)
	}
	started := make(chan string, 3)
	releaseA := make(chan struct{})
	cfg := testConfig(b)
	cfg.Flows = 2
	_, bc := startConnected(t, b, cfg, map[string]agent.Handler{
		"step": func(ctx context.Context, cmd *protocol.Command, _ agent.Output) (any, error) {
			record("start " + cmd.CommandID)
			started <- cmd.CommandID
			if cmd.CommandID == "A" {
				<-releaseA
			}
			record("end " + cmd.CommandID)
			return nil, nil
		},
	})

	bc.send(t, command("A", "flow-1", "step", ""))
	bc.send(t, command("B", "flow-1", "step", ""))
	bc.send(t, command("C", "flow-2", "step", ""))

	// C, on flow-2, starts while A still blocks flow-1: contexts run in
	// parallel. B, queued behind A on flow-1, must not have started.
	first := []string{receive(t, started), receive(t, started)}
	require.ElementsMatch(t, []string{"A", "C"}, first)
	close(releaseA)
	require.Equal(t, "B", receive(t, started))

	results := map[string]bool{}
	for len(results) < 3 {
		if r, ok := bc.nextFrame(t).(*protocol.Result); ok {
			results[r.CommandID] = true
		}
	}
	mu.Lock()
	defer mu.Unlock()
	var flow1 []string
	for _, s := range log {
		if !strings.HasSuffix(s, " C") {
			flow1 = append(flow1, s)
		}
	}
	require.Equal(t, []string{"start A", "end A", "start B", "end B"}, flow1)
}

func TestResponseModeNoneSendsNoTerminal(t *testing.T) {
	t.Parallel()
	b := newFakeBroker(t, 1<<20)
	ran := make(chan string, 2)
	_, bc := startConnected(t, b, testConfig(b), map[string]agent.Handler{
		"note": func(_ context.Context, cmd *protocol.Command, _ agent.Output) (any, error) {
			ran <- cmd.CommandID
			return "noted", nil
		},
	})

	silent := command("silent", "flow-1", "note", "")
	silent.ResponseMode = protocol.ResponseNone
	bc.send(t, silent)
	bc.send(t, command("loud", "flow-1", "note", ""))

	// One flow runs its commands in order, so by the time "loud" has its
	// result, "silent" has finished: any terminal of it would have come first.
	require.Equal(t, []protocol.Frame{
		&protocol.Ack{CommandID: "silent"},
		&protocol.Ack{CommandID: "loud"},
		&protocol.Result{CommandID: "loud", Data: json.RawMessage(`"noted"`)},
	}, []protocol.Frame{bc.nextFrame(t), bc.nextFrame(t), bc.nextFrame(t)})
	require.Equal(t, "silent", receive(t, ran), "a response_mode none command still runs")
}

func TestResultTooLarge(t *testing.T) {
	t.Parallel()
	b := newFakeBroker(t, 1024)
	_, bc := startConnected(t, b, testConfig(b), map[string]agent.Handler{
		"big": func(context.Context, *protocol.Command, agent.Output) (any, error) {
			return strings.Repeat("x", 2000), nil
		},
		"chatty": func(_ context.Context, _ *protocol.Command, out agent.Output) (any, error) {
			err := out.Progress(strings.Repeat("x", 2000))
			return errors.Is(err, agent.ErrTooLarge), nil
		},
	})

	require.Equal(t, agent.CodeResultTooLarge, string(bc.errorCode(t, command("c1", "flow-1", "big", "")).Code))
	r := bc.result(t, command("c2", "flow-1", "chatty", ""))
	require.Equal(t, "true", string(r.(*protocol.Result).Data), "Progress reports ErrTooLarge and sends nothing")
}

func TestReconnectAfterGoingAway(t *testing.T) {
	t.Parallel()
	b := newFakeBroker(t, 1<<20)
	started := make(chan string, 1)
	release := make(chan struct{})
	r, bc1 := startConnected(t, b, testConfig(b), map[string]agent.Handler{
		"block": blocker(started, release),
	})

	// A command in flight when the connection drops keeps running.
	bc1.send(t, command("c1", "flow-1", "block", ""))
	require.Equal(t, "c1", receive(t, started))
	require.NoError(t, bc1.c.Close(websocket.StatusGoingAway, "broker shutting down"))

	bc2, state := b.accept(t)
	require.Equal(t, "console-1", bc2.hello.ClientID)
	require.Equal(t, testToken, bc2.hello.Token)
	require.Equal(t, []protocol.ContextReport{{ContextID: "flow-1", TabID: "1", Owner: protocol.OwnerWorker}},
		state.Contexts)
	connected(t, r.a)

	// Its result goes out on the new connection, after its ack unless
	// that went out on the old one (after 10 ms).
	close(release)
	frames := bc2.untilTerminal(t, "c1")
	require.Equal(t, &protocol.Result{CommandID: "c1", Data: json.RawMessage(`"released"`)}, frames[len(frames)-1])
	for _, f := range frames[:len(frames)-1] {
		require.Equal(t, &protocol.Ack{CommandID: "c1"}, f)
	}
	require.EqualValues(t, 2, b.hellos.Load())
}

func TestPingsAndSilentBrokerIsDropped(t *testing.T) {
	t.Parallel()
	b := newFakeBroker(t, 1<<20)
	b.mute.Store(true)
	cfg := testConfig(b)
	cfg.PingInterval = 10 * time.Millisecond
	start(t, agent.New(cfg))

	// The broker answers no ping, so the agent gives up on the connection
	// after three intervals of silence and connects again.
	bc1, _ := b.accept(t)
	b.accept(t)
	select {
	case <-bc1.done:
	case <-time.After(guard):
		t.Fatal("the silent connection is still open")
	}
	require.GreaterOrEqual(t, b.pings.Load(), int32(1), "the agent pings")
}

func TestPermanentCloseCodesStopRun(t *testing.T) {
	t.Parallel()
	for _, code := range []protocol.CloseCode{protocol.CloseForbidden, protocol.CloseReplaced} {
		t.Run(code.Reason(), func(t *testing.T) {
			t.Parallel()
			b := newFakeBroker(t, 1<<20)
			r, bc := startConnected(t, b, testConfig(b), nil)
			bc.send(t, &protocol.Error{Code: code.ErrorCode(), Message: "bye"})
			require.NoError(t, bc.c.Close(websocket.StatusCode(code), code.Reason()))

			ce, ok := errors.AsType[*agent.CloseError](r.wait(t))
			require.True(t, ok)
			require.Equal(t, code, ce.Code)
			require.Equal(t, string(code.ErrorCode()), ce.ErrorCode)
			require.EqualValues(t, 1, b.hellos.Load(), "no reconnect")
		})
	}
}

func TestUnauthorizedStopsRunWithoutRetry(t *testing.T) {
	t.Parallel()
	b := newFakeBroker(t, 1<<20)
	cfg := testConfig(b)
	cfg.Token = "ck_wrong"
	r := start(t, agent.New(cfg))

	err := r.wait(t)
	ce, ok := errors.AsType[*agent.CloseError](err)
	require.Truef(t, ok, "want a *CloseError, got %v", err)
	require.Equal(t, protocol.CloseUnauthorized, ce.Code)
	require.Equal(t, "unauthorized", ce.ErrorCode)
	require.Equal(t, "unknown client key", ce.Message)
	require.NotContains(t, err.Error(), "ck_wrong", "the token stays out of errors")
	require.EqualValues(t, 1, b.hellos.Load(), "no retry after 4401")
}

func receive[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(guard):
		t.Fatal("nothing received")
		var zero T
		return zero
	}
}

// On create_context the agent opens one more flow, up to MaxFlows, reports
// it with the request's id, and runs commands on it; beyond MaxFlows it
// answers create_failed.
func TestCreateContextOpensAFlow(t *testing.T) {
	t.Parallel()
	b := newFakeBroker(t, 1<<20)
	cfg := testConfig(b)
	cfg.MaxFlows = 2
	_, bc := startConnected(t, b, cfg, map[string]agent.Handler{"echo": agent.Echo()})
	require.Equal(t, 2, bc.hello.Capacity.MaxContexts)

	bc.send(t, &protocol.CreateContext{RequestID: "cr_1", URL: "https://example.com/"})
	st := next[*protocol.State](t, bc)
	require.Equal(t, []protocol.ContextReport{
		{ContextID: "flow-1", TabID: "1", Owner: protocol.OwnerWorker},
		{ContextID: "flow-2", TabID: "2", Owner: protocol.OwnerWorker, RequestID: "cr_1"},
	}, st.Contexts)
	bc.send(t, command("c1", "flow-2", "echo", `{"n":1}`))
	frames := bc.untilTerminal(t, "c1")
	require.JSONEq(t, `{"n":1}`, string(frames[len(frames)-1].(*protocol.Result).Data))

	bc.send(t, &protocol.CreateContext{RequestID: "cr_2"})
	failed := next[*protocol.CreateFailed](t, bc)
	require.Equal(t, "cr_2", failed.RequestID)
	require.Equal(t, protocol.ErrorCode(agent.CodeNoRoom), failed.Code)
}
