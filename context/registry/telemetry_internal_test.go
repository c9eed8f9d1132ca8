package registry

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// While otel's global provider has no SDK behind it, an acquire starts no
// span (it would record nothing and allocate); a provider given in the
// config, or installed globally, is always used. The check relies on the
// name of otel's default global provider type: this test notices when an
// upgrade of otel renames it.
func TestAcquireSpanSkippedWithoutSDK(t *testing.T) {
	tel, err := newTelemetry(nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tel.idleGlobal == nil || tel.idleGlobal != otel.GetTracerProvider() {
		t.Fatalf("otel's default global provider (%T) not recognised", otel.GetTracerProvider())
	}
	if _, span := tel.startAcquire(context.Background()); !isNoop(span) {
		t.Fatalf("a span was started without an SDK: %T", span)
	}
	tel, err = newTelemetry(nil, tracenoop.NewTracerProvider(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if tel.idleGlobal != nil {
		t.Fatal("a configured provider taken for the idle global one")
	}
}

func isNoop(s trace.Span) bool {
	_, ok := s.(tracenoop.Span)
	return ok
}
