package server_test

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/agent"
	"github.com/cheetahbroker/cheetah/remote"
	"github.com/cheetahbroker/cheetah/server"
	"github.com/cheetahbroker/cheetah/server/telemetry"
)

// spanLog is an in-memory span exporter (tracetest's) behind a tracer
// provider that exports each span as it ends, and that tells a waiting
// test when a span arrives.
type spanLog struct {
	*tracetest.InMemoryExporter
	tp      *sdktrace.TracerProvider
	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every export
}

func newSpanLog(t *testing.T) *spanLog {
	t.Helper()
	s := &spanLog{InMemoryExporter: tracetest.NewInMemoryExporter(), changed: make(chan struct{})}
	s.tp = sdktrace.NewTracerProvider(sdktrace.WithSyncer(s))
	t.Cleanup(func() { _ = s.tp.Shutdown(context.Background()) })
	return s
}

func (s *spanLog) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := s.InMemoryExporter.ExportSpans(ctx, spans)
	s.mu.Lock()
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	return err
}

func (s *spanLog) named(name string) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, sp := range s.GetSpans() {
		if sp.Name == name {
			out = append(out, sp)
		}
	}
	return out
}

// one returns the one ended span named name, waiting for it to end.
func (s *spanLog) one(t *testing.T, name string) tracetest.SpanStub {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		s.mu.Lock()
		changed := s.changed
		s.mu.Unlock()
		if got := s.named(name); len(got) > 0 {
			require.Len(t, got, 1, "spans named %s", name)
			return got[0]
		}
		select {
		case <-changed:
		case <-timeout:
			var names []string
			for _, sp := range s.GetSpans() {
				names = append(names, sp.Name)
			}
			t.Fatalf("no span %s ended; spans: %v", name, names)
		}
	}
}

func childOf(t *testing.T, child tracetest.SpanStub, parent trace.SpanContext, what string) {
	t.Helper()
	require.Equal(t, parent.TraceID(), child.SpanContext.TraceID(), "%s: trace", what)
	require.Equal(t, parent.SpanID(), child.Parent.SpanID(), "%s: parent of %s", what, child.Name)
}

func eventNames(s tracetest.SpanStub) []string {
	var out []string
	for _, e := range s.Events {
		out = append(out, e.Name)
	}
	return out
}

func attr(s tracetest.SpanStub, key string) string {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

// runAgent runs the agent library as user's console client with one flow
// that echoes, its spans in spans.
func runAgent(t *testing.T, url, key, clientID string, tp trace.TracerProvider, log *slog.Logger) {
	t.Helper()
	a := newAgent(url, key, clientID, tp, log)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	select {
	case <-a.Connected():
	case <-time.After(10 * time.Second):
		t.Fatal("the agent did not connect")
	}
}

// newAgent returns an agent library client of user with one flow that
// echoes.
func newAgent(url, key, clientID string, tp trace.TracerProvider, log *slog.Logger) *agent.Agent {
	a := agent.New(agent.Config{URL: url, Token: key, ClientID: clientID, Name: "test agent", Flows: 1,
		TracerProvider: tp, Log: log, MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	a.Handle("echo", agent.Echo())
	return a
}

// tracedBroker opens a broker whose spans go to the returned log.
func tracedBroker(t *testing.T) (*hookBroker, *spanLog) {
	t.Helper()
	spans := newSpanLog(t)
	tel, err := telemetry.New(context.Background(), telemetry.Config{TracerProvider: spans.tp})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, tel.Shutdown(context.Background())) })
	return openBroker(t, server.Options{Telemetry: tel}), spans
}

// checkCommandTrace checks the broker's and the client's side of one
// command's trace: the command span under parent, its admission, durable
// write and dispatch spans under it, and the client's span under the
// dispatch span (through the command frame's traceparent); the resolution
// and the history record carry the trace's id.
func checkCommandTrace(t *testing.T, broker, client *spanLog, parent trace.SpanContext, res cheetah.Resolution, rec cheetah.CommandRecord) {
	t.Helper()
	traceID := parent.TraceID()
	require.Equal(t, traceID.String(), res.TraceID, "the resolution's trace_id is the trace's")
	require.Equal(t, traceID.String(), rec.TraceID, "the record's trace_id is the trace's")

	cmd := broker.one(t, "cheetah.command")
	childOf(t, cmd, parent, "command")
	require.Equal(t, res.CommandID, attr(cmd, "cheetah.command_id"))
	require.Equal(t, "completed", attr(cmd, "cheetah.status"))
	childOf(t, broker.one(t, "cheetah.admit"), cmd.SpanContext, "admission")
	childOf(t, broker.one(t, "cheetah.history.write"), cmd.SpanContext, "durable write")

	// The command links to the acquire that made its lease.
	acq := broker.one(t, "cheetah.acquire")
	require.Len(t, cmd.Links, 1)
	require.Equal(t, acq.SpanContext.SpanID(), cmd.Links[0].SpanContext.SpanID())

	dispatch := broker.one(t, "cheetah.dispatch")
	childOf(t, dispatch, cmd.SpanContext, "dispatch")
	require.Equal(t, traceID.String(), dispatch.SpanContext.TraceID().String())
	require.Equal(t, []string{"dispatched", "acknowledged", "result"}, eventNames(dispatch),
		"the dispatch span sees the frame leave, the client's ack and its terminal message")

	side := client.one(t, "cheetah.agent.command")
	childOf(t, side, dispatch.SpanContext, "the client's span")
	require.True(t, side.Parent.IsRemote(), "the client's parent came over the wire")
	require.Equal(t, trace.SpanKindConsumer, side.SpanKind)
	require.Equal(t, res.CommandID, attr(side, "cheetah.command_id"))
	require.True(t, slices.Contains(eventNames(side), "send result"))
	require.False(t, side.EndTime.After(dispatch.EndTime), "the client's span ends before the broker's side")
}

// One trace covers an in-process SDK call, from Handle.SendAndWait through
// admission, the durable write and dispatch to the client's terminal
// message, with the agent library's span as a child.
func TestTraceInProcess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, broker := tracedBroker(t)
	client := newSpanLog(t)
	runAgent(t, b.http.URL, b.client, "agent-trace", client.tp, nil)

	mgr := b.open.Manager()
	h, err := mgr.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "traced", ClientType: cheetah.Console, Wait: 10 * time.Second})
	require.NoError(t, err)
	res, err := h.SendAndWait(ctx, cheetah.Command{Name: "echo", Params: map[string]int{"n": 1}})
	require.NoError(t, err)
	require.Equal(t, cheetah.StatusCompleted, res.Status)
	rec, err := mgr.History().Read(ctx, user, res.CommandID)
	require.NoError(t, err)

	sdk := broker.one(t, "cheetah.SendAndWait")
	require.False(t, sdk.Parent.IsValid(), "the SDK call starts the trace")
	require.Equal(t, res.CommandID, attr(sdk, "cheetah.command_id"))
	checkCommandTrace(t, broker, client, sdk.SpanContext, res, rec)

	// The SDK's acquire is the parent of the registry's.
	childOf(t, broker.one(t, "cheetah.acquire"), broker.one(t, "cheetah.Acquire").SpanContext, "acquire")
}

// Through the remote SDK the trace crosses HTTP twice: the SDK sends
// traceparent, the broker's server span continues it, and the command
// frame carries it on to the client.
func TestTraceRemote(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, broker := tracedBroker(t)
	client, app := newSpanLog(t), newSpanLog(t)
	runAgent(t, b.http.URL, b.client, "agent-trace", client.tp, nil)

	mgr := remote.New(b.http.URL, b.appKey, remote.WithTracerProvider(app.tp))
	h, err := mgr.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "traced", ClientType: cheetah.Console, Wait: 10 * time.Second})
	require.NoError(t, err)
	res, err := h.SendAndWait(ctx, cheetah.Command{Name: "echo", Params: map[string]int{"n": 1}})
	require.NoError(t, err)
	require.Equal(t, cheetah.StatusCompleted, res.Status)
	rec, err := mgr.History().Read(ctx, user, res.CommandID)
	require.NoError(t, err)

	sdk := app.one(t, "cheetah.SendAndWait")
	require.False(t, sdk.Parent.IsValid(), "the SDK call starts the trace")
	srv := broker.one(t, "POST /api/v1/commands/wait")
	childOf(t, srv, sdk.SpanContext, "the broker's server span")
	require.True(t, srv.Parent.IsRemote())
	require.Equal(t, trace.SpanKindServer, srv.SpanKind)
	require.Equal(t, "200", attr(srv, "http.response.status_code"))
	checkCommandTrace(t, broker, client, srv.SpanContext, res, rec)

	childOf(t, broker.one(t, "POST /api/v1/acquire"), app.one(t, "cheetah.Acquire").SpanContext, "acquire over HTTP")
	childOf(t, broker.one(t, "cheetah.acquire"), broker.one(t, "POST /api/v1/acquire").SpanContext, "the registry's acquire")
}

// Without a tracer that records, every command still has a valid W3C trace
// id, and a caller's trace context (here a traceparent from an application
// whose own tracing the broker does not share) is continued: the command's
// trace_id is the caller's.
func TestTraceIDWithoutSDK(t *testing.T) {
	t.Parallel()
	b := openBroker(t, server.Options{})
	runAgent(t, b.http.URL, b.client, "agent-trace", nil, nil)
	app := newSpanLog(t)

	ctx := context.Background()
	mgr := remote.New(b.http.URL, b.appKey, remote.WithTracerProvider(app.tp))
	h, err := mgr.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "untraced", ClientType: cheetah.Console, Wait: 10 * time.Second})
	require.NoError(t, err)
	res, err := h.SendAndWait(ctx, cheetah.Command{Name: "echo"})
	require.NoError(t, err)
	require.Equal(t, app.one(t, "cheetah.SendAndWait").SpanContext.TraceID().String(), res.TraceID)

	// No trace anywhere: a fresh random one.
	_, err = mgr.Release(ctx, h)
	require.NoError(t, err)
	plain := remote.New(b.http.URL, b.appKey)
	h, err = plain.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "untraced-2", ClientType: cheetah.Console})
	require.NoError(t, err)
	res2, err := h.SendAndWait(ctx, cheetah.Command{Name: "echo"})
	require.NoError(t, err)
	rec, err := plain.History().Read(ctx, user, res2.CommandID)
	require.NoError(t, err)
	require.Equal(t, res2.TraceID, rec.TraceID)
	require.Regexp(t, `^[0-9a-f]{32}$`, rec.TraceID)
	require.NotEqual(t, "00000000000000000000000000000000", rec.TraceID)
	require.NotEqual(t, res.TraceID, rec.TraceID, "each command is its own trace")
}
