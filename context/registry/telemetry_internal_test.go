package registry

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// While otel's global provider has no SDK behind it, an acquire starts no
// span (it would record nothing and allocate; see tracing.Tracer); a
// provider given in the config is always used.
func TestAcquireSpanSkippedWithoutSDK(t *testing.T) {
	tel, err := newTelemetry(nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, span := tel.startAcquire(context.Background()); !isNoop(span) {
		t.Fatalf("a span was started without an SDK: %T", span)
	}
	tp := &countingProvider{TracerProvider: tracenoop.NewTracerProvider()}
	tel, err = newTelemetry(nil, tp, nil)
	if err != nil {
		t.Fatal(err)
	}
	tel.startAcquire(context.Background())
	if tp.tracers == 0 {
		t.Fatal("a configured provider was not used")
	}
}

type countingProvider struct {
	trace.TracerProvider
	tracers int
}

func (p *countingProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	p.tracers++
	return p.TracerProvider.Tracer(name, opts...)
}

func isNoop(s trace.Span) bool {
	_, ok := s.(tracenoop.Span)
	return ok
}
