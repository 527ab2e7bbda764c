package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/server"
)

// tracingConfig is the tracing: block of the configuration. Tracing is on
// when an OTLP endpoint is set, here or in the standard environment
// variables; the environment wins over each field, as the OpenTelemetry
// specification has it for programmatic defaults. See
// docs/observability.md.
type tracingConfig struct {
	// Endpoint is the OTLP collector's base URL, http:// (plaintext) or
	// https://, e.g. http://otel-collector:4317. Overridden by
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT.
	// Default: none, tracing off.
	Endpoint string `yaml:"endpoint"`
	// Protocol is "grpc" or "http/protobuf" (which posts to
	// Endpoint/v1/traces unless Endpoint has a path). Overridden by
	// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL.
	// Default: grpc.
	Protocol string `yaml:"protocol"`
	// SampleRatio is the share of new traces sampled, 0 to 1; a call that
	// arrives with a traceparent follows its caller's decision. Overridden
	// by OTEL_TRACES_SAMPLER. Default: 1.
	SampleRatio *float64 `yaml:"sample_ratio"`
}

// tracingSettings are what tracing will do, validated: the config merged
// with the environment.
type tracingSettings struct {
	on          bool
	protocol    string  // grpc or http/protobuf
	endpoint    string  // from the config; "" when the environment names it (the exporter reads it there)
	shown       string  // the endpoint in use, for the log
	sampleRatio float64 // < 0: the SDK's (OTEL_TRACES_SAMPLER, or parent-based always-on)
}

// settings validates tc against the environment (getenv), before any
// network I/O.
func (tc tracingConfig) settings(getenv func(string) string) (tracingSettings, error) {
	s := tracingSettings{sampleRatio: -1}
	if v := getenv("OTEL_SDK_DISABLED"); strings.EqualFold(strings.TrimSpace(v), "true") {
		return s, nil
	}
	switch v := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); v {
	case "", "otlp":
	case "none":
		return s, nil
	default:
		return s, fmt.Errorf("config: OTEL_TRACES_EXPORTER=%q: coordd exports traces with otlp only (or none)", v)
	}
	s.protocol = firstSet(getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), getenv("OTEL_EXPORTER_OTLP_PROTOCOL"), tc.Protocol, "grpc")
	if s.protocol != "grpc" && s.protocol != "http/protobuf" {
		return s, fmt.Errorf("config: tracing.protocol (or OTEL_EXPORTER_OTLP_PROTOCOL): %q: want grpc or http/protobuf", s.protocol)
	}
	if r := tc.SampleRatio; r != nil {
		if !(*r >= 0 && *r <= 1) {
			return s, fmt.Errorf("config: tracing.sample_ratio: %v: want 0 to 1", *r)
		}
		if getenv("OTEL_TRACES_SAMPLER") == "" {
			s.sampleRatio = *r
		}
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if v := getenv(name); v != "" {
			if err := checkEndpoint(v); err != nil {
				return s, fmt.Errorf("config: %s: %w", name, err)
			}
			s.on, s.shown = true, v
			return s, nil
		}
	}
	if tc.Endpoint == "" {
		return s, nil
	}
	if err := checkEndpoint(tc.Endpoint); err != nil {
		return s, fmt.Errorf("config: tracing.endpoint: %w", err)
	}
	s.on, s.endpoint, s.shown = true, tc.Endpoint, tc.Endpoint
	if u, _ := url.Parse(tc.Endpoint); s.protocol == "http/protobuf" && strings.Trim(u.Path, "/") == "" {
		// As for OTEL_EXPORTER_OTLP_ENDPOINT: a base URL.
		u.Path = "/v1/traces"
		s.endpoint = u.String()
	}
	return s, nil
}

// checkEndpoint refuses what the exporter would only log and drop.
func checkEndpoint(v string) error {
	u, err := url.Parse(v)
	switch {
	case err != nil:
		return err
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("%q: want an http:// or https:// URL", v)
	case u.Host == "":
		return fmt.Errorf("%q: no host", v)
	}
	return nil
}

func firstSet(vs ...string) string {
	for _, v := range vs {
		if v = strings.TrimSpace(v); v != "" {
			return v
		}
	}
	return ""
}

// tracing is coordd's tracer provider and what it instruments. A tracing
// that is off (zero) instruments nothing: no stats handler, no HTTP
// wrapper, no provider for the engine.
type tracing struct {
	tp    *sdktrace.TracerProvider // nil: off
	props propagation.TextMapPropagator
}

// startTracing builds the provider s describes, exporting in batches over
// OTLP. It connects lazily: nothing here does network I/O.
func startTracing(ctx context.Context, s tracingSettings, log *slog.Logger) (*tracing, error) {
	if !s.on {
		return &tracing{}, nil
	}
	var exp sdktrace.SpanExporter
	var err error
	if s.protocol == "grpc" {
		var opts []otlptracegrpc.Option
		if s.endpoint != "" {
			opts = append(opts, otlptracegrpc.WithEndpointURL(s.endpoint))
		}
		exp, err = otlptracegrpc.New(ctx, opts...)
	} else {
		var opts []otlptracehttp.Option
		if s.endpoint != "" {
			opts = append(opts, otlptracehttp.WithEndpointURL(s.endpoint))
		}
		exp, err = otlptracehttp.New(ctx, opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("config: tracing: %w", err)
	}
	// service.name defaults to coordd; OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES, merged last, win. service.instance.id
	// tells the instances of a fleet apart.
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithAttributes(
			attribute.String("service.name", "coordd"),
			attribute.String("service.instance.id", instanceID()),
		),
		resource.WithFromEnv(),
	)
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("config: tracing: resource: %w", err)
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithBatcher(exp), sdktrace.WithResource(res)}
	if s.sampleRatio >= 0 {
		opts = append(opts, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(s.sampleRatio))))
	}
	log.Info("tracing on", "endpoint", s.shown, "protocol", s.protocol)
	return &tracing{
		tp:    sdktrace.NewTracerProvider(opts...),
		props: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
	}, nil
}

// instanceID names this process for service.instance.id: host and pid,
// and a random suffix for instances sharing a process (tests).
func instanceID() string {
	host, _ := os.Hostname()
	return host + "/" + strconv.Itoa(os.Getpid()) + "/" + rand.Text()[:8]
}

// provider is the engine's TracerProvider: nil (an untyped nil, so that
// the engine sees no provider) when tracing is off.
func (t *tracing) provider() trace.TracerProvider {
	if t.tp == nil {
		return nil
	}
	return t.tp
}

// grpcOptions trace coordd's own service (not health or reflection),
// taking the caller's W3C trace context from the call's metadata.
func (t *tracing) grpcOptions() []grpc.ServerOption {
	if t.tp == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(t.tp),
		otelgrpc.WithPropagators(t.props),
		otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()), // metrics are Prometheus's
		otelgrpc.WithFilter(filters.ServiceName(coorddv1.CoordinatorService_ServiceDesc.ServiceName)),
	))}
}

// instrumentHTTP traces the HTTP door's requests, taking the caller's
// traceparent header.
func (t *tracing) instrumentHTTP(h http.Handler) http.Handler {
	if t.tp == nil || h == nil {
		return h
	}
	return otelhttp.NewHandler(h, "coordd.http",
		otelhttp.WithTracerProvider(t.tp),
		otelhttp.WithPropagators(t.props),
		otelhttp.WithMeterProvider(metricnoop.NewMeterProvider()),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string {
			switch r.URL.Path {
			case server.HTTPDocumentsPath, server.HTTPInvalidatePath:
				return r.Method + " " + r.URL.Path
			}
			return r.Method // any other path: bounded span names
		}),
	)
}

// shutdown flushes the spans still buffered, within a few seconds.
func (t *tracing) shutdown() {
	if t.tp == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = t.tp.Shutdown(ctx)
}
