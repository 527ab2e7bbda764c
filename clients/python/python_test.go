// Package python_test runs the Python client's tests (clients/python/tests,
// unittest) with Debian's /usr/bin/python3 against real coordd instances and
// a local upstream, so that they run within go test ./... (make test).
package python_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/secret"
	"github.com/coordd/coordd/internal/testing/clientconformance"
	"github.com/coordd/coordd/internal/testing/fakeapi"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/redistest"
	"github.com/coordd/coordd/internal/upstream"
	"github.com/coordd/coordd/server"
)

// python returns the interpreter to test with: $COORDD_PYTHON, else
// /usr/bin/python3, the one Debian's python3-grpcio and python3-protobuf
// install into (a pyenv python3 on PATH lacks them). A missing interpreter
// or module fails the test; it is skipped only under -short, whatever is
// installed: the short loop starts no process.
func python(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("runs Python: not run under -short")
	}
	py := os.Getenv("COORDD_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	out, err := exec.Command(py, "-c", "import grpc, google.protobuf; print(grpc.__version__, google.protobuf.__version__)").CombinedOutput()
	if err != nil {
		t.Fatalf("%s cannot import grpc and google.protobuf: %v\n%s\nInstall them (Debian: apt-get install python3-grpcio python3-protobuf, or run 'make deps'), or point $COORDD_PYTHON at a Python that has them.", py, err, out)
	}
	t.Logf("%s: grpcio, protobuf %s", py, strings.TrimSpace(string(out)))
	return py
}

// needHTTPX fails the test unless py imports httpx, which the tests of
// coordd.httpx need (tests/test_httpx.py).
func needHTTPX(t *testing.T, py string) {
	t.Helper()
	out, err := exec.Command(py, "-c", "import httpx; print(httpx.__version__)").CombinedOutput()
	if err != nil {
		t.Fatalf("%s cannot import httpx: %v\n%s\nInstall it (Debian: apt-get install python3-httpx, or run 'make deps'), or point $COORDD_PYTHON at a Python that has it.", py, err, out)
	}
	t.Logf("%s: httpx %s", py, strings.TrimSpace(string(out)))
}

const (
	token   = "python-token-0123456789"
	bigSize = 300000

	// The fake API's tokens (apiEnv): callers' own, and the one coordd
	// holds for upstream "gh".
	apiAlice = "api-alice-0123456789"
	apiBob   = "api-bob-0123456789"
	apiBot   = "api-bot-0123456789"
)

// env starts the coordd instances the Python tests use, and the fake coordd
// of the client conformance corpus, and returns their environment (see
// tests/test_client.py and tests/test_conformance.py).
func env(t *testing.T) []string {
	t.Helper()
	u := fakeupstream.New(t)
	u.Set("/docs/hello", fakeupstream.Behavior{Body: []byte("hello from the upstream\n"), Header: http.Header{"Content-Type": {"text/plain; charset=utf-8"}}})
	u.Set("/docs/big", fakeupstream.Behavior{Size: bigSize})
	u.Set("/docs/missing", fakeupstream.Status(http.StatusNotFound))
	u.Set("/flaky/fail", fakeupstream.Status(http.StatusServiceUnavailable))
	cfg := func() coordinator.Config {
		return coordinator.Config{Upstreams: []coordinator.Upstream{
			{Name: "docs", BaseURL: u.URL() + "/docs/"},
			{Name: "flaky", BaseURL: u.URL() + "/flaky/", Protection: coordinator.Protection{
				Retry:   coordinator.RetryPolicy{MaxAttempts: 1},
				Breaker: coordinator.BreakerPolicy{FailureThreshold: 1, FailureRate: -1, OpenFor: 4 * time.Second, CloseAfter: 1},
			}},
		}}
	}
	open := fleettest.Start(t, fleettest.Options{Config: cfg()})
	auth, err := server.NewAuth([]server.Tenant{{Name: "py", Tokens: []string{token}}})
	if err != nil {
		t.Fatal(err)
	}
	closed := fleettest.Start(t, fleettest.Options{Config: cfg(), ServerOptions: []server.Option{server.WithAuth(auth)}})
	sum := sha256.Sum256(fakeupstream.SizedBody("/docs/big", bigSize))
	corpusDir := mustAbs(t, "../../testdata/client-conformance")
	corpus, err := clientconformance.Load(corpusDir)
	if err != nil {
		t.Fatal(err)
	}
	fake, err := clientconformance.Start(corpus)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	return append(os.Environ(),
		"COORDD_TARGET="+open.Addr,
		"COORDD_AUTH_TARGET="+closed.Addr,
		"COORDD_TOKEN="+token,
		"COORDD_UPSTREAM="+u.URL(),
		"COORDD_BIG_SHA256="+hex.EncodeToString(sum[:]),
		"COORDD_CONFORMANCE_TARGET="+fake.Addr(),
		"COORDD_CONFORMANCE_CONTROL="+fake.ControlURL(),
		"COORDD_CONFORMANCE_CORPUS="+corpusDir,
		"PYTHONDONTWRITEBYTECODE=1",
	)
}

// apiEnv starts what tests/test_httpx.py, tests/test_tracing.py and
// tests/test_client.py's CredentialTest use, and returns its
// environment: a fake GitHub-like API (internal/testing/fakeapi) and three coordd
// instances sharing one Redis in front of it, as upstream "gh", which
// holds the API credential of login "bot", forwards Accept and takes
// callers' own credentials; upstream "down" on a port where nothing
// listens (no retries; its breaker opens on one failure for a minute);
// and one coordd, traced, whose server spans the test asks for at
// COORDD_SPANS_URL.
func apiEnv(t *testing.T) []string {
	t.Helper()
	api := fakeapi.New(t, fakeapi.Options{Delay: 50 * time.Millisecond, Tokens: map[string]string{
		apiAlice: "alice", apiBob: "bob", apiBot: "bot",
	}})
	t.Setenv("COORDD_PY_TEST_GH_TOKEN", "Bearer "+apiBot)
	down := closedPort(t)
	rd := redistest.Start(t)
	var targets []string
	for range 3 {
		cfg := coordinator.Config{
			CredentialScopeKey: secret.New("python-scope-key-0123456789"),
			Upstreams: []coordinator.Upstream{
				{Name: "gh", BaseURL: api.URL() + "/", Credential: &upstream.Credential{ValueEnv: "COORDD_PY_TEST_GH_TOKEN"},
					RequestHeaders: map[string]string{"User-Agent": "coordd-python-test"}, ForwardHeaders: []string{"Accept"}, CallerCredentials: true,
					Protection: coordinator.Protection{
						// One upstream request per fetch, so that the counts are the fetches.
						Retry:   coordinator.RetryPolicy{MaxAttempts: 1},
						Breaker: coordinator.BreakerPolicy{FailureThreshold: -1, FailureRate: -1},
					}},
				{Name: "down", BaseURL: "http://" + down + "/", Protection: coordinator.Protection{
					Retry:   coordinator.RetryPolicy{MaxAttempts: 1},
					Breaker: coordinator.BreakerPolicy{FailureThreshold: 1, FailureRate: -1, OpenFor: time.Minute, CloseAfter: 1},
				}},
			},
		}
		targets = append(targets, fleettest.Start(t, fleettest.Options{RedisURL: rd.URL(), Config: cfg}).Addr)
	}
	traced, tracedUpstream, spansURL := startTraced(t)
	return []string{
		"COORDD_API_URL=" + api.URL(),
		"COORDD_API_TARGETS=" + strings.Join(targets, ","),
		"COORDD_API_TOKENS=alice=" + apiAlice + ",bob=" + apiBob,
		"COORDD_DOWN_URL=http://" + down,
		"COORDD_TRACED_TARGET=" + traced,
		"COORDD_TRACED_UPSTREAM=" + tracedUpstream,
		"COORDD_SPANS_URL=" + spansURL,
	}
}

// closedPort returns a loopback address where nothing listens.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// startTraced starts a single-node coordd in front of a local upstream
// (its base url: upstreamURL) whose gRPC server extracts W3C trace context
// (otelgrpc, as coordd does with tracing on), and an HTTP endpoint
// (spansURL) that answers GET ?trace_id=HEX with the server spans of that
// trace as JSON, [{"name", "trace_id", "parent_span_id"}], once there is
// one (or [] after 20 s): a server span ends a moment after its caller has
// the answer.
func startTraced(t *testing.T) (target, upstreamURL, spansURL string) {
	t.Helper()
	rec := &spanRecorder{changed: make(chan struct{})}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	u := fakeupstream.New(t)
	u.Set("/traced/hello", fakeupstream.Behavior{Body: []byte("traced\n")})
	in := fleettest.Start(t, fleettest.Options{
		Config: coordinator.Config{Upstreams: []coordinator.Upstream{{Name: "traced", BaseURL: u.URL() + "/traced/"}}},
		GRPC: []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(
			otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(propagation.TraceContext{})))},
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 20*time.Second)
		defer cancel()
		spans := rec.wait(ctx, r.URL.Query().Get("trace_id"))
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(spans)
	}))
	t.Cleanup(srv.Close)
	return in.Addr, u.URL() + "/traced/", srv.URL
}

// recordedSpan is a server span as startTraced's endpoint answers it.
type recordedSpan struct {
	Name         string `json:"name"`
	TraceID      string `json:"trace_id"`
	ParentSpanID string `json:"parent_span_id"`
}

// spanRecorder is an sdktrace.SpanProcessor that keeps the ended spans and
// wakes the waiters of wait on each.
type spanRecorder struct {
	mu      sync.Mutex
	spans   []recordedSpan
	changed chan struct{} // closed and replaced when a span ends
}

func (r *spanRecorder) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

func (r *spanRecorder) OnEnd(s sdktrace.ReadOnlySpan) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.spans = append(r.spans, recordedSpan{Name: s.Name(), TraceID: s.SpanContext().TraceID().String(), ParentSpanID: s.Parent().SpanID().String()})
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *spanRecorder) Shutdown(context.Context) error   { return nil }
func (r *spanRecorder) ForceFlush(context.Context) error { return nil }

// wait returns the spans of traceID once there is one, or none when ctx
// ends first.
func (r *spanRecorder) wait(ctx context.Context, traceID string) []recordedSpan {
	for {
		r.mu.Lock()
		out := []recordedSpan{}
		for _, s := range r.spans {
			if s.TraceID == traceID {
				out = append(out, s)
			}
		}
		changed := r.changed
		r.mu.Unlock()
		if len(out) > 0 {
			return out
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return out
		}
	}
}

var ran = regexp.MustCompile(`(?m)^Ran (\d+) tests? in`)

// TestPythonClient runs every unittest of tests/ and fails unless all ran
// and passed, none skipped.
func TestPythonClient(t *testing.T) {
	py := python(t)
	needHTTPX(t, py)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-m", "unittest", "discover", "-v", "-s", "tests", "-t", ".")
	cmd.Env = append(append(env(t), apiEnv(t)...), "PYTHONPATH="+mustAbs(t, "."))
	out, err := cmd.CombinedOutput()
	t.Logf("python3 -m unittest:\n%s", out)
	if err != nil {
		t.Fatalf("python3 -m unittest: %v", err)
	}
	if m := ran.FindSubmatch(out); m == nil || string(m[1]) == "0" {
		t.Fatalf("python3 -m unittest ran no test")
	}
	if bytes.Contains(out, []byte("skipped")) {
		t.Fatalf("python3 -m unittest skipped tests")
	}
}

// TestPipInstall installs the package as the README says for a PEP 668
// system (a virtual environment that sees Debian's grpcio and protobuf;
// offline, so no build isolation and no index), then runs its CLI from
// there against coordd.
func TestPipInstall(t *testing.T) {
	py := python(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	venv := filepath.Join(t.TempDir(), "venv")
	e := env(t)
	run := func(name string, args ...string) []byte {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = t.TempDir() // not the source tree: the installed package must be the one imported
		cmd.Env = append(e, "PIP_DISABLE_PIP_VERSION_CHECK=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return out
	}
	run(py, "-m", "venv", "--system-site-packages", venv)
	// A copy, so that pip's build/ and *.egg-info never land in the source tree.
	src := filepath.Join(t.TempDir(), "python")
	if out, err := exec.Command("cp", "-R", mustAbs(t, "."), src).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	run(filepath.Join(venv, "bin", "pip"), "install", "--no-build-isolation", "--no-index", src)
	where := run(filepath.Join(venv, "bin", "python"), "-c", "import coordd; print(coordd.__file__)")
	if !strings.HasPrefix(string(where), venv) {
		t.Fatalf("coordd imported from %s; want the virtual environment", where)
	}
	target, upstream := lookup(e, "COORDD_TARGET"), lookup(e, "COORDD_UPSTREAM")
	cmd := exec.CommandContext(ctx, filepath.Join(venv, "bin", "python"), "-m", "coordd", "get", "--target", target, upstream+"/docs/hello")
	cmd.Dir = t.TempDir()
	out, err := cmd.Output()
	if err != nil || string(out) != "hello from the upstream\n" {
		t.Fatalf("installed CLI: %q, %v; want the body", out, err)
	}
}

func lookup(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], key+"="); ok {
			return v
		}
	}
	return ""
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
