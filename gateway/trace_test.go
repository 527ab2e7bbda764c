package gateway_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/gateway"
	"github.com/coordd/coordd/internal/testing/fakegitlab"
)

// TestTracesLinkCallsToExecution: 10 agents' identical calls on one
// instance make one flight and one fetch span (the execution); the
// flight is a child of one call's request span, and every other call's
// request span links to it.
func TestTracesLinkCallsToExecution(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	api := fakegitlab.Start(t)
	in := fleetTraced(t, 1, []gateway.Server{gitlab(t, api, 1, 0)}, gateway.Options{}, tp)
	const n = 10
	var sessions []*mcp.ClientSession
	for range n {
		sessions = append(sessions, agent(t, in[0].url+"/mcp/gitlab", nil))
	}
	release := api.Hold()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for _, s := range sessions {
		wg.Go(func() {
			if r, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "get_file_contents", Arguments: map[string]any{"project_id": "1", "file_path": "t.md"}}); err != nil || r.IsError {
				t.Errorf("call: %v %v", err, r)
			}
		})
	}
	// Every call has joined the flight once the flight reports its waiters.
	waitFor(t, func() bool {
		for _, f := range in[0].co.Status(ctx).Flights {
			if f.Waiters == n {
				return true
			}
		}
		return false
	})
	release()
	wg.Wait()
	var flights, fetches []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.Name() {
		case coordinator.SpanFlight:
			flights = append(flights, s)
		case coordinator.SpanFetch:
			fetches = append(fetches, s)
		}
	}
	if len(flights) != 1 || len(fetches) != 1 {
		t.Fatalf("%d flight and %d fetch spans; want 1 and 1 (one execution)", len(flights), len(fetches))
	}
	flight := flights[0].SpanContext()
	parented, linked := 0, 0
	for _, s := range rec.Ended() {
		if s.SpanKind() != trace.SpanKindServer {
			continue
		}
		if s.SpanContext().SpanID() == flights[0].Parent().SpanID() {
			parented++
		}
		for _, l := range s.Links() {
			if l.SpanContext.SpanID() == flight.SpanID() {
				linked++
			}
		}
	}
	if parented != 1 || linked != n-1 {
		t.Fatalf("request spans: %d parent the flight, %d link to it; want 1 and %d", parented, linked, n-1)
	}
}
