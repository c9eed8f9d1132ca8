package registry

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/internal/tracing"
)

// instrumentation names the registry's tracer and meter.
const instrumentation = "github.com/cheetahbroker/cheetah/context/registry"

// maxCommandNames bounds the distinct values of the command-name label of
// cheetah.command.duration: names come from applications, and a label with
// unbounded values would grow the metrics without bound. Names past the
// bound are counted as "_other".
const maxCommandNames = 256

// durationBuckets are the histogram bounds of command durations, in seconds.
var durationBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800}

// Span and metric attribute keys.
const (
	attrOutcome    = attribute.Key("outcome")
	attrReason     = attribute.Key("reason")
	attrClientType = attribute.Key("client_type")
	attrState      = attribute.Key("state")
	attrName       = attribute.Key("name")
	attrStatus     = attribute.Key("status")
	attrQuota      = attribute.Key("quota")
	attrQuotaLevel = attribute.Key("quota_level")

	spanUserID      = attribute.Key("cheetah.user_id")
	spanTaskID      = attribute.Key("cheetah.task_id")
	spanClientID    = attribute.Key("cheetah.client_id")
	spanContextID   = attribute.Key("cheetah.context_id")
	spanClientType  = attribute.Key("cheetah.client_type")
	spanEpoch       = attribute.Key("cheetah.epoch")
	spanCommandID   = attribute.Key("cheetah.command_id")
	spanCommandName = attribute.Key("cheetah.command.name")
	spanMode        = attribute.Key("cheetah.response_mode")
	spanStatus      = attribute.Key("cheetah.status")
	spanOutcome     = attribute.Key("cheetah.outcome")
	spanReason      = attribute.Key("cheetah.reason")
)

// telemetry is the registry's tracer and instruments. Counters that are
// bumped under r.mu use attribute options built once, so a bump is a map
// lookup and an atomic add.
type telemetry struct {
	tracer trace.Tracer

	acquires    metric.Int64Counter
	leasesEnded metric.Int64Counter
	leaseLost   metric.Int64Counter
	duration    metric.Float64Histogram
	reg         metric.Registration

	// Option slices built once: an Add through an interface with a fresh
	// variadic slice would allocate on every call.
	endedBy map[cheetah.LostReason][]metric.AddOption
	lostBy  map[cheetah.LostReason][]metric.AddOption

	acqMu   sync.RWMutex
	acqOpts map[acquireKey][]metric.AddOption

	namesMu sync.Mutex
	names   map[string]bool
	durOpts map[durationKey][]metric.RecordOption
}

type durationKey struct {
	name   string
	status cheetah.Status
}

type acquireKey struct{ outcome, reason, typ, level string }

var lostReasons = []cheetah.LostReason{
	cheetah.LostUnknownLease, cheetah.LostContextGone, cheetah.LostNotLive, cheetah.LostNotWorker,
	cheetah.LostReleased, cheetah.LostReassigned, cheetah.LostExpired, cheetah.LostRevoked,
}

func newTelemetry(r *Registry, tp trace.TracerProvider, mp metric.MeterProvider) (*telemetry, error) {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	t := &telemetry{
		tracer:  tracing.Tracer(tp, instrumentation),
		endedBy: map[cheetah.LostReason][]metric.AddOption{},
		lostBy:  map[cheetah.LostReason][]metric.AddOption{},
		acqOpts: map[acquireKey][]metric.AddOption{},
		names:   map[string]bool{},
		durOpts: map[durationKey][]metric.RecordOption{},
	}
	for _, r := range lostReasons {
		opt := metric.WithAttributeSet(attribute.NewSet(attrReason.String(string(r))))
		t.endedBy[r] = []metric.AddOption{opt}
		t.lostBy[r] = []metric.AddOption{opt}
	}
	m := mp.Meter(instrumentation)
	var err error
	t.acquires, err = m.Int64Counter("cheetah.acquires", metric.WithUnit("{acquire}"),
		metric.WithDescription("Acquire requests by outcome (acquired or the error code) and, for no_context_available, reason."))
	if err != nil {
		return nil, err
	}
	t.leasesEnded, err = m.Int64Counter("cheetah.leases.ended", metric.WithUnit("{lease}"),
		metric.WithDescription("Leases that ended, by reason: released, expired, revoked, context_gone."))
	if err != nil {
		return nil, err
	}
	t.leaseLost, err = m.Int64Counter("cheetah.lease_lost", metric.WithUnit("{error}"),
		metric.WithDescription("Sends and renews refused with lease_lost, by reason."))
	if err != nil {
		return nil, err
	}
	t.duration, err = m.Float64Histogram("cheetah.command.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from a command's admission to its terminal status, by command name and status."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	if err != nil {
		return nil, err
	}
	leases, err := m.Int64ObservableGauge("cheetah.leases", metric.WithUnit("{lease}"),
		metric.WithDescription("Active leases."))
	if err != nil {
		return nil, err
	}
	inflight, err := m.Int64ObservableGauge("cheetah.commands.in_flight", metric.WithUnit("{command}"),
		metric.WithDescription("Commands admitted and not yet ended."))
	if err != nil {
		return nil, err
	}
	clients, err := m.Int64ObservableGauge("cheetah.clients", metric.WithUnit("{client}"),
		metric.WithDescription("Clients by type and state: connected, or away within the reconnect grace."))
	if err != nil {
		return nil, err
	}
	contexts, err := m.Int64ObservableGauge("cheetah.contexts", metric.WithUnit("{context}"),
		metric.WithDescription("Contexts by client type and state: idle, leased, not_live, human."))
	if err != nil {
		return nil, err
	}
	waiting, err := m.Int64ObservableGauge("cheetah.acquires.waiting", metric.WithUnit("{acquire}"),
		metric.WithDescription("Acquires waiting for a context (wait_ms)."))
	if err != nil {
		return nil, err
	}
	quotaUsed, err := m.Int64ObservableGauge("cheetah.quota.used", metric.WithUnit("{slot}"),
		metric.WithDescription("Quota slots in use by quota and level; for tenant and user, the fullest scope's."))
	if err != nil {
		return nil, err
	}
	quotaFull, err := m.Int64ObservableGauge("cheetah.quota.full_scopes", metric.WithUnit("{scope}"),
		metric.WithDescription("Scopes whose slots are all in use, by quota and level."))
	if err != nil {
		return nil, err
	}
	t.reg, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, q := range r.quotaGauges() {
			attrs := metric.WithAttributes(attrQuota.String(q.quota), attrQuotaLevel.String(q.level))
			o.ObserveInt64(quotaUsed, int64(q.used), attrs)
			o.ObserveInt64(quotaFull, int64(q.full), attrs)
		}
		s := r.gauges()
		o.ObserveInt64(leases, int64(s.leases))
		o.ObserveInt64(inflight, int64(s.inflight))
		o.ObserveInt64(waiting, int64(s.waiters))
		for k, n := range s.clients {
			o.ObserveInt64(clients, int64(n), metric.WithAttributes(attrClientType.String(k.typ), attrState.String(k.state)))
		}
		for k, n := range s.contexts {
			o.ObserveInt64(contexts, int64(n), metric.WithAttributes(attrClientType.String(k.typ), attrState.String(k.state)))
		}
		return nil
	}, leases, inflight, clients, contexts, waiting, quotaUsed, quotaFull)
	if err != nil {
		return nil, err
	}
	return t, nil
}

type gaugeKey struct{ typ, state string }

type gaugeCounts struct {
	leases, inflight, waiters int
	clients, contexts         map[gaugeKey]int
}

// gauges counts what the observable gauges report. It scans every client
// and context under the lock, once per collection (a scrape), never on a
// request's path.
func (r *Registry) gauges() gaugeCounts {
	s := gaugeCounts{clients: map[gaugeKey]int{}, contexts: map[gaugeKey]int{}}
	for _, typ := range []cheetah.ClientType{cheetah.Browser, cheetah.Console} {
		t := string(typ)
		s.clients[gaugeKey{t, "connected"}], s.clients[gaugeKey{t, "away"}] = 0, 0
		for _, st := range []string{cheetah.StateIdle, cheetah.StateLeased, cheetah.StateNotLive, cheetah.StateHuman} {
			s.contexts[gaugeKey{t, st}] = 0
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s.leases, s.inflight = len(r.leases), len(r.commands)
	for _, p := range r.users {
		own, _ := p.waiting()
		s.waiters += own
		for _, c := range p.clients {
			state := "connected"
			if c.conn == nil {
				state = "away"
			}
			s.clients[gaugeKey{string(c.typ), state}]++
			for _, w := range c.contexts {
				s.contexts[gaugeKey{string(c.typ), w.state()}]++
			}
		}
	}
	return s
}

func (t *telemetry) close() {
	if t.reg != nil {
		_ = t.reg.Unregister()
	}
}

// observe counts what an event says: the leases that ended by reason, and
// the duration of every command that ended. It runs on the registry's
// notifier, off the lock, before the subscribers see the event.
func (t *telemetry) observe(ev *Event) {
	switch ev.Kind {
	case LeaseEnded:
		if opts, ok := t.endedBy[ev.Reason]; ok {
			t.leasesEnded.Add(context.Background(), 1, opts...)
		}
	case CommandEnded:
		if ev.Status.Terminal() {
			t.duration.Record(context.Background(), ev.At.Sub(ev.AdmittedAt).Seconds(), t.durationOpts(ev.CommandName, ev.Status)...)
		}
	}
}

// lost counts a lease_lost refusal; r.mu may be held.
func (t *telemetry) lost(reason cheetah.LostReason) {
	if opts, ok := t.lostBy[reason]; ok {
		t.leaseLost.Add(context.Background(), 1, opts...)
	}
}

// acquireOpts returns the attribute options of one acquire outcome, built
// once per combination (there are a few dozen).
func (t *telemetry) acquireOpts(k acquireKey) []metric.AddOption {
	t.acqMu.RLock()
	opts, ok := t.acqOpts[k]
	t.acqMu.RUnlock()
	if ok {
		return opts
	}
	attrs := []attribute.KeyValue{attrOutcome.String(k.outcome), attrReason.String(k.reason), attrClientType.String(k.typ)}
	if k.level != "" {
		attrs = append(attrs, attrQuotaLevel.String(k.level))
	}
	opts = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attrs...))}
	t.acqMu.Lock()
	t.acqOpts[k] = opts
	t.acqMu.Unlock()
	return opts
}

// acquired counts an acquire's outcome and closes its span.
func (t *telemetry) acquired(ctx context.Context, span trace.Span, req *cheetah.AcquireRequest, l cheetah.Lease, err error) {
	outcome, reason := "acquired", ""
	switch {
	case err == nil:
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		outcome = "cancelled"
	default:
		code, r, _ := cheetah.Classify(err)
		outcome, reason = code, r
		if outcome == "" {
			outcome = "error"
		}
	}
	level := ""
	if err != nil {
		// Declared here: errors.As makes nc escape, and an acquire that
		// succeeded should not allocate it.
		var nc *cheetah.NoContextError
		if errors.As(err, &nc) {
			if reason == "" {
				reason = string(nc.Reason)
			}
			if nc.Quota != nil {
				level = nc.Quota.Level
			}
		}
	}
	typ := string(req.ClientType)
	if !req.ClientType.Valid() {
		typ = "invalid"
	}
	t.acquires.Add(ctx, 1, t.acquireOpts(acquireKey{outcome, reason, typ, level})...)
	if span.IsRecording() {
		span.SetAttributes(spanUserID.String(req.UserID), spanTaskID.String(req.TaskID),
			spanClientType.String(typ), spanOutcome.String(outcome))
		if err == nil {
			span.SetAttributes(spanClientID.String(l.ClientID), spanContextID.String(l.ContextID), spanEpoch.Int64(l.Epoch))
		}
		if reason != "" {
			span.SetAttributes(spanReason.String(reason))
		}
		if err != nil && outcome != "cancelled" {
			span.SetStatus(codes.Error, outcome)
		}
	}
	span.End()
}

// durationOpts returns the attribute options of a command duration: its
// name and status, built once per pair. Past maxCommandNames distinct
// names, a new name counts as "_other".
func (t *telemetry) durationOpts(name string, status cheetah.Status) []metric.RecordOption {
	t.namesMu.Lock()
	defer t.namesMu.Unlock()
	if !t.names[name] {
		if len(t.names) >= maxCommandNames {
			name = "_other"
		} else {
			t.names[name] = true
		}
	}
	k := durationKey{name, status}
	opts, ok := t.durOpts[k]
	if !ok {
		opts = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(attrName.String(name), attrStatus.String(string(status))))}
		t.durOpts[k] = opts
	}
	return opts
}

// commandSpans is what a command carries for its trace: the command's span
// (admission to terminal status) and its dispatch span (durable record to
// terminal status; the command frame's traceparent names it, so the
// client's span is its child).
type commandSpans struct {
	cmd      trace.Span
	dispatch trace.Span // nil until the record is durable
	sc       trace.SpanContext
}

// startCommand starts a command's span. When no tracer records and the
// caller's context carries no trace either, the command still gets a valid
// random W3C trace id: every command has one (DESIGN §5).
func (t *telemetry) startCommand(ctx context.Context, cmd cheetah.Command, mode cheetah.ResponseMode) (context.Context, commandSpans) {
	ctx, span := t.tracer.Start(ctx, "cheetah.command")
	if span.IsRecording() {
		span.SetAttributes(spanCommandName.String(cmd.Name), spanMode.String(string(mode)))
	}
	sc := span.SpanContext()
	if !sc.IsValid() {
		sc = randomSpanContext()
		ctx = trace.ContextWithSpanContext(ctx, sc)
	}
	return ctx, commandSpans{cmd: span, sc: sc}
}

func randomSpanContext() trace.SpanContext {
	var tid trace.TraceID
	var sid trace.SpanID
	for !tid.IsValid() || !sid.IsValid() {
		var b [24]byte
		if _, err := rand.Read(b[:]); err != nil {
			panic(fmt.Sprintf("registry: crypto/rand: %v", err))
		}
		copy(tid[:], b[:16])
		copy(sid[:], b[16:])
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
}

// traceparent renders a span context as a W3C traceparent header.
func traceparent(sc trace.SpanContext) string {
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
}

// failed ends the spans of a command that was never admitted (or whose
// record could not be written).
func (s *commandSpans) failed(err error) {
	if s.dispatch != nil {
		s.dispatch.End()
	}
	if s.cmd.IsRecording() {
		code, _, _ := cheetah.Classify(err)
		if code == "" {
			code = "error"
		}
		s.cmd.SetStatus(codes.Error, code)
		s.cmd.SetAttributes(spanStatus.String("refused"))
	}
	s.cmd.End()
}

// endSpans ends the spans of command c, with its events (dispatched,
// acknowledged, the terminal message). It runs on the registry's notifier,
// off the lock, after every field it reads was last written. terminal is
// the kind of the client's terminal message, if one ended the command.
func (t *telemetry) endSpans(c *command, status cheetah.Status, e *cheetah.ErrorInfo, terminal cheetah.MessageKind) {
	if !c.traced {
		return
	}
	s := &c.spans
	st := spanStatus.String(string(status))
	if d := s.dispatch; d != nil {
		if c.wallDispatched != 0 {
			d.AddEvent("dispatched", trace.WithTimestamp(time.Unix(0, c.wallDispatched)))
		}
		if c.wallAcked != 0 {
			d.AddEvent("acknowledged", trace.WithTimestamp(time.Unix(0, c.wallAcked)))
		}
		var opts []trace.SpanEndOption
		if c.wallEnded != 0 {
			end := time.Unix(0, c.wallEnded)
			if terminal != "" {
				d.AddEvent(string(terminal), trace.WithTimestamp(end))
			}
			opts = append(opts, trace.WithTimestamp(end))
		}
		d.SetAttributes(st)
		d.End(opts...)
	}
	s.cmd.SetAttributes(st)
	switch status {
	case cheetah.StatusCompleted, cheetah.StatusDispatched, cheetah.StatusAcknowledged:
	default:
		msg := string(status)
		if e != nil && e.Code != "" {
			msg = e.Code
		}
		s.cmd.SetStatus(codes.Error, msg)
	}
	s.cmd.End()
}

// startAcquire starts an acquire's span (none while no SDK is installed:
// see tracing.Tracer).
func (t *telemetry) startAcquire(ctx context.Context) (context.Context, trace.Span) {
	return t.tracer.Start(ctx, "cheetah.acquire")
}
