package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	coordd "github.com/coordd/coordd/clients/go"
	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/oteltest"
	"github.com/coordd/coordd/internal/testing/redistest"
	"github.com/coordd/coordd/internal/testing/storetest"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestTracingSettings(t *testing.T) {
	half, two := 0.5, 2.0
	tests := []struct {
		name    string
		cfg     tracingConfig
		env     map[string]string
		want    tracingSettings
		wantErr string
	}{
		{name: "nothing set: off", want: tracingSettings{sampleRatio: -1, protocol: "grpc"}},
		{name: "service name alone: off", env: map[string]string{"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}, want: tracingSettings{sampleRatio: -1, protocol: "grpc"}},
		{name: "config endpoint", cfg: tracingConfig{Endpoint: "http://c:4317", SampleRatio: &half},
			want: tracingSettings{on: true, protocol: "grpc", endpoint: "http://c:4317", shown: "http://c:4317", sampleRatio: 0.5}},
		{name: "config http gets /v1/traces", cfg: tracingConfig{Endpoint: "https://c:4318", Protocol: "http/protobuf"},
			want: tracingSettings{on: true, protocol: "http/protobuf", endpoint: "https://c:4318/v1/traces", shown: "https://c:4318", sampleRatio: -1}},
		{name: "env endpoint wins; the exporter reads it", cfg: tracingConfig{Endpoint: "http://c:4317"}, env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://e:4317"},
			want: tracingSettings{on: true, protocol: "grpc", shown: "http://e:4317", sampleRatio: -1}},
		{name: "traces endpoint wins over the general one", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://e:4317", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:4318/v1/traces", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
			want: tracingSettings{on: true, protocol: "http/protobuf", shown: "http://t:4318/v1/traces", sampleRatio: -1}},
		{name: "env protocol wins", cfg: tracingConfig{Endpoint: "http://c:4317", Protocol: "http/protobuf"}, env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"},
			want: tracingSettings{on: true, protocol: "grpc", endpoint: "http://c:4317", shown: "http://c:4317", sampleRatio: -1}},
		{name: "env sampler wins over the ratio", cfg: tracingConfig{Endpoint: "http://c:4317", SampleRatio: &half}, env: map[string]string{"OTEL_TRACES_SAMPLER": "always_off"},
			want: tracingSettings{on: true, protocol: "grpc", endpoint: "http://c:4317", shown: "http://c:4317", sampleRatio: -1}},
		{name: "sdk disabled", cfg: tracingConfig{Endpoint: "http://c:4317"}, env: map[string]string{"OTEL_SDK_DISABLED": "true"}, want: tracingSettings{sampleRatio: -1}},
		{name: "exporter none", cfg: tracingConfig{Endpoint: "http://c:4317"}, env: map[string]string{"OTEL_TRACES_EXPORTER": "none"}, want: tracingSettings{sampleRatio: -1}},
		{name: "bad exporter", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, wantErr: "OTEL_TRACES_EXPORTER"},
		{name: "bad protocol", cfg: tracingConfig{Endpoint: "http://c:4317", Protocol: "udp"}, wantErr: "tracing.protocol"},
		{name: "bad ratio", cfg: tracingConfig{Endpoint: "http://c:4317", SampleRatio: &two}, wantErr: "tracing.sample_ratio"},
		{name: "endpoint without scheme", cfg: tracingConfig{Endpoint: "c:4317"}, wantErr: "tracing.endpoint"},
		{name: "env endpoint without host", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://"}, wantErr: "OTEL_EXPORTER_OTLP_ENDPOINT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.cfg.settings(envOf(tt.env))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v; want one naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("settings = %+v; want %+v", got, tt.want)
			}
		})
	}
}

// TestTracingConfigBlock: the tracing: block parses, and a typo in it is
// refused by name.
func TestTracingConfigBlock(t *testing.T) {
	fc, err := readConfig(strings.NewReader("tracing:\n  endpoint: http://otel:4317\n  protocol: grpc\n  sample_ratio: 0.25\n"))
	if err != nil {
		t.Fatal(err)
	}
	if fc.Tracing.Endpoint != "http://otel:4317" || fc.Tracing.SampleRatio == nil || *fc.Tracing.SampleRatio != 0.25 {
		t.Errorf("tracing = %+v; want the endpoint and a 0.25 ratio", fc.Tracing)
	}
	if _, err := readConfig(strings.NewReader("tracing:\n  endpont: x\n")); err == nil || !strings.Contains(err.Error(), "endpont") {
		t.Errorf("err = %v; want one naming endpont", err)
	}
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// startTestTracing is coordd's tracing with cfg, and no OTEL_* variables
// but a short batch delay, so that spans reach the receiver soon after they
// end.
func startTestTracing(t *testing.T, cfg tracingConfig) *tracing {
	t.Helper()
	s, err := cfg.settings(envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	tr, err := startTracing(context.Background(), s, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.shutdown)
	return tr
}

// callUntil opens a GetOrFetch stream and returns once the call reported
// stage; the rest of the stream is read in the background, and its end
// (nil on a complete document) comes on the channel.
func callUntil(t *testing.T, ctx context.Context, c coorddv1.CoordinatorServiceClient, url string, stage coorddv1.Stage) <-chan error {
	t.Helper()
	st, err := c.GetOrFetch(ctx, &coorddv1.GetOrFetchRequest{Url: url})
	if err != nil {
		t.Fatal(err)
	}
	for {
		m, err := st.Recv()
		if err != nil {
			t.Fatalf("stream ended before stage %v: %v", stage, err)
		}
		if m.GetProgress().GetStage() == stage {
			break
		}
	}
	done := make(chan error, 1)
	go func() {
		for {
			if _, err := st.Recv(); err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				done <- err
				return
			}
		}
	}()
	return done
}

const (
	callSpan   = "coordd.v1.CoordinatorService/GetOrFetch"
	callerTID  = "4bf92f3577b34da6a3ce929d0e0e4736"
	callerSID  = "00f067aa0ba902b7"
	httpTID    = "0af7651916cd43dd8448eb211c80319c"
	httpSID    = "b7ad6b7169203331"
	traceAttrs = "coordd.role coordd.waiters coordd.lock.outcome coordd.landed coordd.attempt http.response.status_code"
)

// TestTracingColdBurstAcrossInstances: a cold burst over two instances
// that export, one over OTLP/gRPC, one over OTLP/HTTP, to a receiver in
// the test. Instance A fetches; the follower flight of instance B links
// to A's fetch span through the done event; callers' trace contexts
// parent the call spans; a local follower's call links to its flight.
func TestTracingColdBurstAcrossInstances(t *testing.T) {
	redistest.SkipShort(t)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50") // ms: batches leave soon after the spans end
	recv := oteltest.Start(t)
	rs := redistest.Start(t)
	up := fakeupstream.New(t)
	release := make(chan struct{})
	up.Set("/doc", fakeupstream.Behavior{Block: release})
	cfg := coordinator.Config{Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: up.URL()}}}
	trA := startTestTracing(t, tracingConfig{Endpoint: recv.GRPCEndpoint})
	trB := startTestTracing(t, tracingConfig{Endpoint: recv.HTTPEndpoint, Protocol: "http/protobuf"})
	a := fleettest.Start(t, fleettest.Options{RedisURL: rs.URL(), Config: cfg, TracerProvider: trA.provider(), GRPC: trA.grpcOptions()})
	b := fleettest.Start(t, fleettest.Options{RedisURL: rs.URL(), Config: cfg, TracerProvider: trB.provider(), GRPC: trB.grpcOptions(), HTTP: true, WrapHTTP: trB.instrumentHTTP})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// The done event on the wire carries the leader's traceparent.
	sub, err := storetest.New(rs.Client(t), "").Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()

	// The caller of A: the Go client, traced by the otelgrpc client
	// handler passed through its dial options.
	exp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(recv.GRPCEndpoint))
	if err != nil {
		t.Fatal(err)
	}
	clientTP := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "test-client"))))
	t.Cleanup(func() { _ = clientTP.Shutdown(context.Background()) })
	cl, err := coordd.Dial(a.Addr, coordd.WithDialOptions(grpc.WithStatsHandler(otelgrpc.NewClientHandler(
		otelgrpc.WithTracerProvider(clientTP), otelgrpc.WithPropagators(propagation.TraceContext{})))))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	aDone := make(chan error, 1)
	go func() { _, err := cl.Get(ctx, up.URL()+"/doc"); aDone <- err }()
	if err := up.WaitCount(ctx, "/doc", 1); err != nil {
		t.Fatal(err) // A holds the lock and fetches
	}

	// B's first caller sends its trace context as metadata, and follows A;
	// its second joins B's flight.
	bc := b.Dial(t)
	b1 := callUntil(t, metadata.AppendToOutgoingContext(ctx, "traceparent", "00-"+callerTID+"-"+callerSID+"-01"), bc, up.URL()+"/doc", coorddv1.Stage_STAGE_WAITING_LEADER)
	b2 := callUntil(t, ctx, bc, up.URL()+"/doc", coorddv1.Stage_STAGE_JOINED)
	close(release)
	for _, ch := range []<-chan error{aDone, b1, b2} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	var done storetest.Event
	for done.Type == "" {
		ev, err := sub.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == storetest.EventDone {
			done = ev
		}
	}
	// The HTTP door, with a traceparent header (an L1 hit on B).
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, b.HTTPURL+"/v1/documents?url="+up.URL()+"/doc", nil)
	req.Header.Set("traceparent", "00-"+httpTID+"-"+httpSID+"-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("http door: %s", resp.Status)
	}
	if n := up.Count("/doc"); n != 1 {
		t.Fatalf("upstream requests = %d; want 1", n)
	}

	// Every span ends by the time the instances stop; then wait for the
	// batches to arrive.
	a.Stop()
	b.Stop()
	err = recv.Wait(ctx, func(s []oteltest.Span) bool {
		return len(oteltest.Named(s, callSpan)) >= 4 && len(oteltest.Named(s, coordinator.SpanFlight)) >= 2 &&
			len(oteltest.Named(s, coordinator.SpanLand)) >= 1 && len(oteltest.Named(s, "GET /v1/documents")) >= 1
	})
	spans := recv.Spans()
	t.Logf("spans received:\n%s", oteltest.Tree(spans, strings.Fields(traceAttrs)...))
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]oteltest.Span{}
	for _, s := range spans {
		byID[s.SpanID] = s
	}
	fetches := oteltest.Named(spans, coordinator.SpanFetch)
	if len(fetches) != 1 {
		t.Fatalf("%d fetch spans; want 1", len(fetches))
	}
	fetch := fetches[0]
	if done.Trace != "00-"+fetch.TraceID+"-"+fetch.SpanID+"-01" {
		t.Errorf("done event's traceparent %q; want the fetch span's", done.Trace)
	}
	flightA := byID[fetch.ParentID]
	if flightA.Name != coordinator.SpanFlight || flightA.Attributes["coordd.role"] != "leader" {
		t.Fatalf("fetch's parent = %+v; want A's leader flight", flightA)
	}
	callA := byID[flightA.ParentID]
	client := byID[callA.ParentID]
	if callA.Name != callSpan || client.Service != "test-client" || client.TraceID != callA.TraceID {
		t.Errorf("A's flight parent %+v, its parent %+v; want the call span under the Go client's span", callA, client)
	}
	var attempts, lands []oteltest.Span
	for _, s := range spans {
		switch {
		case s.Name == "coordd.upstream.attempt" && s.ParentID == fetch.SpanID:
			attempts = append(attempts, s)
		case s.Name == coordinator.SpanLand && s.ParentID == flightA.SpanID:
			lands = append(lands, s)
		}
	}
	if len(attempts) != 1 || attempts[0].Attributes["http.response.status_code"] != "200" {
		t.Errorf("attempts under the fetch = %+v; want one answered 200", attempts)
	}
	if len(lands) != 1 || lands[0].Attributes["coordd.landed"] != "true" {
		t.Errorf("landings under A's flight = %+v; want one landed", lands)
	}
	var flightB oteltest.Span
	for _, s := range oteltest.Named(spans, coordinator.SpanFlight) {
		if s.Instance != flightA.Instance {
			flightB = s
		}
	}
	if flightB.Attributes["coordd.role"] != "follower" || flightB.Attributes["coordd.waiters"] != "2" {
		t.Errorf("B's flight = %+v; want a follower with 2 waiters", flightB)
	}
	linked := false
	for _, l := range flightB.Links {
		linked = linked || (l.TraceID == fetch.TraceID && l.SpanID == fetch.SpanID && l.Attributes["coordd.link"] == "leader_fetch")
	}
	if !linked {
		t.Errorf("B's flight links %+v; want one to A's fetch span %s/%s", flightB.Links, fetch.TraceID, fetch.SpanID)
	}
	callB1 := byID[flightB.ParentID]
	if callB1.Name != callSpan || callB1.TraceID != callerTID || callB1.ParentID != callerSID {
		t.Errorf("B's flight parent = %+v; want the call span under the caller's traceparent", callB1)
	}
	joined := false
	for _, s := range oteltest.Named(spans, callSpan) {
		for _, l := range s.Links {
			joined = joined || (s.Instance == flightB.Instance && l.SpanID == flightB.SpanID && l.Attributes["coordd.link"] == "flight")
		}
	}
	if !joined {
		t.Error("no call span on B links to B's flight; want the joining caller's")
	}
	for _, s := range oteltest.Named(spans, coordinator.SpanLock) {
		want := "acquired"
		if s.Instance == flightB.Instance {
			want = "contended"
		}
		if s.Attributes["coordd.lock.outcome"] != want {
			t.Errorf("lock span on %s: outcome %q; want %q", s.Instance, s.Attributes["coordd.lock.outcome"], want)
		}
	}
	door := oteltest.Named(spans, "GET /v1/documents")[0]
	if door.TraceID != httpTID || door.ParentID != httpSID {
		t.Errorf("HTTP door span %+v; want it under the request's traceparent", door)
	}
}

// TestTracingOff: with an endpoint in the environment but the SDK
// disabled, coordd builds no provider, instruments nothing, exports no
// span, and its events carry no trace context.
func TestTracingOff(t *testing.T) {
	redistest.SkipShort(t)
	recv := oteltest.Start(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.GRPCEndpoint)
	t.Setenv("OTEL_SDK_DISABLED", "true")
	s, err := tracingConfig{Endpoint: recv.GRPCEndpoint}.settings(os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := startTracing(context.Background(), s, quiet)
	if err != nil {
		t.Fatal(err)
	}
	h := http.NewServeMux()
	if tr.provider() != nil || tr.grpcOptions() != nil || tr.tp != nil {
		t.Fatalf("tracing off built %+v", tr)
	}
	if got := tr.instrumentHTTP(h); got != http.Handler(h) {
		t.Fatalf("instrumentHTTP wrapped the handler in %T; want it as it is", got)
	}
	rs := redistest.Start(t)
	up := fakeupstream.New(t)
	in := fleettest.Start(t, fleettest.Options{RedisURL: rs.URL(), TracerProvider: tr.provider(), GRPC: tr.grpcOptions(),
		Config: coordinator.Config{Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: up.URL()}}}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sub, err := storetest.New(rs.Client(t), "").Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	cctx := metadata.AppendToOutgoingContext(ctx, "traceparent", "00-"+callerTID+"-"+callerSID+"-01")
	if _, err := fleettest.Get(cctx, in.Dial(t), &coorddv1.GetOrFetchRequest{Url: up.URL() + "/off"}); err != nil {
		t.Fatal(err)
	}
	ev, err := sub.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Type != storetest.EventDone || ev.Trace != "" {
		t.Errorf("%s event with traceparent %q; want a done event without one", ev.Type, ev.Trace)
	}
	in.Stop()
	if n := len(recv.Spans()); n != 0 {
		t.Errorf("%d spans received with tracing off; want 0", n)
	}
}
