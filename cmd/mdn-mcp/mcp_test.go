package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/redistest"
)

// binary is the mdn-mcp command built by TestMain, with -race when the
// tests run with it; "" under -short, which builds nothing. Tests get it
// with mcpBinary.
var binary string

// mcpBinary returns binary, and skips the test under -short: the short
// loop starts no process.
func mcpBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("runs the mdn-mcp binary: not run under -short")
	}
	return binary
}

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "mdn-mcp-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binary = filepath.Join(dir, "mdn-mcp")
	args := []string{"build", "-o", binary}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, ".")...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building mdn-mcp:", err)
		return 1
	}
	return m.Run()
}

const mapPath = "/en-US/docs/Web/JavaScript/Reference/Global_Objects/Array/map"

// fakeMDN serves MDN-shaped answers on loopback and counts requests.
type fakeMDN struct {
	srv *httptest.Server

	mu      sync.Mutex // protects the fields below
	counts  map[string]int
	queries []string
	delay   time.Duration // held before answering a page
}

func newFakeMDN(t *testing.T) *fakeMDN {
	t.Helper()
	page, err := os.ReadFile(filepath.Join(goldenDir, "pages", "array_map.json"))
	if err != nil {
		t.Fatal(err)
	}
	search, err := os.ReadFile(filepath.Join(goldenDir, "search", "array_map.json"))
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeMDN{counts: map[string]int{}}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.counts[r.URL.Path]++
		delay := f.delay
		if r.URL.Path == "/api/v1/search" {
			f.queries = append(f.queries, r.URL.Query().Get("q"))
		}
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case mapPath + "/index.json":
			select {
			case <-time.After(delay):
			case <-r.Context().Done():
				return
			}
			w.Write(page)
		case "/api/v1/search":
			if r.URL.Query().Get("q") == "array map" {
				w.Write(search)
				return
			}
			fmt.Fprint(w, `{"documents":[],"metadata":{"total":{"value":0}}}`)
		case "/en-US/docs/Broken/index.json":
			fmt.Fprint(w, "<html>an error page, not JSON</html>")
		case "/en-US/docs/Private/index.json":
			http.Error(w, "forbidden", http.StatusForbidden)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeMDN) count(path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counts[path]
}

func (f *fakeMDN) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.counts {
		n += c
	}
	return n
}

func (f *fakeMDN) setDelay(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.delay = d
}

// stack is a fake MDN behind a real coordd with a real Redis.
type stack struct {
	mdn    *fakeMDN
	coordd *fleettest.Instance
}

func startStack(t *testing.T) *stack {
	t.Helper()
	rds := redistest.Start(t)
	f := newFakeMDN(t)
	in := fleettest.Start(t, fleettest.Options{
		RedisURL: rds.URL(),
		Config:   coordinator.Config{Upstreams: []coordinator.Upstream{{Name: "mdn", BaseURL: f.srv.URL}}},
	})
	return &stack{mdn: f, coordd: in}
}

// connect runs mdn-mcp with args and connects a real MCP client to it over
// stdio. When the test ends the session is closed, and mdn-mcp must then
// exit cleanly (a crash or a detected race fails the test).
func connect(t *testing.T, args ...string) *mcp.ClientSession {
	t.Helper()
	return connectEnv(t, nil, args...)
}

// connectEnv is connect with env added to mdn-mcp's environment.
func connectEnv(t *testing.T, env []string, args ...string) *mcp.ClientSession {
	t.Helper()
	var stderr bytes.Buffer
	var mu sync.Mutex
	cmd := exec.Command(mcpBinary(t), args...)
	cmd.Env = append(raceEnv(), env...)
	cmd.Stderr = writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return stderr.Write(p)
	})
	client := mcp.NewClient(&mcp.Implementation{Name: "mdn-mcp-test", Version: "v0"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect to mdn-mcp: %v", err)
	}
	t.Cleanup(func() {
		if err := cs.Close(); err != nil {
			t.Errorf("mdn-mcp did not exit cleanly: %v", err)
		}
		mu.Lock()
		defer mu.Unlock()
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("mdn-mcp stderr:\n%s", stderr.String())
		}
	})
	return cs
}

// raceEnv is the environment for mdn-mcp: under -race, without the race
// runtime's 1s sleep at exit (a race is still reported, and fails the exit
// status).
func raceEnv() []string {
	env := os.Environ()
	if raceEnabled {
		env = append(env, "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=10"))
	}
	return env
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// call calls a tool and returns its text and IsError. A protocol error
// fails the test: tools must report failures as tool errors.
func call(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s(%v): protocol error: %v", tool, args, err)
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String(), res.IsError
}

func TestTools(t *testing.T) {
	s := startStack(t)
	cs := connect(t, "--coordd", s.coordd.Addr, "--mdn-base", s.mdn.srv.URL)
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatalf("ListTools: %v", err)
	}
	want := map[string]string{"mdn_doc": "path", "mdn_search": "query"}
	for _, tool := range res.Tools {
		param, ok := want[tool.Name]
		if !ok {
			t.Errorf("unexpected tool %q", tool.Name)
			continue
		}
		delete(want, tool.Name)
		schema := fmt.Sprint(tool.InputSchema)
		if !strings.Contains(schema, "required:["+param+"]") {
			t.Errorf("%s input schema %s; want %q required", tool.Name, schema, param)
		}
		if tool.Annotations == nil || !tool.Annotations.ReadOnlyHint {
			t.Errorf("%s: want readOnlyHint", tool.Name)
		}
	}
	if len(want) > 0 {
		t.Errorf("missing tools: %v", want)
	}
}

func TestDocConcurrentCallsOneUpstreamRequest(t *testing.T) {
	s := startStack(t)
	// Hold MDN's answer, so that the calls overlap the one fetch.
	s.mdn.setDelay(300 * time.Millisecond)
	// Four assistants, each with its own mdn-mcp, make 5 calls each.
	const sessions, calls = 4, 20
	var css []*mcp.ClientSession
	for range sessions {
		css = append(css, connect(t, "--coordd", s.coordd.Addr, "--mdn-base", s.mdn.srv.URL))
	}
	texts := make([]string, calls)
	errs := make([]bool, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			texts[i], errs[i] = call(t, css[i%sessions], "mdn_doc", map[string]any{"path": mapPath})
		})
	}
	wg.Wait()
	for i := range calls {
		if errs[i] || texts[i] != texts[0] {
			t.Fatalf("call %d: isError %v, text:\n%s\nwant the same page as call 0", i, errs[i], texts[i])
		}
	}
	if n := s.mdn.count(mapPath + "/index.json"); n != 1 {
		t.Errorf("MDN requests for the page = %d; want 1", n)
	}
	if n := s.coordd.Metrics.Fetches(); n != 1 {
		t.Errorf("coordd upstream requests = %d; want 1", n)
	}

	base := s.mdn.srv.URL
	for _, want := range []string{
		"# Array.prototype.map()\n\nSource: " + base + mapPath + "\n\nThe **`map()`** method of",
		"Source: " + base + mapPath,
		"## Syntax\n\n```js\nmap(callbackFn)\nmap(callbackFn, thisArg)\n```",
		"### Parameters\n\n- `callbackFn`\n  A function to execute",
		"  - `element`\n    The current element",
		"[`Array`](" + base + "/en-US/docs/Web/JavaScript/Reference/Global_Objects/Array)",
		"> **Note:** Since `map` builds a new array",
		"- [ECMAScript® 2026 Language Specification](https://tc39.es/ecma262/",
		"## Browser compatibility\n\nSee the compatibility table on MDN: " + base + mapPath + "#browser_compatibility",
	} {
		if !strings.Contains(texts[0], want) {
			t.Errorf("page text lacks %q; got:\n%s", want, texts[0])
		}
	}
	if strings.Contains(texts[0], "alert(1)") || strings.Contains(texts[0], "<p>") {
		t.Errorf("page text keeps scripts or tags:\n%s", texts[0])
	}
}

func TestDocErrors(t *testing.T) {
	s := startStack(t)
	cs := connect(t, "--coordd", s.coordd.Addr, "--mdn-base", s.mdn.srv.URL)
	tests := []struct {
		name, path, want string
		upstream         bool // whether MDN is asked
	}{
		{"missing page", "/en-US/docs/No/Such/Page", "not found", true},
		{"not json", "/en-US/docs/Broken", "unexpected answer from MDN", true},
		{"forbidden", "/en-US/docs/Private", "HTTP 403", true},
		{"relative path", "en-US/docs/Web", "must start with /", false},
		{"dot dot", "/en-US/docs/../../admin", ".. segments", false},
		{"url", "https://evil.example/en-US/docs/Web", "is a URL", false},
		{"protocol-relative", "//evil.example/x", "is a URL", false},
		{"empty", "", "empty", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := s.mdn.total()
			text, isErr := call(t, cs, "mdn_doc", map[string]any{"path": tt.path})
			if !isErr || !strings.Contains(text, tt.want) {
				t.Errorf("mdn_doc(%q) = isError %v, %q; want a tool error mentioning %q", tt.path, isErr, text, tt.want)
			}
			if asked := s.mdn.total() > before; asked != tt.upstream {
				t.Errorf("MDN asked: %v; want %v", asked, tt.upstream)
			}
		})
	}
	// A missing argument is refused by the schema, also as a tool error.
	if text, isErr := call(t, cs, "mdn_doc", map[string]any{}); !isErr {
		t.Errorf("mdn_doc without path = %q; want a tool error", text)
	}
}

func TestSearch(t *testing.T) {
	s := startStack(t)
	cs := connect(t, "--coordd", s.coordd.Addr, "--mdn-base", s.mdn.srv.URL)
	for range 2 {
		text, isErr := call(t, cs, "mdn_search", map[string]any{"query": "  array   map "})
		if isErr {
			t.Fatalf("mdn_search: tool error %q", text)
		}
		for _, want := range []string{
			`Top 3 of 3 MDN results for "array map"`,
			"1. Array.prototype.map()\n   path: " + mapPath + "\n   The map() method",
			"2. Array.prototype.flatMap()\n   path: /en-US/docs/Web/JavaScript/Reference/Global_Objects/Array/flatMap",
			"3. Map\n   path: /en-US/docs/Web/JavaScript/Reference/Global_Objects/Map",
		} {
			if !strings.Contains(text, want) {
				t.Errorf("search text lacks %q; got:\n%s", want, text)
			}
		}
	}
	if n := s.mdn.count("/api/v1/search"); n != 1 {
		t.Errorf("MDN search requests = %d; want 1 (the second from coordd's cache)", n)
	}
	if got := fmt.Sprint(s.mdn.queries); got != "[array map]" {
		t.Errorf("queries MDN saw = %s; want [array map]", got)
	}

	text, isErr := call(t, cs, "mdn_search", map[string]any{"query": "zzzz"})
	if isErr || !strings.Contains(text, "No MDN pages found") {
		t.Errorf("search without results = isError %v, %q", isErr, text)
	}
	text, isErr = call(t, cs, "mdn_search", map[string]any{"query": " "})
	if !isErr || !strings.Contains(text, "empty") {
		t.Errorf("empty search = isError %v, %q; want a tool error", isErr, text)
	}
}

func TestCoorddUnreachable(t *testing.T) {
	// A port nothing listens on.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	f := newFakeMDN(t)
	cs := connect(t, "--coordd", addr, "--mdn-base", f.srv.URL, "--timeout", "5s")

	for i, c := range []struct {
		tool string
		args map[string]any
	}{
		{"mdn_doc", map[string]any{"path": mapPath}},
		{"mdn_doc", map[string]any{"path": mapPath}},
		{"mdn_search", map[string]any{"query": "array map"}},
	} {
		text, isErr := call(t, cs, c.tool, c.args)
		t.Logf("call %d: %s", i+1, text)
		if !isErr || !strings.Contains(text, "coordd at "+addr+" is unreachable") {
			t.Errorf("call %d, %s: isError %v, %q; want a tool error saying coordd is unreachable", i+1, c.tool, isErr, text)
		}
	}
	// The server is still alive and answering.
	if err := cs.Ping(context.Background(), nil); err != nil {
		t.Errorf("Ping after the failures: %v", err)
	}
	if n := f.total(); n != 0 {
		t.Errorf("MDN requests = %d; want 0: nothing goes around coordd", n)
	}
}

func TestFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"bad base", []string{"--mdn-base", "ftp://x"}, "--mdn-base"},
		{"relative base", []string{"--mdn-base", "/docs"}, "--mdn-base"},
		{"bad timeout", []string{"--timeout", "0s"}, "--timeout"},
		{"stray argument", []string{"extra"}, "unexpected arguments"},
		{"negative drain delay", []string{"--http", "127.0.0.1:0", "--drain-delay", "-1s"}, "--drain-delay"},
		{"bad listen address", []string{"--http", "nowhere"}, "--http"},
		{"unknown flag", []string{"--nope"}, "not defined"},
		{"origin with a path", []string{"--http", "127.0.0.1:0", "--allowed-origins", "https://app.example/"}, "--allowed-origins"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			cmd := exec.Command(mcpBinary(t), tt.args...)
			cmd.Env = raceEnv()
			cmd.Stderr = &stderr
			err := cmd.Run()
			if err == nil || !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("mdn-mcp %v: err %v, stderr %q; want a failure mentioning %q", tt.args, err, stderr.String(), tt.want)
			}
		})
	}
}
