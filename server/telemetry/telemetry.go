// Package telemetry builds the OpenTelemetry providers of a Cheetah process:
// a meter provider whose metrics are always served as Prometheus text (at
// the broker's /metrics), and, when the standard OTEL_* environment
// variables ask for them, OTLP (HTTP or gRPC) or console exporters of traces
// and metrics.
//
// With none of those variables set, nothing is exported and no network
// connection is made: the tracer provider is then otel's global one (a no-op
// unless the embedding application installed an SDK), and the broker still
// gives every command a valid random W3C trace id.
//
// Where this departs from the OpenTelemetry specification, it does so on
// purpose: the specification's default exporter is OTLP to localhost, which
// would make a broker that nobody configured dial a collector that is not
// there. Here an unset OTEL_TRACES_EXPORTER means "otlp" only when an OTLP
// endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT or the signal's own), and
// "none" otherwise. docs/operations.md lists every variable.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	promexporter "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdoutmetric"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Config says what to build. The zero value serves metrics as Prometheus
// text and exports nothing.
type Config struct {
	// ServiceName and ServiceVersion describe the process in the resource
	// of exported telemetry (service.name, service.version).
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override them when
	// FromEnv is set. Default "cheetah".
	ServiceName    string
	ServiceVersion string
	// FromEnv chooses exporters from the OTEL_* environment variables.
	// Without it nothing is exported.
	FromEnv bool
	// Getenv reads the environment when FromEnv is set; nil is os.Getenv.
	// (The OTLP exporters read their own variables, such as
	// OTEL_EXPORTER_OTLP_ENDPOINT and OTEL_EXPORTER_OTLP_HEADERS, from the
	// process environment.)
	Getenv func(string) string
	// TracerProvider, when set, is used as it is and no trace exporter is
	// built: an application with its own SDK, or a test with an in-memory
	// exporter. Telemetry does not shut it down.
	TracerProvider trace.TracerProvider
	// WithoutMetrics builds no meter provider (a process that only traces,
	// such as the console agent).
	WithoutMetrics bool
}

// Telemetry holds the providers. Create it with New and stop it with
// Shutdown, which flushes what the exporters still hold.
type Telemetry struct {
	tracer   trace.TracerProvider
	sdkTrace *sdktrace.TracerProvider // nil unless this package built it
	meter    metric.MeterProvider
	sdkMeter *sdkmetric.MeterProvider // nil WithoutMetrics
	metrics  http.Handler

	// Traces and Metrics name the exporters chosen, for the start log:
	// "none", or a list such as "otlp/grpc". Prometheus text at /metrics is
	// not listed: it is always there.
	Traces, Metrics string
}

// New builds the providers cfg asks for.
func New(ctx context.Context, cfg Config) (*Telemetry, error) {
	if cfg.ServiceName == "" {
		cfg.ServiceName = "cheetah"
	}
	getenv := cfg.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	p := plan{}
	if cfg.FromEnv {
		var err error
		if p, err = planFromEnv(getenv); err != nil {
			return nil, err
		}
	}
	t := &Telemetry{Traces: p.describe(p.traces), Metrics: p.describe(p.metrics)}
	res, err := newResource(ctx, cfg, getenv)
	if err != nil {
		return nil, err
	}

	switch {
	case cfg.TracerProvider != nil:
		t.tracer, t.Traces = cfg.TracerProvider, "provided"
	case len(p.traces) > 0:
		opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
		for _, e := range p.traces {
			exp, err := newSpanExporter(ctx, e)
			if err != nil {
				return nil, err
			}
			opts = append(opts, sdktrace.WithBatcher(exp))
		}
		t.sdkTrace = sdktrace.NewTracerProvider(opts...)
		t.tracer = t.sdkTrace
	default:
		t.tracer = otel.GetTracerProvider()
	}

	if cfg.WithoutMetrics {
		t.meter, t.Metrics = nil, "none"
		return t, nil
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	prom, err := promexporter.New(
		promexporter.WithRegisterer(reg),
		promexporter.WithoutScopeInfo(),
		promexporter.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes),
	)
	if err != nil {
		_ = t.Shutdown(ctx)
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	mopts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(prom)}
	for _, e := range p.metrics {
		r, err := newMetricReader(ctx, e)
		if err != nil {
			_ = t.Shutdown(ctx)
			return nil, err
		}
		mopts = append(mopts, sdkmetric.WithReader(r))
	}
	t.sdkMeter = sdkmetric.NewMeterProvider(mopts...)
	t.meter = t.sdkMeter
	t.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{EnableOpenMetrics: true})
	return t, nil
}

// TracerProvider returns the provider the broker's spans come from.
func (t *Telemetry) TracerProvider() trace.TracerProvider { return t.tracer }

// MeterProvider returns the provider of the broker's metrics; nil when built
// WithoutMetrics.
func (t *Telemetry) MeterProvider() metric.MeterProvider { return t.meter }

// MetricsHandler serves every metric as Prometheus text; nil when built
// WithoutMetrics.
func (t *Telemetry) MetricsHandler() http.Handler { return t.metrics }

// Shutdown flushes and stops what New built: the exporters send what they
// still hold, until ctx ends. A provider given in Config is left alone.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	if t.sdkTrace != nil {
		errs = append(errs, t.sdkTrace.Shutdown(ctx))
	}
	if t.sdkMeter != nil {
		errs = append(errs, t.sdkMeter.Shutdown(ctx))
	}
	return errors.Join(errs...)
}

func newResource(ctx context.Context, cfg Config, getenv func(string) string) (*resource.Resource, error) {
	attrs := []attribute.KeyValue{attribute.String("service.name", cfg.ServiceName)}
	if cfg.ServiceVersion != "" {
		attrs = append(attrs, attribute.String("service.version", cfg.ServiceVersion))
	}
	base := resource.NewSchemaless(attrs...)
	if !cfg.FromEnv || getenv("OTEL_SERVICE_NAME")+getenv("OTEL_RESOURCE_ATTRIBUTES") == "" {
		return base, nil
	}
	env, err := resource.New(ctx, resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("telemetry: OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	return resource.Merge(base, env)
}

// exporter is one exporter to build: a kind ("otlp", "console") and, for
// OTLP, its protocol ("grpc", "http/protobuf").
type exporter struct{ kind, protocol string }

func (e exporter) String() string {
	if e.protocol != "" {
		return e.kind + "/" + e.protocol
	}
	return e.kind
}

// plan is which exporters the environment asks for.
type plan struct{ traces, metrics []exporter }

func (plan) describe(es []exporter) string {
	if len(es) == 0 {
		return "none"
	}
	s := make([]string, len(es))
	for i, e := range es {
		s[i] = e.String()
	}
	return strings.Join(s, ",")
}

// planFromEnv reads the OTEL_* variables that choose exporters. It builds
// nothing, so it can be tested without a network.
func planFromEnv(getenv func(string) string) (plan, error) {
	var p plan
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return p, nil
	}
	var err error
	if p.traces, err = signalPlan(getenv, "traces", "TRACES"); err != nil {
		return p, err
	}
	if p.metrics, err = signalPlan(getenv, "metrics", "METRICS"); err != nil {
		return p, err
	}
	return p, nil
}

func signalPlan(getenv func(string) string, signal, upper string) ([]exporter, error) {
	var names []string
	for n := range strings.SplitSeq(getenv("OTEL_"+upper+"_EXPORTER"), ",") {
		if n = strings.ToLower(strings.TrimSpace(n)); n != "" {
			names = append(names, n)
		}
	}
	if len(names) == 0 && (getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_"+upper+"_ENDPOINT") != "") {
		names = []string{"otlp"}
	}
	var out []exporter
	for _, n := range names {
		switch n {
		case "none":
		case "prometheus":
			if signal != "metrics" {
				return nil, fmt.Errorf("telemetry: OTEL_%s_EXPORTER: %q is not a %s exporter", upper, n, signal)
			}
			// Always served at /metrics; nothing more to build.
		case "console":
			out = append(out, exporter{kind: "console"})
		case "otlp":
			proto := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_" + upper + "_PROTOCOL"))
			if proto == "" {
				proto = strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_PROTOCOL"))
			}
			if proto == "" {
				proto = "http/protobuf"
			}
			if proto != "grpc" && proto != "http/protobuf" {
				return nil, fmt.Errorf("telemetry: OTLP protocol %q is not supported for %s (grpc or http/protobuf)", proto, signal)
			}
			out = append(out, exporter{kind: "otlp", protocol: proto})
		default:
			return nil, fmt.Errorf("telemetry: OTEL_%s_EXPORTER: %q is not supported (otlp, console, none)", upper, n)
		}
	}
	return out, nil
}

func newSpanExporter(ctx context.Context, e exporter) (sdktrace.SpanExporter, error) {
	var (
		exp sdktrace.SpanExporter
		err error
	)
	switch {
	case e.kind == "console":
		exp, err = stdouttrace.New()
	case e.protocol == "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry: %s trace exporter: %w", e, err)
	}
	return exp, nil
}

func newMetricReader(ctx context.Context, e exporter) (sdkmetric.Reader, error) {
	var (
		exp sdkmetric.Exporter
		err error
	)
	switch {
	case e.kind == "console":
		exp, err = stdoutmetric.New()
	case e.protocol == "grpc":
		exp, err = otlpmetricgrpc.New(ctx)
	default:
		exp, err = otlpmetrichttp.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry: %s metric exporter: %w", e, err)
	}
	// The interval and timeout come from OTEL_METRIC_EXPORT_INTERVAL and
	// OTEL_METRIC_EXPORT_TIMEOUT (60 s and 30 s by default).
	return sdkmetric.NewPeriodicReader(exp), nil
}
