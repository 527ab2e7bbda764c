package gateway_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/gateway"
	"github.com/coordd/coordd/internal/secret"
	"github.com/coordd/coordd/internal/testing/enginetest"
	"github.com/coordd/coordd/internal/testing/fakegitlab"
	"github.com/coordd/coordd/internal/testing/mcpservers"
	"github.com/coordd/coordd/internal/testing/redistest"
)

// counts is a gateway.Metrics that counts.
type counts struct {
	calls, executions, retries, restarts atomic.Int64
	abandoned                            atomic.Int64
	mu                                   sync.Mutex
	processes                            map[string]int
	peak                                 map[string]int
}

func newCounts() *counts { return &counts{processes: map[string]int{}, peak: map[string]int{}} }

func (c *counts) MCPCall(string, string)           { c.calls.Add(1) }
func (c *counts) MCPExecution(string, string)      { c.executions.Add(1) }
func (c *counts) MCPServed(string, string, string) {}
func (c *counts) MCPRetry(string)                  { c.retries.Add(1) }
func (c *counts) MCPRestart(string)                { c.restarts.Add(1) }
func (c *counts) MCPAbandoned(string, string)      { c.abandoned.Add(1) }
func (c *counts) MCPProcesses(s string, d int) {
	c.mu.Lock()
	c.processes[s] += d
	c.peak[s] = max(c.peak[s], c.processes[s])
	c.mu.Unlock()
}

// instance is one coordd with its gateway, on a shared Redis.
type instance struct {
	gw  *gateway.Gateway
	co  *coordinator.Coordinator
	url string // the gateway's base: URL + "/mcp/NAME"
	m   *counts
	rd  *redistest.Server // the fleet's Redis
}

// fleet starts n instances of the gateway for servers on one Redis.
func fleet(t *testing.T, n int, servers []gateway.Server, opt gateway.Options) []*instance {
	t.Helper()
	return fleetTraced(t, n, servers, opt, nil)
}

// fleetTraced is fleet with each instance traced by tp (nil: none), its
// gateway's requests by otelhttp as coordd's listener does.
func fleetTraced(t *testing.T, n int, servers []gateway.Server, opt gateway.Options, tp trace.TracerProvider) []*instance {
	t.Helper()
	return fleetWith(t, n, servers, opt, tp, nil)
}

// fleetWith is fleetTraced with the engines' clock (nil: time.Now).
func fleetWith(t *testing.T, n int, servers []gateway.Server, opt gateway.Options, tp trace.TracerProvider, now func() time.Time) []*instance {
	t.Helper()
	rd := redistest.Start(t)
	var out []*instance
	for range n {
		m := newCounts()
		o := opt
		o.Metrics = m
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		o.Redis = rd.Client(t)
		gw, err := gateway.New(servers, o)
		if err != nil {
			t.Fatal(err)
		}
		cfg := coordinator.Config{Upstreams: gw.Upstreams(), CredentialScopeKey: secret.New("gateway-test-scope-key-0123456789"), Logger: o.Logger, Now: now}
		co, err := coordinator.New(cfg, coordinator.Options{Redis: rd.Client(t), Transport: gw.Wrap(nil), TracerProvider: tp})
		if err != nil {
			t.Fatal(err)
		}
		gw.Bind(co)
		h := gw.Handler()
		if tp != nil {
			h = otelhttp.NewHandler(h, "mcp", otelhttp.WithTracerProvider(tp))
		}
		srv := httptest.NewServer(h)
		t.Cleanup(func() {
			srv.Close()
			gw.Close()
			co.Close()
		})
		out = append(out, &instance{gw: gw, co: co, url: srv.URL, m: m, rd: rd})
	}
	return out
}

// agent connects an official Go SDK client to url.
func agent(t *testing.T, url string, header map[string]string) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil)
	tr := &mcp.StreamableClientTransport{Endpoint: url, DisableStandaloneSSE: true}
	if len(header) > 0 {
		tr.HTTPClient = httpClientWith(header)
	}
	s, err := c.Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("connecting to %s: %v", url, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func text(t *testing.T, r *mcp.CallToolResult) string {
	t.Helper()
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func gitlab(t *testing.T, api *fakegitlab.API, processes int, ttl time.Duration) gateway.Server {
	return gateway.Server{
		Name:      "gitlab",
		Command:   mcpservers.Command(t, "mcp-server-gitlab"),
		Env:       map[string]gateway.EnvValue{"GITLAB_API_URL": {Value: api.URL}, "GITLAB_PERSONAL_ACCESS_TOKEN": {Value: "glpat-operator-token"}},
		Processes: processes,
		Coalesce:  []string{"get_file_contents"},
		TTL:       ttl,
	}
}

func sum(in []*instance, f func(*counts) int64) int64 {
	var n int64
	for _, i := range in {
		n += f(i.m)
	}
	return n
}

// TestCoalescedAcrossInstances: 3 instances × 50 agents calling the
// same allowed tool with the same arguments (in different member orders)
// of the reference GitLab MCP server make exactly one execution, and one
// request to the GitLab API below it; every agent gets the same result.
func TestCoalescedAcrossInstances(t *testing.T) {
	api := fakegitlab.Start(t)
	in := fleet(t, 3, []gateway.Server{gitlab(t, api, 2, time.Minute)}, gateway.Options{})
	const per = 50
	var sessions []*mcp.ClientSession
	for _, i := range in {
		for range per {
			sessions = append(sessions, agent(t, i.url+"/mcp/gitlab", nil))
		}
	}
	// Each side has its own protocol version: the agents (Go SDK 1.8)
	// speak 2025-11-25 with coordd, which speaks 2024-11-05, all this
	// GitLab server knows (its TypeScript SDK is 1.0.1), with the server.
	if v := sessions[0].InitializeResult().ProtocolVersion; v != "2025-11-25" {
		t.Fatalf("the agent's protocol version = %s; want 2025-11-25", v)
	}
	release := api.Hold()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	results := make([]string, len(sessions))
	errs := make([]error, len(sessions))
	var wg sync.WaitGroup
	for j, s := range sessions {
		args := map[string]any{"project_id": "42", "file_path": "README.md", "ref": "main"}
		wg.Go(func() {
			r, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "get_file_contents", Arguments: args})
			if err == nil && r.IsError {
				err = fmt.Errorf("tool error: %s", text(t, r))
			}
			if err == nil {
				results[j] = text(t, r)
			}
			errs[j] = err
		})
	}
	// Release the API once every call has reached a gateway: the calls
	// that come after the result landed are served from the cache.
	waitFor(t, func() bool { return sum(in, func(c *counts) int64 { return c.calls.Load() }) == int64(len(sessions)) })
	release()
	wg.Wait()
	for j, err := range errs {
		if err != nil {
			t.Fatalf("call %d: %v", j, err)
		}
		if results[j] != results[0] {
			t.Fatalf("call %d got %q; call 0 got %q", j, results[j], results[0])
		}
	}
	if !strings.Contains(results[0], "contents of README.md for "+fakegitlab.Owner("glpat-operator-token")) {
		t.Fatalf("result %q does not hold the file", results[0])
	}
	if got := sum(in, func(c *counts) int64 { return c.executions.Load() }); got != 1 {
		t.Errorf("backend executions = %d; want 1", got)
	}
	if got := api.Files(); got != 1 {
		t.Errorf("GitLab API file requests = %d; want 1", got)
	}
	if v := in[0].gw.Status()[0].Protocol; v != "2024-11-05" {
		t.Errorf("the protocol version agreed with the GitLab server = %q; want 2024-11-05", v)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	enginetest.WaitFor(t, time.Minute, "the test's condition", cond)
}
