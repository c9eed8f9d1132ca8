package cheetah

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/cheetahbroker/cheetah/internal/tracing"
)

// instrumentation names the SDK's tracer.
const instrumentation = "github.com/cheetahbroker/cheetah"

// ManagerOption configures a Manager.
type ManagerOption func(*Manager)

// WithTracerProvider makes the Manager's spans (one per SDK call, such as
// cheetah.SendAndWait) with tp. The default is otel's global provider, a
// no-op unless the application installed an SDK. Each call's span is the
// parent of what the broker does for it: in process directly, and over
// HTTP through the W3C traceparent header the remote SDK sends.
func WithTracerProvider(tp trace.TracerProvider) ManagerOption {
	return func(m *Manager) {
		if tp != nil {
			m.tracer = tracing.Tracer(tp, instrumentation)
		}
	}
}

func defaultTracer() trace.Tracer { return tracing.Tracer(nil, instrumentation) }

// Span attributes of the SDK's calls. None is a secret: lease tokens never
// appear in a span.
var (
	attrUserID      = attribute.Key("cheetah.user_id")
	attrTaskID      = attribute.Key("cheetah.task_id")
	attrClientType  = attribute.Key("cheetah.client_type")
	attrContextID   = attribute.Key("cheetah.context_id")
	attrClientID    = attribute.Key("cheetah.client_id")
	attrEpoch       = attribute.Key("cheetah.epoch")
	attrCommandName = attribute.Key("cheetah.command.name")
	attrCommandID   = attribute.Key("cheetah.command_id")
	attrStatus      = attribute.Key("cheetah.status")
	attrErrorCode   = attribute.Key("cheetah.error.code")
	attrReason      = attribute.Key("cheetah.reason")
)

// clientSpan is the option of every SDK call's span, built once: a variadic
// list made per call would be allocated per call.
var clientSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}

// start begins the span of one SDK call. Its attributes are built only when
// the span records: a call without tracing pays for no attribute.
func start(ctx context.Context, tr trace.Tracer, name string, attrs func() []attribute.KeyValue) (context.Context, trace.Span) {
	ctx, span := tr.Start(ctx, name, clientSpan...)
	if attrs != nil && span.IsRecording() {
		span.SetAttributes(attrs()...)
	}
	return ctx, span
}

// finish ends an SDK call's span, marking it failed with the error's code.
func finish(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		code, reason, _ := Classify(err)
		if code == "" {
			code = "error"
		}
		span.SetAttributes(attrErrorCode.String(code))
		if reason != "" {
			span.SetAttributes(attrReason.String(reason))
		}
		span.SetStatus(codes.Error, code)
	}
	span.End()
}

func leaseAttrs(l Lease) []attribute.KeyValue {
	return []attribute.KeyValue{attrUserID.String(l.UserID), attrClientID.String(l.ClientID),
		attrContextID.String(l.ContextID), attrTaskID.String(l.TaskID), attrEpoch.Int64(l.Epoch)}
}
