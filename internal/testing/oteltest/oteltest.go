// Package oteltest is an OTLP trace receiver for tests: a real gRPC
// server (and an HTTP one, for http/protobuf) implementing the OTLP
// TraceService, which keeps every span it is sent, so that tests can
// export through the real OTLP exporters and look at what arrived.
package oteltest

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Span is a received span, its ids in lowercase hex.
type Span struct {
	Service    string // the resource's service.name
	Instance   string // the resource's service.instance.id
	Name       string
	TraceID    string
	SpanID     string
	ParentID   string // "" for a root span
	Attributes map[string]string
	Events     []string // event names, in order
	Links      []Link
	Error      bool // status ERROR
}

// Link is a received span link.
type Link struct {
	TraceID, SpanID string
	Attributes      map[string]string
}

// Receiver keeps the spans it is sent. It is safe for concurrent use.
type Receiver struct {
	collectorpb.UnimplementedTraceServiceServer
	// GRPCEndpoint is the receiver's OTLP/gRPC endpoint, http://host:port.
	GRPCEndpoint string
	// HTTPEndpoint is the receiver's OTLP/HTTP base URL, http://host:port;
	// it serves POST /v1/traces in protobuf.
	HTTPEndpoint string

	mu      sync.Mutex // protects spans and changed
	spans   []Span
	changed chan struct{} // closed and replaced when spans arrive
}

// Start runs a receiver on free loopback ports until the test ends.
func Start(t testing.TB) *Receiver {
	t.Helper()
	r := &Receiver{changed: make(chan struct{})}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("oteltest: listen: %v", err)
	}
	gs := grpc.NewServer()
	collectorpb.RegisterTraceServiceServer(gs, r)
	go func() { _ = gs.Serve(gl) }()
	t.Cleanup(gs.Stop)
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("oteltest: listen: %v", err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(r.serveHTTP)}
	go func() { _ = hs.Serve(hl) }()
	t.Cleanup(func() { hs.Close() })
	r.GRPCEndpoint = "http://" + gl.Addr().String()
	r.HTTPEndpoint = "http://" + hl.Addr().String()
	return r
}

// Export implements the OTLP TraceService.
func (r *Receiver) Export(_ context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	r.add(req)
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path != "/v1/traces" || req.Method != http.MethodPost {
		http.Error(w, "POST /v1/traces only", http.StatusNotFound)
		return
	}
	b, err := io.ReadAll(req.Body)
	var m collectorpb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(b, &m)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.add(&m)
	out, _ := proto.Marshal(&collectorpb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (r *Receiver) add(req *collectorpb.ExportTraceServiceRequest) {
	var got []Span
	for _, rs := range req.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{
					Service: res["service.name"], Instance: res["service.instance.id"],
					Name: s.GetName(), TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					Attributes: attrs(s.GetAttributes()), Error: s.GetStatus().GetCode() == 2,
				}
				if p := s.GetParentSpanId(); len(p) > 0 {
					sp.ParentID = hex.EncodeToString(p)
				}
				for _, e := range s.GetEvents() {
					sp.Events = append(sp.Events, e.GetName())
				}
				for _, l := range s.GetLinks() {
					sp.Links = append(sp.Links, Link{TraceID: hex.EncodeToString(l.GetTraceId()), SpanID: hex.EncodeToString(l.GetSpanId()), Attributes: attrs(l.GetAttributes())})
				}
				got = append(got, sp)
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		v := kv.GetValue()
		switch x := v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = x.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = fmt.Sprint(x.IntValue)
		case *commonpb.AnyValue_BoolValue:
			m[kv.GetKey()] = fmt.Sprint(x.BoolValue)
		case *commonpb.AnyValue_DoubleValue:
			m[kv.GetKey()] = fmt.Sprint(x.DoubleValue)
		default:
			m[kv.GetKey()] = v.String()
		}
	}
	return m
}

// Spans returns a copy of every span received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Wait waits until done says yes to the spans received, or ctx ends.
func (r *Receiver) Wait(ctx context.Context, done func([]Span) bool) error {
	for {
		r.mu.Lock()
		spans, ch := append([]Span(nil), r.spans...), r.changed
		r.mu.Unlock()
		if done(spans) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("oteltest: %w; %d spans received", ctx.Err(), len(spans))
		}
	}
}

// Named returns the spans named name.
func Named(spans []Span, name string) []Span {
	var out []Span
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// Tree renders spans as indented trees, children under their parent, each
// line the span's name, its service, instance and chosen attributes, and
// its links by the name of the span they point to: for logs and docs.
func Tree(spans []Span, attrKeys ...string) string {
	byID := make(map[string]Span, len(spans))
	kids := make(map[string][]Span)
	for _, s := range spans {
		byID[s.SpanID] = s
	}
	var roots []Span
	for _, s := range spans {
		if _, ok := byID[s.ParentID]; ok {
			kids[s.ParentID] = append(kids[s.ParentID], s)
		} else {
			roots = append(roots, s)
		}
	}
	var b strings.Builder
	var walk func(s Span, depth int)
	walk = func(s Span, depth int) {
		fmt.Fprintf(&b, "%s%s [%s %s]", strings.Repeat("  ", depth), s.Name, s.Service, s.Instance)
		for _, k := range attrKeys {
			if v, ok := s.Attributes[k]; ok {
				fmt.Fprintf(&b, " %s=%s", k, v)
			}
		}
		for _, l := range s.Links {
			target := "?"
			if t, ok := byID[l.SpanID]; ok {
				target = t.Name + " [" + t.Service + " " + t.Instance + "]"
			}
			fmt.Fprintf(&b, " link(%s)→%s", l.Attributes["coordd.link"], target)
		}
		b.WriteByte('\n')
		ks := kids[s.SpanID]
		sort.SliceStable(ks, func(i, j int) bool { return ks[i].Name < ks[j].Name })
		for _, k := range ks {
			walk(k, depth+1)
		}
	}
	for _, s := range roots {
		walk(s, 0)
	}
	return b.String()
}
