package tracing_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/cheetahbroker/cheetah/internal/tracing"
)

// The default global provider handed on explicitly, as a broker without a
// trace exporter does, starts nothing either. Not parallel, and first: the
// next test installs an SDK for good.
func TestDefaultGlobalProviderGivenStartsNothing(t *testing.T) {
	tp := otel.GetTracerProvider()
	tr := tracing.Tracer(tp, "test")
	ctx := context.Background()
	got, span := tr.Start(ctx, "idle")
	require.False(t, span.IsRecording())
	require.Equal(t, ctx, got)
	require.Zero(t, testing.AllocsPerRun(100, func() { _, s := tr.Start(ctx, "idle"); s.End() }))
}

// Not parallel: it installs otel's global provider, for good (otel cannot
// go back to its default one).
func TestGlobalTracerStartsNothingUntilAnSDKIsInstalled(t *testing.T) {
	tr := tracing.Tracer(nil, "test")
	ctx := context.Background()

	got, span := tr.Start(ctx, "idle")
	require.False(t, span.IsRecording())
	require.False(t, span.SpanContext().IsValid())
	require.Equal(t, ctx, got, "the context is passed on as it is")
	require.Zero(t, testing.AllocsPerRun(100, func() { _, s := tr.Start(ctx, "idle"); s.End() }))

	// A parent in the context stays the callee's parent.
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})
	pctx := trace.ContextWithSpanContext(ctx, parent)
	got, span = tr.Start(pctx, "idle child")
	require.False(t, span.IsRecording())
	require.Equal(t, parent, span.SpanContext(), "the child carries its parent's span context")
	require.Equal(t, parent, trace.SpanContextFromContext(got))
	require.Zero(t, testing.AllocsPerRun(100, func() { _, s := tr.Start(pctx, "idle child"); s.End() }))

	// Once an SDK is installed, the same tracer's spans record through it.
	rec := tracetest.NewSpanRecorder()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	_, span = tr.Start(pctx, "recorded")
	require.True(t, span.IsRecording())
	span.End()
	require.Len(t, rec.Ended(), 1)
	require.Equal(t, "recorded", rec.Ended()[0].Name())
	require.Equal(t, parent.TraceID(), rec.Ended()[0].SpanContext().TraceID())
}

func TestTracerOfAProviderIsItsOwn(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	_, span := tracing.Tracer(tp, "test").Start(context.Background(), "s")
	require.True(t, span.IsRecording())
	span.End()
	require.Len(t, rec.Ended(), 1)
}
