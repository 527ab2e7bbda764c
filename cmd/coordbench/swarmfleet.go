package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"

	"github.com/coordd/coordd/internal/testing/redistest"
)

// fetcher gets one MDN URL for an MCP server of a baseline fleet.
type fetcher interface {
	get(ctx context.Context, u string) ([]byte, error)
}

// statusError is a non-200 answer from MDN.
type statusError struct {
	code       int
	retryAfter int // seconds; 0 if none
}

func (e *statusError) Error() string {
	if e.retryAfter > 0 {
		return fmt.Sprintf("MDN answered HTTP %d; retry after %d seconds", e.code, e.retryAfter)
	}
	return fmt.Sprintf("MDN answered HTTP %d", e.code)
}

// direct fetches MDN over HTTP, once, as a plain MCP server does.
type direct struct{ client *http.Client }

func (d direct) get(ctx context.Context, u string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		after, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		return nil, &statusError{code: resp.StatusCode, retryAfter: after}
	}
	return body, nil
}

// localCache is fleet (1): an in-process cache with one fetch per key per
// process at a time (singleflight). Processes share nothing.
type localCache struct {
	up direct
	sf singleflight.Group

	mu   sync.Mutex // protects docs
	docs map[string][]byte
}

func (c *localCache) get(ctx context.Context, u string) ([]byte, error) {
	c.mu.Lock()
	b, ok := c.docs[u]
	c.mu.Unlock()
	if ok {
		return b, nil
	}
	v, err, _ := c.sf.Do(u, func() (any, error) {
		b, err := c.up.get(context.WithoutCancel(ctx), u)
		if err == nil {
			c.mu.Lock()
			c.docs[u] = b
			c.mu.Unlock()
		}
		return b, err
	})
	if err != nil {
		return nil, err
	}
	return v.([]byte), nil
}

// Parameters of the first seed article's design, as it gives them.
const (
	seedLockTTL   = 5 * time.Second        // SET lock:key token NX PX 5000
	seedPolls     = 5                      // pollCache(key, 5, 200, fetcher)
	seedPollEvery = 200 * time.Millisecond // between polls
)

// seedUnlock deletes the lock only if it still holds our token (the
// article's "safe release via Lua").
var seedUnlock = redis.NewScript(`if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end return 0`)

// seedFetcher is fleet (2), the design of the first seed article: an
// in-process cache (the article's "LRU" is a Map with expiry; at this
// benchmark's size nothing is evicted, so a map stands in), a Redis
// SET NX PX lock per key, and losers that poll their own process's cache
// every 200 ms, five times, then fetch anyway.
type seedFetcher struct {
	up  direct
	rdb *redis.Client

	mu   sync.Mutex // protects docs
	docs map[string][]byte
}

func (s *seedFetcher) cached(u string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.docs[u]
	return b, ok
}

func (s *seedFetcher) get(ctx context.Context, u string) ([]byte, error) {
	if b, ok := s.cached(u); ok {
		return b, nil
	}
	var tok [16]byte
	_, _ = rand.Read(tok[:])
	token, key := hex.EncodeToString(tok[:]), "lock:"+u
	won, err := s.rdb.SetNX(ctx, key, token, seedLockTTL).Result()
	if err != nil {
		return nil, err
	}
	if won {
		defer seedUnlock.Run(context.WithoutCancel(ctx), s.rdb, []string{key}, token)
		b, err := s.up.get(ctx, u)
		if err == nil {
			s.mu.Lock()
			s.docs[u] = b
			s.mu.Unlock()
		}
		return b, err
	}
	for range seedPolls {
		t := time.NewTimer(seedPollEvery)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
		if b, ok := s.cached(u); ok {
			return b, nil
		}
	}
	return s.up.get(ctx, u) // "final defensive fallback"
}

// baselineMCP returns an MCP server with mdn_doc and mdn_search that get
// MDN through f and return the raw JSON: the benchmark counts fetches,
// 429s and failures, not text. An MDN error is a tool error (IsError) with
// retryAfterSeconds when MDN sent a Retry-After, as mdn-mcp's are.
func baselineMCP(base string, f fetcher) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "bench-mdn", Version: "v0"}, nil)
	call := func(ctx context.Context, u string) (*mcp.CallToolResult, any, error) {
		b, err := f.get(ctx, u)
		if err != nil {
			res := &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}
			var se *statusError
			if errors.As(err, &se) && se.retryAfter > 0 {
				res.StructuredContent = map[string]any{"retryAfterSeconds": se.retryAfter}
			}
			return res, nil, nil
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}}, nil, nil
	}
	mcp.AddTool(s, &mcp.Tool{Name: "mdn_doc", Description: "Returns an MDN page."}, func(ctx context.Context, _ *mcp.CallToolRequest, in docInput) (*mcp.CallToolResult, any, error) {
		return call(ctx, base+in.Path+"/index.json")
	})
	mcp.AddTool(s, &mcp.Tool{Name: "mdn_search", Description: "Searches MDN."}, func(ctx context.Context, _ *mcp.CallToolRequest, in searchInput) (*mcp.CallToolResult, any, error) {
		return call(ctx, base+"/api/v1/search?"+url.Values{"q": {in.Query}}.Encode())
	})
	return s
}

type docInput struct {
	Path string `json:"path"`
}

type searchInput struct {
	Query string `json:"query"`
}

// serveMCP serves s over stateless Streamable HTTP at /mcp on a free
// loopback port, as mdn-mcp --http does, and returns the endpoint.
func serveMCP(h redistest.TB, s *mcp.Server) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		h.Fatalf("mcp listen: %v", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Stateless: true}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	h.Cleanup(func() { _ = srv.Close() })
	return "http://" + lis.Addr().String() + "/mcp"
}

// upstreamClient is one MCP server process's HTTP client towards MDN.
func upstreamClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// mdnMCPBinary builds cmd/mdn-mcp into a temporary directory, removed on
// h's cleanup, and returns its path (Go's build cache makes a rebuild a
// link). The binary, not an in-process handler: its package is main and
// exports nothing, and a process per replica is what a fleet runs.
func mdnMCPBinary(h redistest.TB) string {
	bin := filepath.Join(h.TempDir(), "mdn-mcp")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/coordd/coordd/cmd/mdn-mcp").CombinedOutput(); err != nil {
		h.Fatalf("go build cmd/mdn-mcp: %v\n%s", err, out)
	}
	return bin
}

// listenRE finds the URL mdn-mcp logs once it listens.
var listenRE = regexp.MustCompile(`url=(http://[0-9.]+:[0-9]+/mcp)`)

// startMDNMCP runs one mdn-mcp --http replica calling coordd at coorddAddr
// for MDN at base, and returns its endpoint once it listens. It is sent
// SIGTERM on cleanup.
func startMDNMCP(h redistest.TB, bin, coorddAddr, base string) string {
	cmd := exec.Command(bin, "--http", "127.0.0.1:0", "--coordd", coorddAddr, "--mdn-base", base, "--timeout", "60s", "--shutdown-grace", "2s")
	cmd.Env = append(os.Environ(), "MDN_MCP_TOKEN=")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		h.Fatalf("mdn-mcp: %v", err)
	}
	if err := cmd.Start(); err != nil {
		h.Fatalf("mdn-mcp: %v", err)
	}
	exited := make(chan struct{})
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := listenRE.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
		_ = cmd.Wait()
		close(exited)
	}()
	h.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	select {
	case u := <-found:
		return u
	case <-exited:
		h.Fatalf("mdn-mcp exited before listening")
	case <-time.After(2 * time.Minute): // a bound for a stuck process, not a speed check
		h.Fatalf("mdn-mcp did not log its URL within 2 minutes")
	}
	return ""
}
