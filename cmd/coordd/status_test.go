package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/redistest"
	"github.com/coordd/coordd/server/statuspage"
)

// Tokens of the status fleet: a tenant's, and the metrics listener's own.
const (
	statusTenantToken  = "status-tenant-token-0123456789"
	statusMetricsToken = "status-metrics-token-0123456789"
)

// statusFleet is two coordd, run as main runs them, sharing one Redis, with
// a tenant, metrics_auth, and two upstreams on one fake server: docs, and
// flaky, whose breaker opens after two failures.
type statusFleet struct {
	up      *fakeupstream.Upstream
	addrs   []string // gRPC
	metrics []string // metrics listeners, host:port
	conns   []coorddv1.CoordinatorServiceClient
}

// startStatusFleet starts the fleet; extra[i] is appended to instance i's
// configuration file.
func startStatusFleet(t *testing.T, extra ...string) *statusFleet {
	t.Helper()
	rs := redistest.Start(t)
	f := &statusFleet{up: fakeupstream.New(t)}
	for i := range 2 {
		addr, maddr := freeAddr(t), freeAddr(t)
		yaml := fmt.Sprintf(`listen: %s
metrics_listen: %s
redis: %s
redis_timeout: 2s
upstreams:
  - name: docs
    base_url: %s/docs
  - name: flaky
    base_url: %s/flaky
    breaker:
      failure_threshold: 2
      open_for: 10m
    retry:
      max_attempts: 1
tenants:
  - name: team-a
    tokens: [%s]
    upstreams: ["*"]
metrics_auth:
  tokens: [%s]
`, addr, maddr, rs.URL(), f.up.URL(), f.up.URL(), statusTenantToken, statusMetricsToken)
		if i < len(extra) {
			yaml += extra[i]
		}
		path := filepath.Join(t.TempDir(), "coordd.yaml")
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- run(ctx, []string{"--config", path, "--drain-delay", "1ms"}, os.Stderr) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
		})
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		hctx, hcancel := context.WithTimeout(ctx, 30*time.Second)
		_, err = healthpb.NewHealthClient(cc).Check(hctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		hcancel()
		if err != nil {
			t.Fatalf("instance %d not serving: %v", i, err)
		}
		f.addrs, f.metrics = append(f.addrs, addr), append(f.metrics, maddr)
		f.conns = append(f.conns, coorddv1.NewCoordinatorServiceClient(cc))
	}
	return f
}

// get fetches path through instance i as team-a.
func (f *statusFleet) get(ctx context.Context, i int, path string) error {
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+statusTenantToken)
	_, err := fleettest.Get(ctx, f.conns[i], &coorddv1.GetOrFetchRequest{Url: f.up.URL() + path})
	return err
}

// burst starts n calls of path on instance i; wait waits for them.
func (f *statusFleet) burst(t *testing.T, i, n int, path string) (wait func()) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := f.get(ctx, i, path); err != nil {
				t.Errorf("get %s on instance %d: %v", path, i, err)
			}
		})
	}
	return wg.Wait
}

// openFlaky opens flaky's shared breaker: two failures.
func (f *statusFleet) openFlaky(t *testing.T) {
	f.up.Set("/flaky/down", fakeupstream.Status(http.StatusServiceUnavailable))
	for _, p := range []string{"/flaky/down?1", "/flaky/down?2"} {
		if err := f.get(context.Background(), 0, p); err == nil {
			t.Fatalf("get %s: no error from a 503", p)
		}
	}
}

// fetch GETs path on instance i's metrics listener with the Authorization
// header auth ("": none).
func (f *statusFleet) fetch(t *testing.T, i int, path, auth string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+f.metrics[i]+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// status reads instance i's /status.json.
func (f *statusFleet) status(t *testing.T, i int) statuspage.View {
	t.Helper()
	code, _, b := f.fetch(t, i, statuspage.JSONPath, "Bearer "+statusMetricsToken)
	var v statuspage.View
	if code != http.StatusOK {
		t.Fatalf("status.json: %d %s", code, b)
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("status.json: %v: %s", err, b)
	}
	return v
}

// awaitStatus polls instance i's /status.json until ok accepts it: the
// calls it waits for run in goroutines, and their flights are what the
// page must show.
func (f *statusFleet) awaitStatus(t *testing.T, i int, what string, ok func(statuspage.View) bool) statuspage.View {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		v := f.status(t, i)
		if ok(v) {
			return v
		}
		if time.Now().After(deadline) {
			b, _ := json.MarshalIndent(v, "", "  ")
			t.Fatalf("instance %d never showed %s; last status.json:\n%s", i, what, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// flightOf returns v's flight of upstream docs with that many waiters.
func flightOf(v statuspage.View, role string, waiters int) (statuspage.FlightView, bool) {
	for _, fl := range v.Flights {
		if fl.Upstream == "docs" && fl.Role == role && fl.Waiters == waiters {
			return fl, true
		}
	}
	return statuspage.FlightView{}, false
}

func upstreamOf(v statuspage.View, name string) statuspage.UpstreamView {
	for _, u := range v.Upstreams {
		if u.Name == name {
			return u
		}
	}
	return statuspage.UpstreamView{}
}

// TestStatusJSON: during a held cold burst across two instances,
// /status.json shows the leader's flight on the first with its three
// waiters, the same key's flight following it on the second with its two,
// each upstream's shared breaker (flaky's open, with its next probe), Redis
// and, once the burst lands, the callers served per upstream request, the
// tenant's totals and the bytes the document takes in L1. The metrics listener wants its own token.
func TestStatusJSON(t *testing.T) {
	skipShort(t)
	f := startStatusFleet(t, "pprof: true\n")
	f.openFlaky(t)
	release := make(chan struct{})
	f.up.Set("/docs/held", fakeupstream.Behavior{Block: release})
	waitLeader := f.burst(t, 0, 3, "/docs/held")
	if err := f.up.WaitCount(context.Background(), "/docs/held", 1); err != nil {
		t.Fatal(err)
	}
	waitFollowers := f.burst(t, 1, 2, "/docs/held")

	lv := f.awaitStatus(t, 0, "a leading flight with 3 waiters", func(v statuspage.View) bool {
		_, ok := flightOf(v, "leader", 3)
		return ok
	})
	fv := f.awaitStatus(t, 1, "a following flight with 2 waiters", func(v statuspage.View) bool {
		_, ok := flightOf(v, "follower", 2)
		return ok
	})
	lf, _ := flightOf(lv, "leader", 3)
	ff, _ := flightOf(fv, "follower", 2)
	if lf.Stage != "fetching" || ff.Stage != "waiting_leader" || lf.ID != ff.ID || lf.Tenant != "team-a" || lf.Key != f.up.URL()+"/docs/held" {
		t.Errorf("leader %+v, follower %+v; want one id, fetching and waiting_leader, team-a's", lf, ff)
	}
	if lf.FollowersElsewhere != nil || lf.AgeSeconds < 0 {
		t.Errorf("leader's followers elsewhere = %v, age %v; want unknown (null) with Redis", lf.FollowersElsewhere, lf.AgeSeconds)
	}
	for i, v := range []statuspage.View{lv, fv} {
		if v.Redis.Mode != "redis" || !v.Redis.Healthy {
			t.Errorf("instance %d redis = %+v; want redis, healthy", i, v.Redis)
		}
		if u := upstreamOf(v, "docs"); u.Scope != "cluster" || u.Breaker != "closed" {
			t.Errorf("instance %d docs guard = %+v; want the cluster's, closed", i, u)
		}
		if u := upstreamOf(v, "flaky"); u.Scope != "cluster" || u.Breaker != "open" || u.NextProbeSeconds <= 0 || u.NextProbeSeconds > 600 {
			t.Errorf("instance %d flaky guard = %+v; want the cluster's open, a probe within 10m", i, u)
		}
	}

	close(release)
	waitLeader()
	waitFollowers()
	if n := f.up.Count("/docs/held"); n != 1 {
		t.Errorf("upstream requests for /docs/held = %d; want 1", n)
	}
	v := f.status(t, 0)
	if len(v.Flights) != 0 {
		t.Errorf("flights after the burst = %+v; want none", v.Flights)
	}
	// Instance 0: 2 failed calls of flaky, 3 served by one fetch of docs;
	// the 15-minute window, which no slow machine outlasts.
	w := v.Windows[2]
	if w.Span != "15m" || w.Calls != 5 || w.Errors != 2 || w.UpstreamRequests != 3 || w.ServedPerUpstream == nil || *w.ServedPerUpstream != 1 {
		t.Errorf("instance 0 15m window = %+v; want 5 calls, 2 errors, 3 fetches, 1 served per fetch", w)
	}
	// L1 holds /docs/held: what it takes, well inside what bigcache
	// reserved.
	if l := v.L1; l.Entries < 1 || l.DocumentBytes < fakeupstream.DefaultSize || l.DocumentBytes >= l.Bytes || l.Bytes > l.MaxBytes {
		t.Errorf("instance 0 l1 = %+v; want /docs/held's %d bytes and more in the documents, inside the memory reserved", l, fakeupstream.DefaultSize)
	}
	if len(v.Tenants) != 1 || v.Tenants[0] != (statuspage.TenantView{Tenant: "team-a", Calls: 5, UpstreamRequests: 3}) {
		t.Errorf("instance 0 tenants = %+v; want team-a: 5 calls, 3 fetches", v.Tenants)
	}
	if w := f.status(t, 1).Windows[2]; w.Calls != 2 || w.UpstreamRequests != 0 || w.ServedPerUpstream != nil {
		t.Errorf("instance 1 15m window = %+v; want 2 calls, no fetch, no ratio", w)
	}

	t.Run("auth", func(t *testing.T) {
		basic := func(tok string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte("ops:"+tok)) }
		for _, tt := range []struct {
			name, path, auth string
			want             int
		}{
			{"status without a token", statuspage.JSONPath, "", http.StatusUnauthorized},
			{"page without a token", statuspage.PagePath, "", http.StatusUnauthorized},
			{"metrics without a token", "/metrics", "", http.StatusUnauthorized},
			{"pprof without a token", "/debug/pprof/", "", http.StatusUnauthorized},
			{"a tenant's token", statuspage.JSONPath, "Bearer " + statusTenantToken, http.StatusUnauthorized},
			{"a wrong basic password", statuspage.PagePath, basic("nope-nope-nope-nope"), http.StatusUnauthorized},
			{"bearer", statuspage.JSONPath, "Bearer " + statusMetricsToken, http.StatusOK},
			{"basic, as a browser sends it", statuspage.PagePath, basic(statusMetricsToken), http.StatusOK},
			{"metrics", "/metrics", "Bearer " + statusMetricsToken, http.StatusOK},
		} {
			code, h, _ := f.fetch(t, 0, tt.path, tt.auth)
			if code != tt.want {
				t.Errorf("%s: %d; want %d", tt.name, code, tt.want)
			}
			if code == http.StatusUnauthorized && len(h.Values("WWW-Authenticate")) != 2 {
				t.Errorf("%s: WWW-Authenticate %q; want Basic and Bearer challenges", tt.name, h.Values("WWW-Authenticate"))
			}
		}
	})
	t.Run("pprof", func(t *testing.T) {
		if code, _, b := f.fetch(t, 0, "/debug/pprof/", "Bearer "+statusMetricsToken); code != http.StatusOK {
			t.Errorf("pprof on: /debug/pprof/ %d %.200s; want 200", code, b)
		}
		if code, _, _ := f.fetch(t, 0, "/debug/pprof/cmdline", "Bearer "+statusMetricsToken); code != http.StatusOK {
			t.Errorf("pprof on: /debug/pprof/cmdline %d; want 200", code)
		}
		if code, _, _ := f.fetch(t, 1, "/debug/pprof/", "Bearer "+statusMetricsToken); code != http.StatusNotFound {
			t.Errorf("pprof off: /debug/pprof/ %d; want 404", code)
		}
	})
}

// TestMetricsAuthConfigErrors: metrics_auth and pprof mistakes fail the
// start, naming the field, before anything listens.
func TestMetricsAuthConfigErrors(t *testing.T) {
	const tenant = "tenants:\n  - name: a\n    tokens: [tenant-token-0123456789]\n    upstreams: [\"*\"]\n"
	for _, tt := range []struct {
		name, yaml, want string
		args             []string
	}{
		{"tenants without metrics_auth", tenant + "metrics_listen: 127.0.0.1:0\n", "metrics_auth: required with tenants", nil},
		{"tenants without metrics_auth, flag", tenant, "metrics_auth: required with tenants", []string{"--metrics-listen", "127.0.0.1:0"}},
		{"no tokens", "metrics_auth: {}\n", "metrics_auth: no tokens", nil},
		{"short token", "metrics_auth:\n  tokens: [short]\n", "metrics_auth.tokens[0]: 5 bytes", nil},
		{"unset env", "metrics_auth:\n  tokens_env: COORDD_TEST_UNSET_METRICS_TOKENS\n", "metrics_auth.tokens_env", nil},
		{"pprof without a listener", "pprof: true\n", "pprof: needs metrics_listen", nil},
		{"pprof flag without a listener", "", "pprof: needs metrics_listen", []string{"--pprof"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "coordd.yaml")
			if err := os.WriteFile(path, []byte(tt.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			err := run(context.Background(), append([]string{"--config", path, "--listen", "127.0.0.1:0"}, tt.args...), os.Stderr)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("run error = %v; want one containing %q", err, tt.want)
			}
		})
	}
}
