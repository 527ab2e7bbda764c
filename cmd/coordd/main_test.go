package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/enginetest"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/freeport"
	"github.com/coordd/coordd/internal/testing/redistest"
	"github.com/coordd/coordd/internal/testing/storetest"
	"github.com/coordd/coordd/server/statuspage"
)

func TestReadConfig(t *testing.T) {
	fc, err := readConfig(strings.NewReader(`
listen: "127.0.0.1:6000"
redis: "redis://127.0.0.1:6379/0"
lock_ttl: 3s
max_concurrent_calls: 500
log_format: json
metrics_listen: "127.0.0.1:9090"
upstreams:
  - name: mdn
    base_url: "https://developer.mozilla.org"
    ttl: 10m
    stale_ttl: 24h
    timeout: 10s
    max_body_bytes: 10485760
`))
	if err != nil {
		t.Fatal(err)
	}
	if fc.Listen != "127.0.0.1:6000" || fc.LockTTL != 3*time.Second || len(fc.Upstreams) != 1 ||
		fc.LogFormat != "json" || fc.MetricsListen != "127.0.0.1:9090" {
		t.Fatalf("got %+v", fc)
	}
	if fc.MaxConcurrentCalls != 500 {
		t.Fatalf("max_concurrent_calls: got %d; want 500", fc.MaxConcurrentCalls)
	}
	u := fc.Upstreams[0]
	if u.TTL != 10*time.Minute || u.StaleTTL != 24*time.Hour || u.Timeout != 10*time.Second || u.MaxBodyBytes != 10<<20 {
		t.Fatalf("upstream = %+v", u)
	}
	if err := fc.addUpstreamFlag("mdn=https://mirror.example"); err != nil || fc.Upstreams[0].BaseURL != "https://mirror.example" {
		t.Fatalf("override: %v %+v", err, fc.Upstreams)
	}
	if err := fc.addUpstreamFlag("local=http://127.0.0.1:9"); err != nil || len(fc.Upstreams) != 2 {
		t.Fatalf("extend: %v %+v", err, fc.Upstreams)
	}
}

func TestBadConfigNamesField(t *testing.T) {
	tests := []struct {
		name, yaml, field string
		args              []string
	}{
		{"unknown field", "listne: x\n", "listne", nil},
		{"bad duration", "lock_ttl: forever\n", "forever", nil},
		{"bad base url", "upstreams:\n  - name: a\n    base_url: ftp://x\n", "upstreams[0] (a).base_url", nil},
		{"negative ttl", "upstreams:\n  - name: a\n    base_url: http://x\n    ttl: -1s\n", "upstreams[0] (a).ttl", nil},
		{"bad redis url", "redis: \"mysql://x\"\n", "redis", nil},
		{"bad upstream flag", "", "--upstream", []string{"--upstream", "nobase"}},
		{"bad log level", "log_level: loud\n", "log_level", nil},
		{"bad log format", "log_format: xml\n", "log_format", nil},
		{"bad log format flag", "", "log_format", []string{"--log-format", "yaml"}},
		{"bad metrics address", "metrics_listen: nowhere\n", "metrics_listen", nil},
		{"bad metrics address flag", "", "metrics_listen", []string{"--metrics-listen", "127.0.0.1:http2"}},
		{"negative grace", "shutdown_grace: -1s\n", "shutdown_grace", nil},
		{"negative redis timeout", "redis_timeout: -1s\n", "redis_timeout", nil},
		{"tiny lock ttl", "lock_ttl: 1ms\n", "lock_ttl", nil},
		{"sentinel without master name", "redis_sentinel:\n  addrs: [\"127.0.0.1:26379\"]\n", "redis_sentinel.master_name", nil},
		{"sentinel without addrs", "redis_sentinel:\n  master_name: mymaster\n", "redis_sentinel.addrs", nil},
		{"sentinel and redis", "redis_sentinel:\n  master_name: mymaster\n  addrs: [\"127.0.0.1:26379\"]\n", "redis_sentinel", []string{"--redis", "redis://127.0.0.1:6379/0"}},
		{"sentinel typo", "redis_sentinel:\n  mastername: mymaster\n", "mastername", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := t.TempDir() + "/coordd.yaml"
			if err := os.WriteFile(path, []byte(tt.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			args := append([]string{"--config", path, "--listen", "127.0.0.1:0"}, tt.args...)
			err := run(context.Background(), args, os.Stderr)
			if err == nil || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("run error = %v; want one naming %q", err, tt.field)
			}
		})
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	return freeport.Addr(t) // below the ephemeral range: no outgoing connection takes it meanwhile
}

// TestSIGTERMDrains runs coordd as main does and cancels its context, as
// SIGTERM does: health goes NOT_SERVING, the in-flight stream finishes,
// and the fill lock is released.
func TestSIGTERMDrains(t *testing.T) {
	rs := redistest.Start(t)
	up := fakeupstream.New(t)
	release := make(chan struct{})
	up.Set("/slow", fakeupstream.Behavior{Block: release})
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--listen", addr, "--redis", rs.URL(), "--upstream", "fake=" + up.URL(), "--drain-delay", "1ms"}, os.Stderr)
	}()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	for {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	got := make(chan error, 1)
	go func() {
		_, err := fleettest.Get(context.Background(), coorddv1.NewCoordinatorServiceClient(cc), &coorddv1.GetOrFetchRequest{Url: up.URL() + "/slow"})
		got <- err
	}()
	if err := up.WaitCount(ctx, "/slow", 1); err != nil {
		t.Fatal(err)
	}
	st := storetest.New(rs.Client(t), "")
	if held, _ := st.LockHeld(ctx, up.URL()+"/slow"); !held {
		t.Fatalf("fill lock not held during the fetch")
	}
	cancel() // SIGTERM
	// A new connection is refused once the drain stops gracefully (health
	// went NOT_SERVING before); the in-flight stream still finishes.
	refused := func() bool {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			return true
		}
		conn.Close()
		return false
	}
	enginetest.WaitFor(t, 10*time.Second, "the listener closed by the drain", refused)
	close(release)
	if err := <-got; err != nil {
		t.Fatalf("in-flight stream: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	if held, _ := st.LockHeld(context.Background(), up.URL()+"/slow"); held {
		t.Fatalf("fill lock still held after shutdown")
	}
}

// TestRedisClusterConfig runs coordd on a Redis Cluster from its YAML.
func TestRedisClusterConfig(t *testing.T) {
	rc := redistest.StartCluster(t, 3)
	up := fakeupstream.New(t)
	addr := freeAddr(t)
	path := t.TempDir() + "/coordd.yaml"
	yaml := "listen: " + addr + "\nredis_cluster: [\"" + strings.Join(rc.Addrs(), "\", \"") + "\"]\ndrain_delay: 1ms\nupstreams:\n  - name: fake\n    base_url: " + up.URL() + "\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"--config", path}, os.Stderr) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := coorddv1.NewCoordinatorServiceClient(cc)
	hc := healthpb.NewHealthClient(cc)
	for {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "coordd.v1.CoordinatorService/redis"}, grpc.WaitForReady(true))
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := range 2 {
		d, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: up.URL() + "/doc"})
		if err != nil {
			t.Fatalf("get %d: %v", i, err)
		}
		if i == 0 && d.Meta.GetSource() != coorddv1.Source_SOURCE_UPSTREAM {
			t.Fatalf("source %v", d.Meta.GetSource())
		}
	}
	stored, err := storetest.New(rc.Client(t), "").DocStored(context.Background(), up.URL()+"/doc")
	if err != nil || !stored {
		t.Fatalf("document not in the cluster: %v, %v", stored, err)
	}
}

// TestRedisSentinelConfig runs coordd on a Sentinel-managed master from
// its YAML: the document lands in the master the sentinels name, and the
// status page names the mode "sentinel".
func TestRedisSentinelConfig(t *testing.T) {
	s := redistest.StartSentinel(t, 0, 1)
	up := fakeupstream.New(t)
	addr, maddr := freeAddr(t), freeAddr(t)
	path := t.TempDir() + "/coordd.yaml"
	yaml := "listen: " + addr + "\nmetrics_listen: " + maddr + "\nredis_sentinel:\n  master_name: " + s.MasterName() +
		"\n  addrs: [\"" + strings.Join(s.Addrs(), "\", \"") + "\"]\ndrain_delay: 1ms\nupstreams:\n  - name: fake\n    base_url: " + up.URL() + "\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var runErr error
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		runErr = run(ctx, []string{"--config", path}, os.Stderr)
	}()
	defer func() {
		cancel()
		<-exited
		if runErr != nil {
			t.Errorf("run: %v", runErr)
		}
	}()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	for {
		select {
		case <-exited:
			t.Fatalf("run ended before serving: %v", runErr)
		default:
		}
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		r, err := hc.Check(cctx, &healthpb.HealthCheckRequest{Service: "coordd.v1.CoordinatorService/redis"}, grpc.WaitForReady(true))
		ccancel()
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	d, err := fleettest.Get(ctx, coorddv1.NewCoordinatorServiceClient(cc), &coorddv1.GetOrFetchRequest{Url: up.URL() + "/doc"})
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Meta.GetSource(); got != coorddv1.Source_SOURCE_UPSTREAM {
		t.Fatalf("source = %v; want UPSTREAM", got)
	}
	stored, err := storetest.New(s.Master(t).Client(t), "").DocStored(context.Background(), up.URL()+"/doc")
	if err != nil || !stored {
		t.Fatalf("document not in the master: %v, %v", stored, err)
	}
	resp, err := http.Get("http://" + maddr + statuspage.JSONPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v statuspage.View
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatalf("status.json: %d: %v", resp.StatusCode, err)
	}
	if v.Redis.Mode != "sentinel" {
		t.Fatalf("status.json redis = %+v; want mode sentinel", v.Redis)
	}
}

// TestCheckConfigBindsAndConnectsNothing: --check-config succeeds while
// every address coordd would listen on is taken, and connects to none of
// the Redis servers it names.
func TestCheckConfigBindsAndConnectsNothing(t *testing.T) {
	taken := func() net.Listener {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lis.Close() })
		return lis
	}
	grpcLis, metricsLis, httpLis, redisLis := taken(), taken(), taken(), taken()
	for _, tt := range []struct {
		name string
		yaml string
	}{
		{"redis", "redis: redis://" + redisLis.Addr().String() + "/0\n"},
		{"redis cluster", "redis_cluster: [\"" + redisLis.Addr().String() + "\"]\n"},
		{"redis sentinel", "redis_sentinel:\n  master_name: m\n  addrs: [\"" + redisLis.Addr().String() + "\"]\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := t.TempDir() + "/coordd.yaml"
			yaml := "listen: " + grpcLis.Addr().String() + "\nmetrics_listen: " + metricsLis.Addr().String() +
				"\nhttp_listen: " + httpLis.Addr().String() + "\n" + tt.yaml
			if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := run(context.Background(), []string{"--config", path, "--check-config"}, os.Stderr); err != nil {
				t.Fatalf("--check-config with its addresses taken: %v; want it to bind nothing", err)
			}
		})
	}
	// Whatever dialed Redis during the runs waits in the backlog now.
	if err := redisLis.(*net.TCPListener).SetDeadline(time.Now()); err != nil {
		t.Fatal(err)
	}
	if c, err := redisLis.Accept(); err == nil {
		c.Close()
		t.Fatal("--check-config connected to Redis")
	}
}

// TestRedisAndClusterRefused: redis (from the file, --redis or
// COORDD_REDIS) beside redis_cluster is refused, at start and by
// --check-config, naming both fields, instead of the cluster silently
// winning.
func TestRedisAndClusterRefused(t *testing.T) {
	cluster := "redis_cluster: [\"127.0.0.1:1\"]\n"
	for _, tt := range []struct {
		name, yaml string
		env        map[string]string
		args       []string
	}{
		{"file", "redis: redis://127.0.0.1:2/0\n" + cluster, nil, nil},
		{"flag", cluster, nil, []string{"--redis", "redis://127.0.0.1:2/0"}},
		{"environment", cluster, map[string]string{"COORDD_REDIS": "redis://127.0.0.1:2/0"}, nil},
	} {
		for _, check := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/check-config=%v", tt.name, check), func(t *testing.T) {
				for k, v := range tt.env {
					t.Setenv(k, v)
				}
				path := t.TempDir() + "/coordd.yaml"
				if err := os.WriteFile(path, []byte(tt.yaml), 0o600); err != nil {
					t.Fatal(err)
				}
				args := append([]string{"--config", path, "--listen", "127.0.0.1:0", "--drain-delay", "1ms"}, tt.args...)
				if check {
					args = append(args, "--check-config")
				}
				// Canceled: a coordd that takes the configuration serves
				// and stops at once, returning nil.
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				err := run(ctx, args, os.Stderr)
				if err == nil || !strings.Contains(err.Error(), "redis, redis_cluster") {
					t.Fatalf("run error = %v; want one naming redis and redis_cluster", err)
				}
			})
		}
	}
}

// goTypeName matches what a YAML error must not show: the Go types the
// file decodes into, and YAML's own tags.
var goTypeName = regexp.MustCompile(`time\.Duration|\bmain\.|\bupstream\.[A-Za-z]|\bcoordinator\.[A-Za-z]|\[\][a-z]|\b(u?int|float)(8|16|32|64)?\b|\bbool\b|\bstring\b|!!`)

// TestConfigYAMLErrorsNameKeys: a file that does not decode is refused
// with errors that name each bad value by its YAML key path and line,
// never by the Go type it was to fill, all of them at once.
func TestConfigYAMLErrorsNameKeys(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       []string
	}{
		{"unknown field", "listne: x\n", []string{"line 1", "listne", "unknown", "listen"}},
		{"unknown nested field", "upstreams:\n  - name: a\n    base_url: http://a\n    retry:\n      max_atempts: 3\n",
			[]string{"line 5", "upstreams[0].retry.max_atempts", "max_attempts"}},
		{"sentinel typo", "redis_sentinel:\n  mastername: m\n", []string{"redis_sentinel.mastername", "master_name"}},
		{"duration", "upstreams:\n  - name: a\n    base_url: http://a\n  - name: b\n    ttl: soon\n", []string{"line 5", "upstreams[1].ttl", `"soon"`, "duration"}},
		{"duration as a number", "lock_ttl: 3\n", []string{"lock_ttl", `"3"`, "duration"}},
		{"integer", "l1_max_bytes: lots\n", []string{"l1_max_bytes", `"lots"`}},
		{"boolean", "pprof: maybe\n", []string{"pprof", `"maybe"`, "true or false"}},
		{"number", "tracing:\n  sample_ratio: half\n", []string{"tracing.sample_ratio", `"half"`}},
		{"list for a mapping", "tls: [a]\n", []string{"tls", "mapping"}},
		{"scalar for a list", "upstreams: mdn\n", []string{"upstreams", "list"}},
		{"mapping for a value", "listen: {a: b}\n", []string{"listen", "single value"}},
		{"key given twice", "listen: a\nlisten: b\n", []string{"line 2", "listen", "twice", "line 1"}},
		{"every error at once", "listne: x\nupstreams:\n  - name: a\n    ttl: soon\n  - name: b\n    timeout: later\nlock_ttl: forever\n",
			[]string{"listne", "upstreams[0].ttl", "upstreams[1].timeout", "lock_ttl", `"forever"`}},
		{"not yaml", "listen: [a\n", []string{"line"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := readConfig(strings.NewReader(tt.yaml))
			if err == nil {
				t.Fatal("readConfig: no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q; want it to contain %q", err, w)
				}
			}
			if m := goTypeName.FindString(err.Error()); m != "" {
				t.Errorf("error %q names a Go type or YAML tag (%q); want YAML keys only", err, m)
			}
		})
	}
}

// TestRedisUnavailableAtStart: coordd started on a Redis that refuses
// connections serves, and its logs name that Redis (never its password),
// the error, and the mode as it is: coordinating in-process.
func TestRedisUnavailableAtStart(t *testing.T) {
	up := fakeupstream.New(t)
	addr, dead := freeAddr(t), freeAddr(t) // nothing listens on dead
	ctx, cancel := context.WithCancel(context.Background())
	logFile, err := os.Create(filepath.Join(t.TempDir(), "coordd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	logs := func() string { b, _ := os.ReadFile(logFile.Name()); return string(b) }
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--listen", addr, "--redis", "redis://:hunter2-canary@" + dead,
			"--upstream", "fake=" + up.URL(), "--drain-delay", "1ms"}, logFile)
	}()
	enginetest.WaitFor(t, 20*time.Second, "coordd serving", func() bool {
		select {
		case err := <-done:
			t.Fatalf("run: %v\n%s", err, logs())
		default:
		}
		return strings.Contains(logs(), "coordd serving")
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	out := logs()
	var warn, serving string
	for line := range strings.Lines(out) {
		switch {
		case strings.Contains(line, "redis unavailable at start"):
			warn = line
		case strings.Contains(line, "coordd serving"):
			serving = line
		}
	}
	if !strings.Contains(warn, dead) || !strings.Contains(warn, "connection refused") || !strings.Contains(warn, "in-process") {
		t.Errorf("the warning %q; want the address %s, the error and what coordd does", warn, dead)
	}
	if !strings.Contains(serving, "unavailable") || !strings.Contains(serving, "in-process") {
		t.Errorf("the serving line %q; want the mode as it is: redis unavailable, coordinating in-process", serving)
	}
	if strings.Contains(out, "hunter2-canary") {
		t.Error("the Redis password is in the logs")
	}
}
