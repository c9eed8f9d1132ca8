// Package tracing gives Cheetah's packages their OpenTelemetry tracer.
package tracing

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.opentelemetry.io/otel/trace/noop"
)

// Tracer returns the tracer called name of tp, or of otel's global provider
// when tp is nil. While the global provider is otel's default one (no SDK
// installed), none of its spans records, yet each Start would allocate a
// non-recording span and a context to carry it: on the broker's hottest
// calls (an acquire, a release, a send) that is most of what they allocate.
// So the tracer returned for it starts nothing until an SDK is installed,
// and from then on is the global provider's own. That holds whether tp is
// nil or that default provider itself, as a broker without a trace exporter
// hands it on.
func Tracer(tp trace.TracerProvider, name string) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if !isDefaultGlobal(tp) {
		return tp.Tracer(name)
	}
	return &globalTracer{idle: tp, tracer: tp.Tracer(name)}
}

// isDefaultGlobal reports whether tp is otel's global provider as it is
// before otel.SetTracerProvider: otel does not export its type.
func isDefaultGlobal(tp trace.TracerProvider) bool {
	return fmt.Sprintf("%T", tp) == "*global.tracerProvider"
}

// globalTracer is the tracer of otel's default global provider (idle):
// until another provider is installed, Start returns ctx as it is and a
// span that records nothing. As otel's non-recording spans do, that span
// carries its parent's span context, so that a trace the caller began goes
// on (a command's trace id, the traceparent a client is sent), and the
// parent stays the span a callee finds in ctx.
type globalTracer struct {
	embedded.Tracer
	idle   trace.TracerProvider
	tracer trace.Tracer
}

func (g *globalTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if otel.GetTracerProvider() != g.idle {
		return g.tracer.Start(ctx, name, opts...)
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		if parent := trace.SpanFromContext(ctx); !parent.IsRecording() {
			// A parent that records nothing serves as the child as it
			// is: every method of it does nothing, and a new span
			// would cost an allocation per call (the broker gives each
			// command such a parent, for its trace id).
			return ctx, parent
		}
		return ctx, parentSpan{sc: sc}
	}
	return ctx, noop.Span{}
}

// parentSpan records nothing; its span context is its parent's.
type parentSpan struct {
	noop.Span
	sc trace.SpanContext
}

func (s parentSpan) SpanContext() trace.SpanContext { return s.sc }
