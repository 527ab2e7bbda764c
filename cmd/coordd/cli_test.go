package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// stampedVersion is the version TestVersion stamps into coordd with
// -ldflags, as `make dist` does.
const stampedVersion = "v9.9.9-test"

var builds struct {
	sync.Mutex
	dir  string
	bins map[string]string // ldflags → binary
}

// coorddBinary builds coordd (once per ldflags) and returns its path. It
// skips under -short: the short loop starts no process.
func coorddBinary(t *testing.T, ldflags string) string {
	t.Helper()
	skipShort(t)
	builds.Lock()
	defer builds.Unlock()
	if bin, ok := builds.bins[ldflags]; ok {
		return bin
	}
	if builds.dir == "" {
		dir, err := os.MkdirTemp("", "coordd-cli-test")
		if err != nil {
			t.Fatal(err)
		}
		builds.dir, builds.bins = dir, map[string]string{}
	}
	bin := filepath.Join(builds.dir, "coordd"+string(rune('0'+len(builds.bins))))
	out, err := exec.Command("go", "build", "-ldflags", ldflags, "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	builds.bins[ldflags] = bin
	return bin
}

// runBinary runs bin with args and env added to the environment, and
// returns its exit code, stdout and stderr.
func runBinary(t *testing.T, bin string, env []string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, stdout.String(), stderr.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), stdout.String(), stderr.String()
	}
	t.Fatalf("coordd %v: %v", args, err)
	return 0, "", ""
}

// TestCommandLine runs the built coordd: --help exits 0 with the usage,
// stray arguments and unknown flags exit 2 naming them in one line (the
// nearest flag to a mistyped one), a bad environment
// value exits 1 naming its variable and value.
func TestCommandLine(t *testing.T) {
	bin := coorddBinary(t, "")
	tests := []struct {
		name     string
		env      []string
		args     []string
		wantCode int
		want     []string // in stderr
	}{
		{"help", nil, []string{"--help"}, 0, []string{"Usage: coordd", "COORDD_METRICS_LISTEN", "-log-level", "-version"}},
		{"h", nil, []string{"-h"}, 0, []string{"Usage: coordd"}},
		{"stray argument", nil, []string{"--check-config", "stray", "--listen", "x"}, 2, []string{`coordd: unexpected argument "stray"`}},
		{"unknown flag", nil, []string{"--nope"}, 2, []string{"flag provided but not defined: -nope", "--help lists every flag"}},
		// a typo gets the nearest flag, as a YAML key or COORDD_* variable does (#39)
		{"mistyped flag", nil, []string{"--redsi", "redis://127.0.0.1:1"}, 2, []string{"flag provided but not defined: -redsi; did you mean --redis?"}},
		{"bad flag value", nil, []string{"--drain-delay=soon"}, 2, []string{`invalid value "soon" for flag -drain-delay`}},
		{"bad env duration", []string{"COORDD_DRAIN_DELAY=soon"}, []string{"--check-config"}, 1, []string{"COORDD_DRAIN_DELAY", `"soon"`}},
		{"bad env level", []string{"COORDD_LOG_LEVEL=loud"}, []string{"--check-config"}, 1, []string{"log_level", "loud"}},
		{"check config", []string{"COORDD_LOG_LEVEL=debug"}, []string{"--check-config"}, 0, []string{"configuration ok"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, stderr := runBinary(t, bin, tt.env, tt.args...)
			if code != tt.wantCode {
				t.Errorf("coordd %v: exit %d; want %d\nstderr: %s", tt.args, code, tt.wantCode, stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("coordd %v: stderr %q; want it to contain %q", tt.args, stderr, w)
				}
			}
			// The whole usage is for --help; a mistake gets one line.
			if tt.wantCode == 2 && strings.Contains(stderr, "Usage: coordd") {
				t.Errorf("coordd %v: a mistake printed the whole usage:\n%s", tt.args, stderr)
			}
		})
	}
}

// TestVersion: --version prints the build's facts, with the version
// stamped by -ldflags when there is one, and exits 0.
func TestVersion(t *testing.T) {
	for _, tc := range []struct {
		name, ldflags string
		want          []string
	}{
		// Unstamped: the module's version, (devel), or since Go 1.24 one
		// derived from the git checkout (v0.0.0-…+dirty).
		{"unstamped", "", []string{"coordd ", " (module github.com/coordd/coordd ", "go1."}},
		{"stamped", "-X github.com/coordd/coordd/internal/version.Version=" + stampedVersion,
			[]string{"coordd " + stampedVersion + " (module github.com/coordd/coordd"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runBinary(t, coorddBinary(t, tc.ldflags), nil, "--version")
			if code != 0 {
				t.Fatalf("exit %d; want 0\nstderr: %s", code, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stdout, w) {
					t.Errorf("--version printed %q; want it to contain %q", stdout, w)
				}
			}
			// A build in a git clone carries its revision; one in a git
			// worktree (which go build does not stamp) or a source tarball
			// has none, and says (devel).
			if !strings.Contains(stdout, "revision ") && !strings.Contains(stdout, "(devel)") {
				t.Errorf("--version printed %q; want a revision or (devel)", stdout)
			}
		})
	}
}

// TestFlagsEnvFilePrecedence: a flag beats its COORDD_* variable, which
// beats the file, which beats the default.
func TestFlagsEnvFilePrecedence(t *testing.T) {
	path := filepath.Join(t.TempDir(), "coordd.yaml")
	yaml := "listen: 127.0.0.1:1001\nlog_level: warn\nmetrics_listen: 127.0.0.1:2001\nupstreams:\n  - name: a\n    base_url: http://file.example\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want func(o options) string // "" when as wanted
	}{
		{"file", nil, []string{"--config", path}, func(o options) string {
			return check(o.fc.Listen == "127.0.0.1:1001" && o.fc.LogLevel == "warn" && o.fc.MetricsListen == "127.0.0.1:2001", o)
		}},
		{"env beats file", map[string]string{"COORDD_LISTEN": "127.0.0.1:1002", "COORDD_LOG_LEVEL": "debug", "COORDD_METRICS_LISTEN": "127.0.0.1:2002"},
			[]string{"--config", path}, func(o options) string {
				return check(o.fc.Listen == "127.0.0.1:1002" && o.fc.LogLevel == "debug" && o.fc.MetricsListen == "127.0.0.1:2002", o)
			}},
		{"flag beats env", map[string]string{"COORDD_LISTEN": "127.0.0.1:1002", "COORDD_LOG_LEVEL": "debug"},
			[]string{"--config", path, "--listen", "127.0.0.1:1003", "--log-level", "error"}, func(o options) string {
				return check(o.fc.Listen == "127.0.0.1:1003" && o.fc.LogLevel == "error" && o.fc.MetricsListen == "127.0.0.1:2001", o)
			}},
		{"config file from env", map[string]string{"COORDD_CONFIG": path}, nil, func(o options) string {
			return check(o.fc.Listen == "127.0.0.1:1001", o)
		}},
		{"default", nil, nil, func(o options) string {
			return check(o.fc.Listen == "127.0.0.1:50051" && o.fc.LogLevel == "" && o.fc.DrainDelay == 5*time.Second, o)
		}},
		{"env duration", map[string]string{"COORDD_DRAIN_DELAY": "250ms"}, nil, func(o options) string {
			return check(o.fc.DrainDelay == 250*time.Millisecond, o)
		}},
		{"env upstream overrides the file's", map[string]string{"COORDD_UPSTREAM": "a=http://env.example"}, []string{"--config", path}, func(o options) string {
			return check(len(o.fc.Upstreams) == 1 && o.fc.Upstreams[0].BaseURL == "http://env.example", o)
		}},
		{"flag upstreams replace env's", map[string]string{"COORDD_UPSTREAM": "b=http://env.example"},
			[]string{"--upstream", "c=http://flag.example", "--upstream", "d=http://flag2.example"}, func(o options) string {
				return check(len(o.fc.Upstreams) == 2 && o.fc.Upstreams[0].Name == "c" && o.fc.Upstreams[1].Name == "d", o)
			}},
		{"env bool", map[string]string{"COORDD_PPROF": "true"}, nil, func(o options) string {
			return check(o.fc.Pprof, o)
		}},
		{"actions not from env", map[string]string{"COORDD_VERSION": "v1.2.3", "COORDD_CHECK_CONFIG": "true"}, nil, func(o options) string {
			return check(!o.version && !o.checkConfig, o)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			o, err := parseArgs(tt.args, os.Stderr)
			if err != nil {
				t.Fatal(err)
			}
			if msg := tt.want(o); msg != "" {
				t.Error(msg)
			}
		})
	}
}

func check(ok bool, o options) string {
	if ok {
		return ""
	}
	return "got " + strings.ReplaceAll(strings.TrimSpace(strings.Join([]string{
		"listen=" + o.fc.Listen, "log_level=" + o.fc.LogLevel, "metrics_listen=" + o.fc.MetricsListen,
		"drain_delay=" + o.fc.DrainDelay.String(), "upstreams=" + upstreamsString(o),
	}, " ")), "\n", " ")
}

func upstreamsString(o options) string {
	var s []string
	for _, u := range o.fc.Upstreams {
		s = append(s, u.Name+"="+u.BaseURL)
	}
	return strings.Join(s, ",")
}

// TestParseArgsErrors: each error names what is wrong, and maps to the
// exit code main uses.
func TestParseArgsErrors(t *testing.T) {
	tests := []struct {
		name     string
		env      map[string]string
		args     []string
		want     string
		wantCode int
	}{
		{"stray argument", nil, []string{"serve", "--listen", "127.0.0.1:0"}, `unexpected argument "serve"`, 2},
		{"help", nil, []string{"--help"}, "help requested", 0},
		{"bad env duration", map[string]string{"COORDD_DRAIN_DELAY": "soon"}, nil, `environment variable "COORDD_DRAIN_DELAY": invalid value "soon"`, 1},
		{"bad env upstream", map[string]string{"COORDD_UPSTREAM": "nobase"}, nil, `--upstream "nobase"`, 1},
		{"bad env bool", map[string]string{"COORDD_PPROF": "maybe"}, nil, `environment variable "COORDD_PPROF": invalid value "maybe"`, 1},
		{"negative drain delay", nil, []string{"--drain-delay", "-1s"}, "drain_delay", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			var stderr bytes.Buffer
			_, err := parseArgs(tt.args, &stderr)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("parseArgs(%q) = %v; want an error containing %q", tt.args, err, tt.want)
			}
			if code := exitCode("coordd", err, &stderr); code != tt.wantCode {
				t.Errorf("exit code %d for %v; want %d", code, err, tt.wantCode)
			}
		})
	}
}

// TestEnvServes runs coordd with its listeners given by COORDD_LISTEN and
// COORDD_HTTP_LISTEN only: it serves gRPC and the HTTP door there.
func TestEnvServes(t *testing.T) {
	grpcAddr, httpAddr := freeAddr(t), freeAddr(t)
	t.Setenv("COORDD_LISTEN", grpcAddr)
	t.Setenv("COORDD_HTTP_LISTEN", httpAddr)
	t.Setenv("COORDD_DRAIN_DELAY", "1ms")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(runCtx, nil, os.Stderr) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	cc, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	r, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health at COORDD_LISTEN %s: %v, %v; want SERVING", grpcAddr, r.GetStatus(), err)
	}
	// The door listens once gRPC does (run starts both before serving).
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/v1/documents", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("HTTP door at COORDD_HTTP_LISTEN %s: %v", httpAddr, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("GET /v1/documents without url: status %d; want 400 from the door", resp.StatusCode)
	}
}

// startLog runs coordd with args and env, its context canceled from the
// start so that it starts, serves and stops at once, and returns its JSON
// log lines.
func startLog(t *testing.T, env map[string]string, args ...string) []map[string]any {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	logs, err := os.CreateTemp(t.TempDir(), "coordd-log")
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	args = append([]string{"--listen", "127.0.0.1:0", "--drain-delay", "1ms", "--log-format", "json"}, args...)
	if err := run(ctx, args, logs); err != nil {
		t.Fatalf("run %v: %v", args, err)
	}
	b, err := os.ReadFile(logs.Name())
	if err != nil {
		t.Fatal(err)
	}
	var lines []map[string]any
	for l := range strings.Lines(string(b)) {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line is not JSON: %s", l)
		}
		lines = append(lines, m)
	}
	return lines
}

// logLine is the first of lines whose msg starts with msg, or nil.
func logLine(lines []map[string]any, msg string) map[string]any {
	for _, l := range lines {
		if m, _ := l["msg"].(string); strings.HasPrefix(m, msg) {
			return l
		}
	}
	return nil
}

// TestStartLogListsUpstreams: the start log lists the upstreams in force,
// each name=base_url, says where they come from, and, when they replace
// the MDN default (an --upstream flag, COORDD_UPSTREAM, the file's
// upstreams), says so and names the default.
func TestStartLogListsUpstreams(t *testing.T) {
	path := filepath.Join(t.TempDir(), "coordd.yaml")
	if err := os.WriteFile(path, []byte("upstreams:\n  - name: a\n    base_url: http://a.example\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const mdn = "mdn=https://developer.mozilla.org"
	for _, tt := range []struct {
		name            string
		env             map[string]string
		args            []string
		want            []string
		source          string
		replacesDefault bool
	}{
		{"default", nil, nil, []string{mdn}, "default", false},
		{"flag", nil, []string{"--upstream", "local=http://127.0.0.1:9"}, []string{"local=http://127.0.0.1:9"}, "--upstream", true},
		{"environment", map[string]string{"COORDD_UPSTREAM": "local=http://127.0.0.1:9"}, nil, []string{"local=http://127.0.0.1:9"}, "COORDD_UPSTREAM", true},
		{"file", nil, []string{"--config", path}, []string{"a=http://a.example"}, "config file", true},
		{"file and flag", nil, []string{"--config", path, "--upstream", "a=http://b.example", "--upstream", "c=http://c.example"},
			[]string{"a=http://b.example", "c=http://c.example"}, "config file and --upstream", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l := logLine(startLog(t, tt.env, tt.args...), "upstreams in force")
			if l == nil {
				t.Fatal("no log line \"upstreams in force\"")
			}
			if got := fmt.Sprint(l["upstreams"]); got != fmt.Sprint(tt.want) {
				t.Errorf("upstreams = %s; want %s", got, fmt.Sprint(tt.want))
			}
			if got := l["source"]; got != tt.source {
				t.Errorf("source = %v; want %q", got, tt.source)
			}
			msg, _ := l["msg"].(string)
			if replaces := strings.Contains(msg, "replace the default"); replaces != tt.replacesDefault {
				t.Errorf("msg %q; want it to say the default is replaced: %v", msg, tt.replacesDefault)
			}
			if got := l["default"]; tt.replacesDefault && got != mdn {
				t.Errorf("default = %v; want %q named as replaced", got, mdn)
			}
		})
	}
}

// TestStrayEnvironmentWarned: a COORDD_* variable that names no flag, and
// that no *_env field of the configuration names either, is warned about
// at start, one WARN line naming it (and the flag's variable it is
// likely a typo of), never its value; a flag's variable, even an action
// flag's, one the configuration names, and mdn-mcp's COORDD_TOKEN are
// not.
func TestStrayEnvironmentWarned(t *testing.T) {
	const secret = "redis://:s3cret-in-a-typo@127.0.0.1:6379/0"
	path := filepath.Join(t.TempDir(), "coordd.yaml")
	yaml := `tenants:
  - name: a
    tokens_env: COORDD_TEAM_A_TOKENS
    upstreams: ["*"]
    credentials:
      gh: {value_env: COORDD_TEAM_A_GH}
metrics_auth:
  tokens_env: COORDD_METRICS_TOKENS
redis_password_env: COORDD_REDIS_PW
credential_scope_key_env: COORDD_SCOPE_KEY
upstreams:
  - name: gh
    base_url: http://127.0.0.1:9
    credential: {value_env: COORDD_GH}
`
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	lines := startLog(t, map[string]string{
		"COORDD_REDSI":          secret,
		"COORDD_LOGLEVEL":       "debug",
		"COORDD_TEAM_A_TOKENS":  "team-a-token-0123456789",
		"COORDD_METRICS_TOKENS": "metrics-token-0123456789",
		"COORDD_REDIS_PW":       "unused-without-redis",
		"COORDD_DRAIN_DELAY":    "1ms",
		"COORDD_VERSION":        "v1.2.3",
		"COORDD_TOKEN":          "mdn-mcp-token-0123456789",
		"COORDD_TEAM_A_GH":      "Bearer team-a-gh-0123456789",
		"COORDD_GH":             "Bearer gh-0123456789",
		"COORDD_SCOPE_KEY":      "scope-key-0123456789abcdef",
	}, "--config", path)
	warned := map[string]map[string]any{}
	for _, l := range lines {
		if v, _ := l["variable"].(string); l["level"] == "WARN" && v != "" {
			warned[v] = l
		}
		for k, v := range l {
			if s, _ := v.(string); strings.Contains(s, "s3cret") {
				t.Errorf("log line %v: %s shows the variable's value", l, k)
			}
		}
	}
	for name, hint := range map[string]string{"COORDD_REDSI": "COORDD_REDIS", "COORDD_LOGLEVEL": "COORDD_LOG_LEVEL"} {
		l := warned[name]
		if l == nil {
			t.Errorf("no WARN line with variable=%s", name)
			continue
		}
		if got := l["did_you_mean"]; got != hint {
			t.Errorf("%s: did_you_mean = %v; want %s", name, got, hint)
		}
	}
	for _, name := range []string{"COORDD_TEAM_A_TOKENS", "COORDD_METRICS_TOKENS", "COORDD_REDIS_PW", "COORDD_DRAIN_DELAY", "COORDD_VERSION", "COORDD_TOKEN",
		"COORDD_TEAM_A_GH", "COORDD_GH", "COORDD_SCOPE_KEY"} {
		if l := warned[name]; l != nil {
			t.Errorf("%s warned about: %v", name, l)
		}
	}
}

// TestCheckConfigPrintsResolved runs the built coordd with --check-config:
// it prints, as YAML on stdout, the configuration it resolved (the file,
// the environment and the flags merged, every default filled in), with
// every secret shown as <redacted> and the names of the variables and
// files that hold secrets left as they are.
func TestCheckConfigPrintsResolved(t *testing.T) {
	bin := coorddBinary(t, "")
	dir := t.TempDir()
	tokensFile := filepath.Join(dir, "team-a")
	if err := os.WriteFile(tokensFile, []byte("file-s3cret-token-4444\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{
		"COORDD_LISTEN=127.0.0.1:7001",
		"COORDD_TEST_REDIS_PW=env-s3cret-2",
		"TEAM_A_TOKENS=env-s3cret-token-3333",
		"METRICS_TOKENS=metrics-env-s3cret-7777",
		"GH_TOKEN=Bearer gh-s3cret-10",
		"TEAM_A_GH_TOKEN=Bearer team-a-gh-s3cret-11",
		"SCOPE_KEY=scope-key-s3cret-0123456789",
	}
	for _, tt := range []struct {
		name  string
		yaml  string
		check func(t *testing.T, got map[string]any)
	}{
		{"redis and tenants", `redis: "redis://coordd:url-s3cret-1@127.0.0.1:6379/0"
redis_password_env: COORDD_TEST_REDIS_PW
credential_scope_key_env: SCOPE_KEY
tenants:
  - name: a
    tokens_env: TEAM_A_TOKENS
    tokens_file: ` + tokensFile + `
    tokens: ["inline-s3cret-token-5555"]
    upstreams: ["*"]
    credentials:
      a: {value_env: TEAM_A_GH_TOKEN}
metrics_listen: "127.0.0.1:9"
metrics_auth:
  tokens_env: METRICS_TOKENS
  tokens: ["metrics-s3cret-token-6666"]
upstreams:
  - name: a
    base_url: http://a.example
    ttl: 1m
    credential: {value_env: GH_TOKEN}
    request_headers: {User-Agent: coordd, X-Api-Key: header-s3cret-12}
`, func(t *testing.T, got map[string]any) {
			for path, want := range map[string]any{
				"listen":                                 "127.0.0.1:7001", // the environment
				"log_level":                              "debug",          // a flag
				"log_format":                             "text",
				"drain_delay":                            "5s",
				"shutdown_grace":                         "10s",
				"max_concurrent_calls":                   10000,
				"reflection":                             true,
				"lock_ttl":                               "2s",
				"redis_timeout":                          "500ms",
				"key_prefix":                             "coordd:",
				"l1_max_bytes":                           268435456,
				"tracing.protocol":                       "grpc",
				"upstreams.0.name":                       "a",
				"upstreams.0.ttl":                        "1m0s",
				"upstreams.0.stale_ttl":                  "24h0m0s",
				"upstreams.0.rate_limit":                 20,
				"upstreams.0.retry.max_attempts":         3,
				"upstreams.0.learn_quota":                true, // the default, filled in
				"upstreams.1.learn_quota":                true,
				"upstreams.1.name":                       "b", // a flag
				"upstreams.1.base_url":                   "http://b.example",
				"upstreams.1.ttl":                        "10m0s",
				"redis":                                  "redis://coordd:<redacted>@127.0.0.1:6379/0",
				"redis_password_env":                     "COORDD_TEST_REDIS_PW",
				"tenants.0.tokens_env":                   "TEAM_A_TOKENS",
				"tenants.0.tokens_file":                  tokensFile,
				"tenants.0.tokens.0":                     "<redacted>",
				"tenants.0.upstreams.0":                  "*",
				"tenants.0.weight":                       1, // the default, filled in
				"metrics_auth.tokens_env":                "METRICS_TOKENS",
				"metrics_auth.tokens.0":                  "<redacted>",
				"upstreams.0.credential.header":          "Authorization",
				"upstreams.0.credential.value_env":       "GH_TOKEN",
				"upstreams.0.caller_credentials":         false,
				"upstreams.0.request_headers.User-Agent": "coordd",
				"upstreams.0.request_headers.X-Api-Key":  "<redacted>",
				"tenants.0.credentials.a.value_env":      "TEAM_A_GH_TOKEN",
				"credential_scope_key_env":               "SCOPE_KEY",
			} {
				if g := yamlAt(got, path); fmt.Sprint(g) != fmt.Sprint(want) {
					t.Errorf("%s = %v; want %v", path, g, want)
				}
			}
		}},
		{"sentinel", `redis_sentinel:
  master_name: m
  addrs: ["127.0.0.1:26379"]
  password: sentinel-s3cret-8
  sentinel_password: sentinel-s3cret-9
`, func(t *testing.T, got map[string]any) {
			for path, want := range map[string]any{
				"redis_sentinel.master_name":       "m",
				"redis_sentinel.addrs.0":           "127.0.0.1:26379",
				"redis_sentinel.password":          "<redacted>",
				"redis_sentinel.sentinel_password": "<redacted>",
				"upstreams.0.name":                 "b",
			} {
				if g := yamlAt(got, path); fmt.Sprint(g) != fmt.Sprint(want) {
					t.Errorf("%s = %v; want %v", path, g, want)
				}
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "-")+".yaml")
			if err := os.WriteFile(path, []byte(tt.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			code, stdout, stderr := runBinary(t, bin, env, "--config", path, "--upstream", "b=http://b.example", "--log-level", "debug", "--check-config")
			if code != 0 || !strings.Contains(stderr, "configuration ok") {
				t.Fatalf("exit %d; want 0 and \"configuration ok\"\nstderr: %s", code, stderr)
			}
			if strings.Contains(stdout+stderr, "s3cret") {
				t.Errorf("a secret is shown:\nstdout:\n%s\nstderr:\n%s", stdout, stderr)
			}
			var got map[string]any
			if err := yaml.Unmarshal([]byte(stdout), &got); err != nil || got == nil {
				t.Fatalf("stdout is not a YAML mapping (%v):\n%s", err, stdout)
			}
			tt.check(t, got)
			for _, p := range nullsIn(got, "") {
				// A section that is absent is null: not configured, no default.
				if k := p[strings.LastIndex(p, ".")+1:]; !slices.Contains([]string{"credential", "redis_sentinel", "tls", "metrics_auth"}, k) {
					t.Errorf("%s is printed null: a default is not filled in", p)
				}
			}
			// What it printed is a configuration coordd reads.
			if _, err := readConfig(strings.NewReader(stdout)); err != nil {
				t.Errorf("the printed configuration does not read back: %v", err)
			}
		})
	}
}

// nullsIn lists the paths under prefix of v, decoded YAML, whose value
// is null.
func nullsIn(v any, prefix string) []string {
	var out []string
	switch c := v.(type) {
	case nil:
		return []string{prefix}
	case map[string]any:
		for k, e := range c {
			out = append(out, nullsIn(e, strings.TrimPrefix(prefix+"."+k, "."))...)
		}
	case []any:
		for i, e := range c {
			out = append(out, nullsIn(e, strings.TrimPrefix(prefix+"."+strconv.Itoa(i), "."))...)
		}
	}
	return out
}

// yamlAt is the value at path (keys and list indexes joined by dots) in
// v, decoded YAML; nil if none.
func yamlAt(v any, path string) any {
	for k := range strings.SplitSeq(path, ".") {
		switch c := v.(type) {
		case map[string]any:
			v = c[k]
		case []any:
			i, err := strconv.Atoi(k)
			if err != nil || i >= len(c) {
				return nil
			}
			v = c[i]
		default:
			return nil
		}
	}
	return v
}

// TestCheckConfigReportsEveryError runs the built coordd with
// --check-config on a configuration with many errors, in the file, the
// environment and the flags: it exits 1 and reports every one of them,
// each naming its key, variable or flag, none naming a Go type, and
// prints no configuration.
func TestCheckConfigReportsEveryError(t *testing.T) {
	bin := coorddBinary(t, "")
	path := filepath.Join(t.TempDir(), "coordd.yaml")
	yml := `lock_ttl: 1ms
shutdown_grace: -1s
log_format: xml
redis: redis://127.0.0.1:1/0
redis_cluster: ["127.0.0.1:2"]
upstreams:
  - name: a
    base_url: ftp://a
  - name: b
    base_url: http://b
    ttl: -1s
  - name: c
    base_url: http://c
    timeout: soon
tenants:
  - name: t
    tokens: ["0123456789abcdef-token"]
    upstreams: [nope]
  - name: u
    tokens_env: COORDD_TEST_UNSET_TOKENS
    upstreams: ["*"]
  - name: w
    tokens: ["short"]
    tokens_env: COORDD_TEST_UNSET_TOKENS_W
    upstreams: ["*"]
  - name: x
    tokens_env: TEST_SHORT_TOKENS
    upstreams: ["*"]
`
	if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runBinary(t, bin, []string{"COORDD_DRAIN_DELAY=soon", "COORDD_PPROF=maybe", "TEST_SHORT_TOKENS=abcde,0123456789abcdef-long"},
		"--config", path, "--upstream", "nobase", "--check-config")
	if code != 1 {
		t.Errorf("exit %d; want 1", code)
	}
	for _, want := range []string{
		`"COORDD_DRAIN_DELAY": invalid value "soon"`,
		`"COORDD_PPROF": invalid value "maybe"`,
		`--upstream "nobase"`,
		"lock_ttl",
		"shutdown_grace",
		"log_format",
		"redis, redis_cluster",
		"upstreams[0] (a).base_url",
		"upstreams[1] (b).ttl",
		`upstreams[2].timeout: "soon" is not a duration`,
		`tenants[0] (t).upstreams[0]: no upstream is named "nope"`,
		"tenants[1] (u).tokens_env",
		// a short token and a missing variable of one tenant, both; a
		// token from tokens_env named as such (#39)
		"tenants[2] (w).tokens[0]: 5 bytes; want at least 16",
		"tenants[2] (w).tokens_env: $COORDD_TEST_UNSET_TOKENS_W is not set",
		"tenants[3] (x).tokens_env: token 1 of $TEST_SHORT_TOKENS: 5 bytes; want at least 16",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if m := goTypeName.FindString(stderr); m != "" {
		t.Errorf("stderr names a Go type (%q):\n%s", m, stderr)
	}
	if strings.Contains(stderr, "abcde") {
		t.Errorf("stderr quotes a token:\n%s", stderr)
	}
	if stdout != "" {
		t.Errorf("stdout %q; want no configuration printed when it has errors", stdout)
	}
}
