package python_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/secret"
	"github.com/coordd/coordd/internal/testing/fakeapi"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
)

// The addresses the examples in docs/api.md use, replaced by the test's.
const (
	readmeTarget = "127.0.0.1:50051"
	readmeHTTP   = "http://127.0.0.1:8080"
	readmeMDN    = "https://developer.mozilla.org"
	readmeDoc    = "/en-US/docs/Web/HTTP/index.json"
)

var fence = regexp.MustCompile("(?s)```(\\w+)\n(.*?)```")

// TestREADMEOtherLanguages runs the Python and curl examples of the
// "Other languages" section of docs/api.md (moved there from the README)
// as written, against a real coordd (gRPC and the HTTP door) in front of a
// local upstream standing in for MDN.
func TestREADMEOtherLanguages(t *testing.T) {
	py := python(t)
	b, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	section, ok := between(string(b), "\n## Other languages\n", "\n## ")
	if !ok {
		t.Fatal(`docs/api.md has no "## Other languages" section`)
	}
	u := fakeupstream.New(t)
	in := fleettest.Start(t, fleettest.Options{HTTP: true, Config: coordinator.Config{
		Upstreams: []coordinator.Upstream{{Name: "mdn", BaseURL: u.URL()}},
	}})
	replacer := strings.NewReplacer(readmeTarget, in.Addr, readmeHTTP, in.HTTPURL, readmeMDN, u.URL())
	bin := t.TempDir() // python3 on PATH is the interpreter under test
	// A wrapper, not a symlink: Python finds its site-packages from the path it was started by.
	if err := os.WriteFile(filepath.Join(bin, "python3"), []byte("#!/bin/sh\nexec "+py+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "PYTHONPATH="+mustAbs(t, "."), "PYTHONDONTWRITEBYTECODE=1")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	run := func(dir string, name string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	body := string(u.Body(readmeDoc))
	var ran []string
	for _, m := range fence.FindAllStringSubmatch(section, -1) {
		lang, code := m[1], m[2]
		dir := t.TempDir()
		switch {
		case lang == "python":
			out := run(dir, filepath.Join(bin, "python3"), "-c", replacer.Replace(code))
			if !strings.HasPrefix(out, "200 text/html") {
				t.Errorf("python example printed %q; want the status and content type", out)
			}
			ran = append(ran, "python")
		case lang == "sh" && strings.HasPrefix(code, "sudo apt-get install "):
			// make deps installs them.
			ran = append(ran, "apt")
		case lang == "sh" && strings.Contains(code, "pip install"):
			// TestPipInstall runs these steps offline; deploy's
			// TestDocExamples runs the block as written, the command line
			// from the venv it installs into.
			for _, want := range []string{"venv --system-site-packages", "pip install --no-build-isolation --no-index ./clients/python", ".venv/bin/python -m coordd get"} {
				if !strings.Contains(code, want) {
					t.Errorf("the install example lacks %q, which TestPipInstall runs", want)
				}
			}
			ran = append(ran, "install")
		case lang == "sh" && strings.Contains(code, "python3 -m coordd"):
			run(dir, "bash", "-euo", "pipefail", "-c", replacer.Replace(code))
			if got, _ := os.ReadFile(filepath.Join(dir, "http.json")); string(got) != body {
				t.Errorf("python3 -m coordd wrote %q; want the body", got)
			}
			ran = append(ran, "cli")
		case lang == "sh" && strings.Contains(code, "curl"):
			out := run(dir, "bash", "-euo", "pipefail", "-c", replacer.Replace(code))
			if got, _ := os.ReadFile(filepath.Join(dir, "http.json")); string(got) != body {
				t.Errorf("curl wrote %q; want the body", got)
			}
			if !strings.Contains(out, "304\n") || !strings.Contains(out, `"key":"`+u.URL()+readmeDoc+`"`) {
				t.Errorf("curl printed %q; want 304, then the invalidation's key", out)
			}
			ran = append(ran, "curl")
		default:
			t.Errorf("an example this test does not run:\n%s", code)
		}
	}
	if got := strings.Join(ran, ","); got != "python,apt,install,curl" {
		t.Errorf("examples run: %s; want python,apt,install,curl", got)
	}
	if got := u.Count(readmeDoc); got != 1 {
		t.Errorf("upstream requests = %d; want 1 (every example after the first is served from the cache)", got)
	}
}

func between(s, from, to string) (string, bool) {
	_, rest, ok := strings.Cut(s, from)
	if !ok {
		return "", false
	}
	sec, _, _ := strings.Cut(rest, to)
	return sec, true
}

// TestREADMEHTTPX runs the example of the README's "httpx: one line"
// section as written, against a real coordd in front of a fake GitHub-like
// API standing in for api.github.com, with a caller's token.
func TestREADMEHTTPX(t *testing.T) {
	py := python(t)
	needHTTPX(t, py)
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	section, ok := between(string(b), "\n## httpx: one line\n", "\n## ")
	if !ok {
		t.Fatal(`README.md has no "## httpx: one line" section`)
	}
	m := fence.FindStringSubmatch(section)
	if m == nil || m[1] != "python" {
		t.Fatal(`README.md's "httpx: one line" section has no python example`)
	}
	api := fakeapi.New(t, fakeapi.Options{Tokens: map[string]string{apiAlice: "alice"}})
	in := fleettest.Start(t, fleettest.Options{Config: coordinator.Config{
		CredentialScopeKey: secret.New("python-readme-scope-key-0123456789"),
		Upstreams: []coordinator.Upstream{{Name: "github", BaseURL: api.URL() + "/",
			ForwardHeaders: []string{"Accept"}, CallerCredentials: true}},
	}})
	code := strings.NewReplacer(readmeTarget, in.Addr, "https://api.github.com", api.URL()).Replace(m[2])
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-c", code)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "GITHUB_TOKEN="+apiAlice, "PYTHONPATH="+mustAbs(t, "."), "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the README's httpx example: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) != 76 || lines[0] != "1 Issue 1 of octo/r" || lines[74] != "75 Issue 75 of octo/r" || lines[75] != "200 upstream" {
		t.Fatalf("the README's httpx example printed:\n%s\nwant the 75 issues, then 200 upstream", out)
	}
	for _, page := range []string{"?per_page=30", "?page=2&per_page=30", "?page=3&per_page=30"} {
		if got := api.Requests("/repos/octo/r/issues"+page, "alice"); got != 1 {
			t.Errorf("API requests for page %s as alice = %d; want 1", page, got)
		}
	}
}

// TestClientREADMEExamples runs the Python examples of
// clients/python/README.md as written (addresses replaced), with the
// package from this tree, against a real coordd in front of a local
// upstream standing in for MDN: the blocking one and the asyncio one. The
// FastMCP one needs the MCP SDK, which Debian does not package and PyPI is
// out of reach: it is compiled, not run (the README says so).
func TestClientREADMEExamples(t *testing.T) {
	py := python(t)
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	u := fakeupstream.New(t)
	in := fleettest.Start(t, fleettest.Options{Config: coordinator.Config{
		Upstreams: []coordinator.Upstream{{Name: "mdn", BaseURL: u.URL()}},
	}})
	replacer := strings.NewReplacer(readmeTarget, in.Addr, readmeMDN, u.URL())
	env := append(os.Environ(), "PYTHONPATH="+mustAbs(t, "."), "PYTHONDONTWRITEBYTECODE=1")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	run := func(name, code string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, py, "-c", code)
		cmd.Dir, cmd.Env = t.TempDir(), env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("the %s example: %v\n%s", name, err, out)
		}
		return string(out)
	}
	asyncLine := regexp.MustCompile(`^(\S+): 200 (?:upstream|l1|l2) (\d+) bytes$`)
	var ran []string
	for _, m := range fence.FindAllStringSubmatch(string(b), -1) {
		lang, code := m[1], m[2]
		if lang != "python" {
			continue
		}
		switch {
		case strings.Contains(code, "FastMCP"):
			cmd := exec.CommandContext(ctx, py, "-c", "import sys; compile(sys.argv[1], 'README.md', 'exec')", code)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("the FastMCP example does not compile: %v\n%s", err, out)
			}
			ran = append(ran, "fastmcp(compiled)")
		case strings.Contains(code, "coordd.httpx"):
			ran = append(ran, "httpx(TestREADMEHTTPX)") // needs the fake API: run there
		case strings.Contains(code, "asyncio.run("):
			out := run("asyncio", replacer.Replace(code))
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) < 2 {
				t.Errorf("the asyncio example printed %q; want a line per page, several pages", out)
			}
			for _, line := range lines {
				m := asyncLine.FindStringSubmatch(line)
				if m == nil {
					t.Errorf("the asyncio example printed %q; want PATH: 200 SOURCE N bytes", line)
					continue
				}
				if want := len(u.Body(m[1])); m[2] != strconv.Itoa(want) {
					t.Errorf("the asyncio example: %s has %s bytes; want %d", m[1], m[2], want)
				}
				if got := u.Count(m[1]); got != 1 {
					t.Errorf("the asyncio example: %d upstream requests for %s; want 1", got, m[1])
				}
			}
			ran = append(ran, "asyncio")
		case strings.Contains(code, "coordd.Client("):
			if out, want := run("blocking", replacer.Replace(code)), string(u.Body(readmeDoc))+"\n"; out != want { // print adds the newline
				t.Errorf("the blocking example printed %q; want the body %q", out, want)
			}
			ran = append(ran, "blocking")
		default:
			t.Errorf("a Python example this test does not run:\n%s", code)
		}
	}
	if got, want := strings.Join(ran, ","), "blocking,httpx(TestREADMEHTTPX),asyncio,fastmcp(compiled)"; got != want {
		t.Errorf("examples: %s; want %s", got, want)
	}
}

// TestVenvIgnored: the virtual environment the README's install steps
// create (.venv, in the repository or in clients/python) is ignored by git.
func TestVenvIgnored(t *testing.T) {
	if testing.Short() {
		t.Skip("runs git: not run under -short")
	}
	gitPath, err := exec.LookPath("git")
	if err != nil {
		t.Fatalf("git not found on PATH: %v", err)
	}
	for _, p := range []string{".venv/", "clients/python/.venv/", ".venv/bin/python"} {
		cmd := exec.Command(gitPath, "check-ignore", "--no-index", "-q", p)
		cmd.Dir = mustAbs(t, "../..")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("git check-ignore %s: %v %s; want it ignored (.gitignore)", p, err, out)
		}
	}
}
