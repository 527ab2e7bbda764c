// Package python_test runs the Python client's tests (clients/python/tests,
// unittest) with Debian's /usr/bin/python3 against real coordd instances and
// a local upstream, so that they run within go test ./... (make test).
package python_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/clientconformance"
	"github.com/coordd/coordd/internal/coorddtest"
	"github.com/coordd/coordd/internal/fakeupstream"
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

const (
	token   = "python-token-0123456789"
	bigSize = 300000
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
	open := coorddtest.Start(t, coorddtest.Options{Config: cfg()})
	auth, err := server.NewAuth([]server.Tenant{{Name: "py", Tokens: []string{token}}})
	if err != nil {
		t.Fatal(err)
	}
	closed := coorddtest.Start(t, coorddtest.Options{Config: cfg(), ServerOptions: []server.Option{server.WithAuth(auth)}})
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

var ran = regexp.MustCompile(`(?m)^Ran (\d+) tests? in`)

// TestPythonClient runs every unittest of tests/ and fails unless all ran
// and passed, none skipped.
func TestPythonClient(t *testing.T) {
	py := python(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-m", "unittest", "discover", "-v", "-s", "tests", "-t", ".")
	cmd.Env = append(env(t), "PYTHONPATH="+mustAbs(t, "."))
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
