package main

import (
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coordd/coordd/internal/testing/redistest"
)

// edgeConfig configures the fake MDN's edge limiter.
type edgeConfig struct {
	// rate is the most requests the edge lets through in any one-second
	// window; past it, it answers 429 with Retry-After: 1.
	rate int
	// blockFor is how long a client that keeps asking while limited (more
	// than 2×rate requests in one second, 429s included) is blocked: every
	// request then answers 429 with Retry-After the time left.
	blockFor time.Duration
	// latency is MDN's answer time for a request let through.
	latency time.Duration
}

// edge is a local MDN behind an edge limiter like Cloudflare's rate
// limiting rules: counted per client IP (the whole fleet leaves through
// one, 127.0.0.1, as a NAT'd cluster does), a one-second period, a
// threshold, and a mitigation timeout (the block) for a client that keeps
// asking. It serves page JSON at /en-US/docs/Bench/Page_N/index.json and
// search answers at /api/v1/search?q=…, both made up on the fly.
//
// Hand-rolled rather than golang.org/x/time/rate: a token bucket delays or
// refuses single requests, while the behaviour copied here is a counted
// window plus a block, which no limiter library provides.
type edge struct {
	url string
	cfg edgeConfig

	mu           sync.Mutex // protects the fields below
	window       []time.Time
	blockedUntil time.Time
	requests     int
	limited      int            // 429s sent
	blocks       int            // blocks started
	byURL        map[string]int // requests let through, by path and query
}

func startEdge(h redistest.TB, cfg edgeConfig) *edge {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		h.Fatalf("edge listen: %v", err)
	}
	e := &edge{url: "http://" + lis.Addr().String(), cfg: cfg, byURL: make(map[string]int)}
	srv := &http.Server{Handler: e, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	h.Cleanup(func() { _ = srv.Close() })
	return e
}

// admit counts the request and decides: 0 to serve it, or the seconds of
// Retry-After of a 429.
func (e *edge) admit(now time.Time, key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.requests++
	cut := 0
	for cut < len(e.window) && now.Sub(e.window[cut]) >= time.Second {
		cut++
	}
	e.window = append(e.window[cut:], now)
	if now.Before(e.blockedUntil) {
		e.limited++
		return int(math.Ceil(e.blockedUntil.Sub(now).Seconds()))
	}
	switch n := len(e.window); {
	case n > 2*e.cfg.rate:
		e.blockedUntil = now.Add(e.cfg.blockFor)
		e.blocks++
		e.limited++
		return int(math.Ceil(e.cfg.blockFor.Seconds()))
	case n > e.cfg.rate:
		e.limited++
		return 1
	}
	e.byURL[key]++
	return 0
}

// edgeCounts is what the edge saw.
type edgeCounts struct {
	requests, limited, blocks int
	byURL                     map[string]int // requests served, by URL
}

// reset returns the counts since the last reset and starts afresh: no
// counts, no window, no block.
func (e *edge) reset() edgeCounts {
	e.mu.Lock()
	defer e.mu.Unlock()
	c := edgeCounts{requests: e.requests, limited: e.limited, blocks: e.blocks, byURL: e.byURL}
	e.requests, e.limited, e.blocks, e.byURL = 0, 0, 0, make(map[string]int)
	e.window, e.blockedUntil = nil, time.Time{}
	return c
}

func (e *edge) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if after := e.admit(time.Now(), r.URL.RequestURI()); after > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(after))
		http.Error(w, "error code: 1015 (you are being rate limited)", http.StatusTooManyRequests)
		return
	}
	if d := e.cfg.latency; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	var v any
	switch p := r.URL.Path; {
	case p == "/api/v1/search":
		v = searchAnswer(r.URL.Query().Get("q"))
	case strings.HasPrefix(p, "/en-US/docs/") && strings.HasSuffix(p, "/index.json"):
		v = pageAnswer(strings.TrimSuffix(p, "/index.json"))
	default:
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// pagePathN is the path of page n of the swarm's pages.
func pagePathN(n int) string { return fmt.Sprintf("/en-US/docs/Bench/Page_%d", n) }

// queryN is the search query that finds page n.
func queryN(n int) string { return fmt.Sprintf("bench topic %d", n) }

// pageAnswer is a page's index.json in the shape mdn_doc reads, about
// 4 KB of prose.
func pageAnswer(path string) any {
	prose := strings.Repeat("<p>An example paragraph with <code>code</code> and a <a href=\"/en-US/docs/Web\">link</a>.</p>", 40)
	return map[string]any{"doc": map[string]any{
		"title": "Page " + path, "summary": "An example paragraph.", "mdn_url": path,
		"body": []any{map[string]any{"type": "prose", "value": map[string]any{"id": "intro", "title": "", "content": prose}}},
	}}
}

// searchAnswer is MDN's search API answer for q: the page it names first.
func searchAnswer(q string) any {
	var n int
	_, _ = fmt.Sscanf(q, "bench topic %d", &n)
	docs := []any{map[string]any{"mdn_url": pagePathN(n), "title": "Page " + strconv.Itoa(n), "summary": "The page about " + q + "."}}
	return map[string]any{"documents": docs, "metadata": map[string]any{"total": map[string]any{"value": len(docs)}}}
}
