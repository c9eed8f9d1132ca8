package telemetry

import (
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

// Which exporters the OTEL_* variables ask for. Nothing set is nothing
// exported: no exporter, so no connection.
func TestPlanFromEnv(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name            string
		env             []string
		traces, metrics string
		err             string
	}{
		{name: "nothing set", traces: "none", metrics: "none"},
		{name: "endpoint", env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"},
			traces: "otlp/http/protobuf", metrics: "otlp/http/protobuf"},
		{name: "traces endpoint only", env: []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/v1/traces"},
			traces: "otlp/http/protobuf", metrics: "none"},
		{name: "grpc", env: []string{"OTEL_TRACES_EXPORTER", "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"},
			traces: "otlp/grpc", metrics: "none"},
		{name: "per-signal protocol", env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://c", "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc",
			"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf"}, traces: "otlp/grpc", metrics: "otlp/http/protobuf"},
		{name: "none wins over an endpoint", env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://c", "OTEL_TRACES_EXPORTER", "none",
			"OTEL_METRICS_EXPORTER", "prometheus"}, traces: "none", metrics: "none"},
		{name: "list", env: []string{"OTEL_TRACES_EXPORTER", "console, otlp", "OTEL_METRICS_EXPORTER", "prometheus,console"},
			traces: "console,otlp/http/protobuf", metrics: "console"},
		{name: "disabled", env: []string{"OTEL_SDK_DISABLED", "true", "OTEL_TRACES_EXPORTER", "otlp"}, traces: "none", metrics: "none"},
		{name: "unknown exporter", env: []string{"OTEL_TRACES_EXPORTER", "zipkin"}, err: "zipkin"},
		{name: "prometheus traces", env: []string{"OTEL_TRACES_EXPORTER", "prometheus"}, err: "not a traces exporter"},
		{name: "json protocol", env: []string{"OTEL_TRACES_EXPORTER", "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"}, err: "http/json"},
	} {
		p, err := planFromEnv(env(c.env...))
		if c.err != "" {
			require.ErrorContains(t, err, c.err, c.name)
			continue
		}
		require.NoError(t, err, c.name)
		require.Equal(t, c.traces, p.describe(p.traces), c.name)
		require.Equal(t, c.metrics, p.describe(p.metrics), c.name)
	}
}

// The zero Config serves Prometheus text and traces with the global
// provider.
func TestNewWithoutExporters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tel, err := New(ctx, Config{FromEnv: true, Getenv: env()})
	require.NoError(t, err)
	require.Equal(t, otel.GetTracerProvider(), tel.TracerProvider())
	require.Equal(t, "none", tel.Traces)
	c, err := tel.MeterProvider().Meter("test").Int64Counter("test.things", metric.WithUnit("{thing}"))
	require.NoError(t, err)
	c.Add(ctx, 3)
	rec := httptest.NewRecorder()
	tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	require.Contains(t, string(body), "test_things_total 3")
	require.Contains(t, string(body), `target_info{service_name="cheetah"} 1`)
	require.Contains(t, string(body), "go_goroutines")
	require.NotContains(t, string(body), "otel_scope", "no scope labels")
	require.NoError(t, tel.Shutdown(ctx))
}

// Exporters are built from the environment without dialling anything, and
// Shutdown stops them.
func TestNewWithExporters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, proto := range []string{"http/protobuf", "grpc"} {
		tel, err := New(ctx, Config{FromEnv: true, WithoutMetrics: true, ServiceVersion: "1.2.3",
			Getenv: env("OTEL_TRACES_EXPORTER", "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL", proto)})
		require.NoError(t, err)
		require.Equal(t, "otlp/"+proto, tel.Traces)
		_, ok := tel.TracerProvider().(*sdktrace.TracerProvider)
		require.True(t, ok)
		require.Nil(t, tel.MeterProvider())
		require.NoError(t, tel.Shutdown(ctx))
	}
	_, err := New(ctx, Config{FromEnv: true, Getenv: env("OTEL_METRICS_EXPORTER", "statsd")})
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "statsd"))
}
