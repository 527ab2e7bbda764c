package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/redis/go-redis/v9"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/testing/redistest"
)

// Names of the swarm's fleets, as the table prints them.
const (
	fleetLocal  = "MCP servers fetching MDN, in-process cache"
	fleetSeed   = "seed design: LRU + SET NX PX + 200 ms polling"
	fleetCoordd = "MCP servers (mdn-mcp) calling coordd"
)

// swarmConfig is the agent-swarm benchmark's load.
type swarmConfig struct {
	agents   int        // A: MCP clients, each on one replica, round-robin
	replicas int        // M: MCP server replicas per fleet
	coordd   int        // K: coordd instances behind the coordd fleet
	tasks    int        // sub-tasks per agent, one after another
	pages    int        // distinct pages; each has one search query
	zipfS    float64    // Zipf exponent of page popularity (> 1)
	edge     edgeConfig // the fake MDN's limiter and latency
	// coorddRate is coordd's fleet-wide rate limit towards MDN, set below
	// the edge's as an operator would.
	coorddRate int
	// retryCap bounds how long an agent waits on a retryAfterSeconds
	// before its one retry of a failed call.
	retryCap time.Duration
}

func defaultSwarm(quick bool) swarmConfig {
	c := swarmConfig{
		agents: 48, replicas: 4, coordd: 3, tasks: 4, pages: 40, zipfS: 1.2,
		edge:       edgeConfig{rate: 20, blockFor: 10 * time.Second, latency: 30 * time.Millisecond},
		coorddRate: 15,
		retryCap:   3 * time.Second,
	}
	if quick {
		c.agents, c.tasks, c.pages = 24, 2, 20
	}
	return c
}

// String describes the load in one line.
func (c swarmConfig) String() string {
	return fmt.Sprintf("A=%d agents × %d sub-tasks (mdn_search, then mdn_doc twice), M=%d MCP replicas per fleet, K=%d coordd instances, %d pages (Zipf s=%.1f), edge limit R=%d req/s (past 2R in a second: blocked %v), MDN latency %v, coordd's rate limit %d req/s",
		c.agents, c.tasks, c.replicas, c.coordd, c.pages, c.zipfS, c.edge.rate, c.edge.blockFor, c.edge.latency, c.coorddRate)
}

// fleetResult is what one fleet's run measured.
type fleetResult struct {
	name        string
	upstream    int // requests that reached the edge, 429s included
	limited     int // 429s the edge sent
	blocks      int // blocks the edge started
	calls       int // tool calls made, retries included
	failedCalls int // tool calls that failed: IsError or a protocol error
	tasks       int
	failedTasks int // tasks with a call that failed after its one retry
	maxPerURL   int // most requests served for one URL
	urls        int // distinct URLs served
	latency     []time.Duration
	firstErr    string
	elapsed     time.Duration
}

// swarmResult is the three fleets' results.
type swarmResult struct {
	cfg    swarmConfig
	fleets []fleetResult // local, seed, coordd
}

// runSwarm runs the agent swarm against each fleet in turn, on one edge
// and one redis-server, and returns the figures.
func runSwarm(ctx context.Context, h redistest.TB, cfg swarmConfig, progress func(string, ...any)) (*swarmResult, error) {
	rds := redistest.Start(h)
	rdb := redis.NewClient(&redis.Options{Addr: rds.Addr()})
	h.Cleanup(func() { _ = rdb.Close() })
	ed := startEdge(h, cfg.edge)
	bin := mdnMCPBinary(h) // built before any fleet runs, not between them
	res := &swarmResult{cfg: cfg}

	fleets := []struct {
		name  string
		start func(h *host) []string
	}{
		{fleetLocal, func(fh *host) []string {
			var eps []string
			for range cfg.replicas {
				eps = append(eps, serveMCP(fh, baselineMCP(ed.url, &localCache{up: direct{upstreamClient()}, docs: make(map[string][]byte)})))
			}
			return eps
		}},
		{fleetSeed, func(fh *host) []string {
			var eps []string
			for range cfg.replicas {
				rdb := redis.NewClient(&redis.Options{Addr: rds.Addr()})
				fh.Cleanup(func() { _ = rdb.Close() })
				eps = append(eps, serveMCP(fh, baselineMCP(ed.url, &seedFetcher{up: direct{upstreamClient()}, rdb: rdb, docs: make(map[string][]byte)})))
			}
			return eps
		}},
		{fleetCoordd, func(fh *host) []string {
			var addrs, eps []string
			for range cfg.coordd {
				in := startCoordd(fh, rds.URL(), coordinator.Upstream{
					Name: "mdn", BaseURL: ed.url,
					Protection: coordinator.Protection{RateLimit: cfg.coorddRate, MaxWait: 60 * time.Second},
				})
				addrs = append(addrs, in.addr)
			}
			for i := range cfg.replicas {
				eps = append(eps, startMDNMCP(fh, bin, addrs[i%len(addrs)], ed.url))
			}
			return eps
		}},
	}
	for _, f := range fleets {
		// Each fleet starts from nothing: its own servers, an empty Redis
		// and an edge that has forgotten every client.
		fh := &host{}
		eps := f.start(fh)
		if err := rdb.FlushAll(ctx).Err(); err != nil {
			fh.close()
			return nil, fmt.Errorf("redis FLUSHALL: %w", err)
		}
		ed.reset()
		progress("swarm: %s: %d agents on %d replicas", f.name, cfg.agents, len(eps))
		fr, err := swarm(ctx, cfg, eps)
		fh.close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.name, err)
		}
		c := ed.reset()
		fr.name, fr.upstream, fr.limited, fr.blocks, fr.urls = f.name, c.requests, c.limited, c.blocks, len(c.byURL)
		for _, n := range c.byURL {
			fr.maxPerURL = max(fr.maxPerURL, n)
		}
		res.fleets = append(res.fleets, fr)
	}
	return res, nil
}

// swarm runs cfg.agents MCP clients against the endpoints, round-robin,
// all starting their first sub-task at once.
func swarm(ctx context.Context, cfg swarmConfig, endpoints []string) (fleetResult, error) {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer hc.CloseIdleConnections()
	sessions := make([]*mcp.ClientSession, cfg.agents)
	for i := range sessions {
		c := mcp.NewClient(&mcp.Implementation{Name: fmt.Sprintf("agent-%d", i), Version: "v0"}, nil)
		cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoints[i%len(endpoints)], HTTPClient: hc, MaxRetries: -1}, nil)
		if err != nil {
			return fleetResult{}, fmt.Errorf("agent %d connect: %w", i, err)
		}
		defer cs.Close()
		sessions[i] = cs
	}
	var (
		mu    sync.Mutex // protects fr
		fr    fleetResult
		wg    sync.WaitGroup
		start = make(chan struct{})
	)
	started := time.Now()
	for i, cs := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := &agent{cs: cs, cfg: cfg, rng: rand.New(rand.NewPCG(uint64(i), 15))}
			a.zipf = rand.NewZipf(a.rng, cfg.zipfS, 1, uint64(cfg.pages-1))
			<-start
			for range cfg.tasks {
				ok := a.task(ctx)
				mu.Lock()
				fr.tasks++
				if !ok {
					fr.failedTasks++
				}
				mu.Unlock()
			}
			mu.Lock()
			defer mu.Unlock()
			fr.calls += a.calls
			fr.failedCalls += a.failed
			fr.latency = append(fr.latency, a.latency...)
			if fr.firstErr == "" {
				fr.firstErr = a.firstErr
			}
		}()
	}
	close(start)
	wg.Wait()
	fr.elapsed = time.Since(started)
	return fr, ctx.Err()
}

// agent is one MCP client running sub-tasks, as a sub-agent of an agent
// loop does: look a topic up, read the page found, read a related page.
type agent struct {
	cs   *mcp.ClientSession
	cfg  swarmConfig
	rng  *rand.Rand
	zipf *rand.Zipf

	calls, failed int
	latency       []time.Duration
	firstErr      string
}

// task runs one sub-task; false if one of its calls failed after its one
// retry.
func (a *agent) task(ctx context.Context) bool {
	n := int(a.zipf.Uint64())
	related := int(a.zipf.Uint64())
	return a.call(ctx, "mdn_search", map[string]any{"query": queryN(n)}) &&
		a.call(ctx, "mdn_doc", map[string]any{"path": pagePathN(n)}) &&
		a.call(ctx, "mdn_doc", map[string]any{"path": pagePathN(related)})
}

// call calls tool; on failure it waits what the result's
// retryAfterSeconds asks (at most cfg.retryCap; 1s without one) and tries
// once more, as a well-behaved agent does.
func (a *agent) call(ctx context.Context, tool string, args map[string]any) bool {
	for attempt := 0; ; attempt++ {
		t0 := time.Now()
		res, err := a.cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
		a.latency = append(a.latency, time.Since(t0))
		a.calls++
		if err == nil && !res.IsError {
			return true
		}
		a.failed++
		if a.firstErr == "" {
			a.firstErr = callError(res, err)
		}
		if attempt == 1 || ctx.Err() != nil {
			return false
		}
		wait := time.Second
		if res != nil {
			if m, ok := res.StructuredContent.(map[string]any); ok {
				if s, ok := m["retryAfterSeconds"].(float64); ok && s > 0 {
					wait = time.Duration(s * float64(time.Second))
				}
			}
		}
		t := time.NewTimer(min(wait, a.cfg.retryCap))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return false
		}
	}
}

func callError(res *mcp.CallToolResult, err error) string {
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// renderSwarm formats the swarm's table and the ratios of coordd's fleet
// to each baseline.
func renderSwarm(r *swarmResult) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("## Agent swarm: MCP fleets against an edge-limited MDN (goal: coordd's fleet 0 failed calls, 0 429s)\n\n")
	w("%s. Each agent is a go-sdk MCP client over Streamable HTTP; a failed call is retried once after its retryAfterSeconds (at most %v). Every fleet starts cold, with an empty Redis and an edge that has forgotten it.\n\n", r.cfg, r.cfg.retryCap)
	w("| fleet | upstream requests | 429s received | edge blocks | URLs served (most times one was) | tool calls | failed tool calls | failed tasks | call latency p50 / p99 ms | wall |\n")
	w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, f := range r.fleets {
		p50, p99, _ := percentiles(f.latency)
		w("| %s | %d | %d | %d | %d (%d) | %d | %d | %d / %d | %s / %s | %.1fs |\n", f.name, f.upstream, f.limited, f.blocks, f.urls, f.maxPerURL, f.calls, f.failedCalls, f.failedTasks, f.tasks, msNum(p50), msNum(p99), f.elapsed.Seconds())
	}
	if len(r.fleets) == 3 {
		co := r.fleets[2]
		w("\n| coordd ÷ | upstream requests | 429s | failed tool calls | failed tasks | p50 | p99 |\n|---|---:|---:|---:|---:|---:|---:|\n")
		for _, base := range r.fleets[:2] {
			c50, c99, _ := percentiles(co.latency)
			b50, b99, _ := percentiles(base.latency)
			w("| %s | %s | %s | %s | %s | %s | %s |\n", base.name,
				ratio(float64(co.upstream), float64(base.upstream)), countRatio(co.limited, base.limited),
				countRatio(co.failedCalls, base.failedCalls), countRatio(co.failedTasks, base.failedTasks),
				ratio(float64(c50), float64(b50)), ratio(float64(c99), float64(b99)))
		}
	}
	for _, f := range r.fleets {
		if f.firstErr != "" {
			w("\nFirst failure, %s: %q\n", f.name, truncate(f.firstErr, 200))
		}
	}
	return b.String()
}

// countRatio is ratio for counts, except that none against some reads
// "0 vs N" rather than "0.000×".
func countRatio(a, b int) string {
	if a == 0 && b > 0 {
		return fmt.Sprintf("0 vs %d", b)
	}
	return ratio(float64(a), float64(b))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
