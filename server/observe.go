package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/internal/tracing"
	"github.com/cheetahbroker/cheetah/protocol"
)

// instrumentation names the server's tracer and meter.
const instrumentation = "github.com/cheetahbroker/cheetah/server"

// HeaderRequestID names a request in the broker's logs. A request that
// carries a well-formed one keeps it; any other gets a new one. The answer
// always carries it.
const HeaderRequestID = "X-Request-Id"

// logKey holds a request's logger in the gin context.
const logKey = "cheetah.log"

// propagator reads the caller's trace context from requests: W3C Trace
// Context (traceparent, tracestate) and Baggage, whatever otel's global
// propagator is.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// instruments are the server's metrics.
type instruments struct {
	tracer trace.Tracer
	frames metric.Int64Counter
	http   metric.Float64Histogram
	// frameOpt holds the attribute options of every frame type and
	// direction, built once: counting a frame is then a map lookup and an
	// atomic add.
	frameOpt map[frameKey][]metric.AddOption
}

type frameKey struct {
	typ protocol.Type
	dir string
}

// Frame directions.
const (
	dirIn  = "in"
	dirOut = "out"
)

// frameTypes are the frame types of protocol v1, plus "unknown" for a type
// the broker does not know.
var frameTypes = []protocol.Type{
	protocol.TypeHello, protocol.TypeState, protocol.TypeAck, protocol.TypeProgress, protocol.TypeEvent,
	protocol.TypeCapture, protocol.TypeResult, protocol.TypePing, protocol.TypeWelcome, protocol.TypeCommand,
	protocol.TypeCancel, protocol.TypeAssignment, protocol.TypePong, protocol.TypeError, "unknown",
}

func newInstruments(tp trace.TracerProvider, mp metric.MeterProvider) (*instruments, error) {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	in := &instruments{tracer: tracing.Tracer(tp, instrumentation), frameOpt: map[frameKey][]metric.AddOption{}}
	m := mp.Meter(instrumentation)
	var err error
	in.frames, err = m.Int64Counter("cheetah.frames", metric.WithUnit("{frame}"),
		metric.WithDescription("WebSocket frames by type and direction (in: from clients, out: to clients)."))
	if err != nil {
		return nil, err
	}
	in.http, err = m.Float64Histogram("cheetah.http.server.duration", metric.WithUnit("s"),
		metric.WithDescription("HTTP requests by method, route and status code, and how long they took."),
		metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
	if err != nil {
		return nil, err
	}
	for _, t := range frameTypes {
		for _, d := range []string{dirIn, dirOut} {
			in.frameOpt[frameKey{t, d}] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(
				attribute.String("type", string(t)), attribute.String("direction", d)))}
		}
	}
	return in, nil
}

// frame counts one frame.
func (in *instruments) frame(t protocol.Type, dir string) {
	opts, ok := in.frameOpt[frameKey{t, dir}]
	if !ok {
		opts = in.frameOpt[frameKey{"unknown", dir}]
	}
	in.frames.Add(context.Background(), 1, opts...)
}

// observe runs around every request: it names the request (X-Request-Id),
// gives it a logger that carries that name, continues the caller's trace
// with a server span (API routes), and counts it. It logs the request at
// debug, never its headers: they carry keys and lease tokens.
func (s *Server) observe(c *gin.Context) {
	start := time.Now()
	id := requestID(c.GetHeader(HeaderRequestID))
	c.Header(HeaderRequestID, id)
	log := s.log.With("request_id", id)
	c.Set(logKey, log)
	route := c.FullPath()
	var span trace.Span
	if strings.HasPrefix(route, "/api/v1/") && route != "/api/v1/openapi.json" {
		ctx := propagator.Extract(c.Request.Context(), propagation.HeaderCarrier(c.Request.Header))
		ctx, span = s.tel.tracer.Start(ctx, c.Request.Method+" "+route, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(
				attribute.String("http.request.method", c.Request.Method),
				attribute.String("http.route", route),
				attribute.String("cheetah.request_id", id),
			))
		c.Request = c.Request.WithContext(ctx)
	}
	c.Next()
	status := c.Writer.Status()
	if span != nil {
		span.SetAttributes(attribute.Int("http.response.status_code", status))
		if status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(status))
		}
		span.End()
	}
	if route == "" {
		route = "unmatched" // a path of no route: its text is the caller's, unbounded
	}
	s.tel.http.Record(context.Background(), time.Since(start).Seconds(), metric.WithAttributes(
		attribute.String("method", methodLabel(c.Request.Method)), attribute.String("route", route),
		attribute.String("status", strconv.Itoa(status))))
	if c.Request.URL.Path == "/ws/v1/client" {
		return // a session logs its own lines
	}
	log.Debug("http", "method", c.Request.Method, "route", route, "status", status,
		"ms", time.Since(start).Milliseconds())
}

// requestID returns the caller's request id when it is well formed (1 to
// 128 characters of letters, digits and ._:-), else a new one.
func requestID(h string) string {
	if len(h) == 0 || len(h) > 128 {
		return newID()
	}
	for _, r := range h {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == ':', r == '-':
		default:
			return newID()
		}
	}
	return h
}

// reqLog returns the request's logger, which names the request.
func (s *Server) reqLog(c *gin.Context) *slog.Logger {
	if l, ok := c.Get(logKey); ok {
		return l.(*slog.Logger)
	}
	return s.log
}

// recoverPanic answers a handler's panic with 500 and logs it with the
// request's id and the stack, never the request's headers (gin's own
// recovery would print them, lease tokens included).
func (s *Server) recoverPanic(c *gin.Context) {
	defer func() {
		v := recover()
		if v == nil {
			return
		}
		if err, ok := v.(error); ok && errors.Is(err, http.ErrAbortHandler) {
			panic(v)
		}
		s.reqLog(c).Error("handler panicked", "route", c.FullPath(), "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
		if !c.Writer.Written() {
			c.AbortWithStatusJSON(http.StatusInternalServerError, cheetah.Envelope{Error: &cheetah.EnvelopeError{Code: "internal", Message: "internal error"}})
		} else {
			c.Abort()
		}
	}()
	c.Next()
}

// Drain makes the server refuse new work while a graceful shutdown lets
// the commands in flight finish: /readyz answers 503 and new client
// connections are refused with 503 (the registry, drained too, refuses
// acquires and sends). Connected clients stay, to finish what they run.
func (s *Server) Drain() {
	s.draining.Store(true)
	s.console.Close() // its event streams would hold an HTTP server's shutdown
}

// errDraining answers what a draining broker no longer takes.
var errDraining = &cheetah.Error{Code: cheetah.CodeOverloaded, Message: "the broker is shutting down"}

// methodLabel bounds the method label of the HTTP metric: a method is the
// caller's text, so one the API does not know counts as "other".
func methodLabel(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions:
		return m
	}
	return "other"
}
