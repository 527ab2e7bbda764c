package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/redis/go-redis/v9"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/gateway"
	"github.com/coordd/coordd/internal/secret"
	"github.com/coordd/coordd/internal/testing/fakegitlab"
	"github.com/coordd/coordd/internal/testing/mcpservers"
	"github.com/coordd/coordd/internal/testing/redistest"
)

// The gateway benchmark (--gateway): a swarm of agents calling an
// unmodified MCP server (the reference GitLab server from npm, whose API
// calls go to a local GitLab API with a rate limit) three ways, side by
// side in one run: each agent with its own server process, as MCP
// clients start them; through three gateway instances without Redis
// (each its own cache: an in-process-cache proxy); and through coordd's
// gateway on three instances sharing a Redis. Then the cost of the
// gateway itself: a cached call's latency against a direct call to a
// bare Streamable HTTP server answering a constant tool, and the
// throughput of both.

// gatewayConfig is the load.
type gatewayConfig struct {
	agents    int           // MCP clients
	tasks     int           // calls per agent
	files     int           // distinct files asked for (uniformly)
	instances int           // gateway instances
	apiRate   int           // the API's rate limit, requests a second
	latency   time.Duration // the API's answer time
	latCalls  int           // sequential calls per latency figure
	tputConc  int           // concurrent callers of the throughput figure
	tputFor   time.Duration // how long each throughput figure runs
}

func defaultGateway(quick bool) gatewayConfig {
	c := gatewayConfig{agents: 24, tasks: 6, files: 8, instances: 3, apiRate: 20, latency: 20 * time.Millisecond,
		latCalls: 500, tputConc: 32, tputFor: 3 * time.Second}
	if quick {
		c.agents, c.tasks, c.latCalls, c.tputFor = 12, 4, 200, time.Second
	}
	return c
}

func (c gatewayConfig) String() string {
	return fmt.Sprintf("%d agents × %d get_file_contents calls over %d files of the reference GitLab MCP server (npm), GitLab API limited to %d req/s with %v latency; %d gateway instances",
		c.agents, c.tasks, c.files, c.apiRate, c.latency, c.instances)
}

// gatewayRow is one way of running the swarm.
type gatewayRow struct {
	name       string
	calls      int
	failed     int
	apiCalls   int // requests that reached the API
	limited    int // of them answered 429
	processes  int // server processes started
	wall       time.Duration
	firstError string
}

type gatewayResult struct {
	cfg  gatewayConfig
	rows []gatewayRow
	// the gateway's own cost
	directP50, directP99, cachedP50, cachedP99 time.Duration
	bareTput, cachedTput                       float64 // calls a second
}

const (
	gwDirect = "each agent runs its own server (stdio)"
	gwLocal  = "3 gateways, each its own cache (no Redis)"
	gwCoordd = "coordd's gateway, 3 instances on one Redis"
)

func runGateway(ctx context.Context, h redistest.TB, cfg gatewayConfig, progress func(string, ...any)) (*gatewayResult, error) {
	if _, err := exec.LookPath("node"); err != nil {
		return nil, fmt.Errorf("--gateway needs node and `make mcp-servers`: %v", err)
	}
	cmd := mcpservers.Command(h, "mcp-server-gitlab")
	res := &gatewayResult{cfg: cfg}
	for _, way := range []string{gwDirect, gwLocal, gwCoordd} {
		progress("gateway swarm: %s", way)
		row, err := gatewaySwarm(ctx, h, cfg, cmd, way)
		if err != nil {
			return nil, err
		}
		res.rows = append(res.rows, row)
	}
	progress("gateway: a cached call against a bare Streamable HTTP server")
	if err := gatewayCost(ctx, h, cfg, cmd, res); err != nil {
		return nil, err
	}
	return res, nil
}

// quietLog discards the fleets' logs.
var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// gatewayFleet starts n gateway instances for servers, on rd (nil: each
// alone), and returns their /mcp/ base urls and a count of processes.
func gatewayFleet(h redistest.TB, n int, servers []gateway.Server, rd *redistest.Server) ([]string, *procCount) {
	pc := &procCount{}
	var urls []string
	for range n {
		gw, err := gateway.New(servers, gateway.Options{Logger: quietLog, Metrics: pc})
		if err != nil {
			h.Fatalf("gateway: %v", err)
		}
		opt := coordinator.Options{Transport: gw.Wrap(nil)}
		if rd != nil {
			rdb := redis.NewClient(&redis.Options{Addr: rd.Addr()})
			h.Cleanup(func() { _ = rdb.Close() })
			opt.Redis = rdb
		}
		co, err := coordinator.New(coordinator.Config{Upstreams: gw.Upstreams(), Logger: quietLog, CredentialScopeKey: secret.New("coordbench-gateway-scope-key")}, opt)
		if err != nil {
			h.Fatalf("coordinator: %v", err)
		}
		gw.Bind(co)
		srv := httptest.NewServer(gw.Handler())
		h.Cleanup(func() { srv.Close(); gw.Close(); co.Close() })
		urls = append(urls, srv.URL+"/mcp/")
	}
	return urls, pc
}

// procCount counts the processes the gateways start.
type procCount struct{ started atomic.Int64 }

func (p *procCount) MCPCall(string, string)           {}
func (p *procCount) MCPExecution(string, string)      {}
func (p *procCount) MCPServed(string, string, string) {}
func (p *procCount) MCPRetry(string)                  {}
func (p *procCount) MCPRestart(string)                {}
func (p *procCount) MCPAbandoned(string, string)      {}
func (p *procCount) MCPProcesses(_ string, d int) {
	if d > 0 {
		p.started.Add(int64(d))
	}
}

func gatewaySwarm(ctx context.Context, h redistest.TB, cfg gatewayConfig, cmd []string, way string) (gatewayRow, error) {
	api := fakegitlab.Start(h, fakegitlab.Options{RateLimit: cfg.apiRate, Latency: cfg.latency})
	env := map[string]gateway.EnvValue{"GITLAB_API_URL": {Value: api.URL}, "GITLAB_PERSONAL_ACCESS_TOKEN": {Value: "glpat-coordbench"}}
	server := gateway.Server{Name: "gitlab", Command: cmd, Env: env, Processes: 1, Coalesce: []string{"get_file_contents"}, TTL: time.Minute}
	row := gatewayRow{name: way}
	var connect func(i int) (*mcp.ClientSession, error)
	var pc *procCount
	switch way {
	case gwDirect:
		connect = func(int) (*mcp.ClientSession, error) {
			c := exec.Command(cmd[0], cmd[1:]...)
			c.Env = append(c.Environ(), "GITLAB_API_URL="+api.URL, "GITLAB_PERSONAL_ACCESS_TOKEN=glpat-coordbench")
			row.processes++
			return mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: c}, nil)
		}
	default:
		var rd *redistest.Server
		if way == gwCoordd {
			rd = redistest.Start(h)
		}
		var urls []string
		urls, pc = gatewayFleet(h, cfg.instances, []gateway.Server{server}, rd)
		connect = func(i int) (*mcp.ClientSession, error) {
			return mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx,
				&mcp.StreamableClientTransport{Endpoint: urls[i%len(urls)] + "gitlab", DisableStandaloneSSE: true}, nil)
		}
	}
	sessions := make([]*mcp.ClientSession, cfg.agents)
	for i := range sessions {
		s, err := connect(i)
		if err != nil {
			return row, fmt.Errorf("%s: agent %d: %v", way, i, err)
		}
		defer s.Close()
		sessions[i] = s
	}
	start := time.Now()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, s := range sessions {
		rng := rand.New(rand.NewPCG(uint64(i), 7))
		wg.Go(func() {
			for range cfg.tasks {
				file := fmt.Sprintf("docs/page-%d.md", rng.IntN(cfg.files))
				r, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "get_file_contents", Arguments: map[string]any{"project_id": "42", "file_path": file, "ref": "main"}})
				mu.Lock()
				row.calls++
				if err != nil || r.IsError {
					row.failed++
					if row.firstError == "" {
						row.firstError = callError(r, err)
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	row.wall = time.Since(start)
	row.apiCalls, row.limited = api.Requests(), api.Limited()
	if pc != nil {
		row.processes = int(pc.started.Load())
	}
	return row, nil
}

// gatewayCost measures what the gateway adds: sequential calls of a
// cached result through one gateway instance against calls of a bare
// Streamable HTTP server (the Go SDK's) answering a constant tool, then
// calls a second from tputConc callers of each.
func gatewayCost(ctx context.Context, h redistest.TB, cfg gatewayConfig, cmd []string, res *gatewayResult) error {
	bare := mcp.NewServer(&mcp.Implementation{Name: "bare", Version: "1"}, nil)
	mcp.AddTool(bare, &mcp.Tool{Name: "constant"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "a constant answer"}}}, nil, nil
	})
	bareSrv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return bare }, nil))
	h.Cleanup(bareSrv.Close)
	api := fakegitlab.Start(h)
	env := map[string]gateway.EnvValue{"GITLAB_API_URL": {Value: api.URL}, "GITLAB_PERSONAL_ACCESS_TOKEN": {Value: "glpat-coordbench"}}
	urls, _ := gatewayFleet(h, 1, []gateway.Server{{Name: "gitlab", Command: cmd, Env: env, Processes: 1, Coalesce: []string{"get_file_contents"}, TTL: time.Hour}}, nil)
	dial := func(url string) (*mcp.ClientSession, error) {
		return mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, DisableStandaloneSSE: true}, nil)
	}
	bareCall := &mcp.CallToolParams{Name: "constant", Arguments: map[string]any{}}
	cachedCall := &mcp.CallToolParams{Name: "get_file_contents", Arguments: map[string]any{"project_id": "1", "file_path": "cached.md"}}
	timed := func(url string, p *mcp.CallToolParams) (p50, p99 time.Duration, err error) {
		s, err := dial(url)
		if err != nil {
			return 0, 0, err
		}
		defer s.Close()
		if _, err := s.CallTool(ctx, p); err != nil { // warm: the cache, the connection
			return 0, 0, err
		}
		ds := make([]time.Duration, cfg.latCalls)
		for i := range ds {
			t0 := time.Now()
			r, err := s.CallTool(ctx, p)
			ds[i] = time.Since(t0)
			if err != nil || r.IsError {
				return 0, 0, fmt.Errorf("%s: %s", p.Name, callError(r, err))
			}
		}
		p50, p99, _ = percentiles(ds)
		return p50, p99, nil
	}
	var err error
	if res.directP50, res.directP99, err = timed(bareSrv.URL, bareCall); err != nil {
		return err
	}
	if res.cachedP50, res.cachedP99, err = timed(urls[0]+"gitlab", cachedCall); err != nil {
		return err
	}
	tput := func(url string, p *mcp.CallToolParams) (float64, error) {
		var n atomic.Int64
		var firstErr atomic.Value
		sessions := make([]*mcp.ClientSession, cfg.tputConc)
		for i := range sessions {
			s, err := dial(url)
			if err != nil {
				return 0, err
			}
			defer s.Close()
			sessions[i] = s
		}
		tctx, cancel := context.WithTimeout(ctx, cfg.tputFor)
		defer cancel()
		start := time.Now()
		var wg sync.WaitGroup
		for _, s := range sessions {
			wg.Go(func() {
				for tctx.Err() == nil {
					if _, err := s.CallTool(tctx, p); err != nil {
						if tctx.Err() == nil {
							firstErr.CompareAndSwap(nil, err)
						}
						return
					}
					n.Add(1)
				}
			})
		}
		wg.Wait()
		if e, ok := firstErr.Load().(error); ok {
			return 0, e
		}
		return float64(n.Load()) / time.Since(start).Seconds(), nil
	}
	if res.bareTput, err = tput(bareSrv.URL, bareCall); err != nil {
		return err
	}
	if res.cachedTput, err = tput(urls[0]+"gitlab", cachedCall); err != nil {
		return err
	}
	return nil
}

func renderGateway(r *gatewayResult) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("## The MCP gateway: agents calling an unmodified MCP server\n\n%s.\n\n", r.cfg)
	w("| | calls | failed | API requests | answered 429 | server processes | wall |\n|---|---:|---:|---:|---:|---:|---:|\n")
	rows := r.rows
	base := rows[0]
	for _, row := range rows {
		w("| %s | %d | %d | %d (%s) | %d | %d | %v |\n", row.name, row.calls, row.failed, row.apiCalls, countRatio(row.apiCalls, base.apiCalls), row.limited, row.processes, row.wall.Round(time.Millisecond))
	}
	for _, row := range rows {
		if row.firstError != "" {
			w("\nFirst failure, %s: %s\n", row.name, truncate(row.firstError, 200))
		}
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d.Microseconds())/1000) }
	w("\n### What the gateway adds (goal: a cached call within 1 ms p50 and 5 ms p99 of a direct call; cached calls a second at least 90%% of a bare server's)\n\n")
	w("| | p50 ms | p99 ms | calls a second (%d callers) |\n|---|---:|---:|---:|\n", r.cfg.tputConc)
	w("| a bare Streamable HTTP server (Go SDK), constant tool, called directly | %s | %s | %.0f |\n", ms(r.directP50), ms(r.directP99), r.bareTput)
	w("| a cached call through coordd's gateway | %s (%+.2f) | %s (%+.2f) | %.0f (%.0f%%) |\n", ms(r.cachedP50), float64((r.cachedP50-r.directP50).Microseconds())/1000,
		ms(r.cachedP99), float64((r.cachedP99-r.directP99).Microseconds())/1000, r.cachedTput, 100*r.cachedTput/r.bareTput)
	return b.String()
}
