package metrics_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/redistest"
)

// startInstances runs n coordd instances with metrics on one Redis, with
// the fake upstream "fake".
func startInstances(t *testing.T, up *fakeupstream.Upstream, n int) []*fleettest.Instance {
	t.Helper()
	rs := redistest.Start(t)
	cfg := coordinator.Config{Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: up.URL()}}}
	ins := make([]*fleettest.Instance, n)
	for i := range ins {
		ins[i] = fleettest.Start(t, fleettest.Options{RedisURL: rs.URL(), Config: cfg, Metrics: true})
	}
	return ins
}

// TestColdBurstMetrics: a cold burst across two instances, held at the
// upstream until every caller has joined, shows in /metrics as one
// upstream request, every other caller a follower, no timer wakeup, and
// per-source counts that add up to the calls.
func TestColdBurstMetrics(t *testing.T) {
	up := fakeupstream.New(t)
	release := make(chan struct{})
	up.Set("/doc", fakeupstream.Behavior{Block: release})
	ins := startInstances(t, up, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const perInstance = 8
	const calls = 2 * perInstance
	var streams []coorddv1.CoordinatorService_GetOrFetchClient
	for _, in := range ins {
		c := in.Dial(t)
		for range perInstance {
			st, err := c.GetOrFetch(ctx, &coorddv1.GetOrFetchRequest{Url: up.URL() + "/doc"})
			if err != nil {
				t.Fatal(err)
			}
			streams = append(streams, st)
		}
	}
	// Every caller receives a progress event once it has joined a flight
	// (joined, fetching, or waiting for the other instance's leader).
	for i, st := range streams {
		m, err := st.Recv()
		if err != nil || m.GetProgress() == nil {
			t.Fatalf("stream %d: first message %v, %v; want a progress event", i, m, err)
		}
	}
	if err := up.WaitCount(ctx, "/doc", 1); err != nil {
		t.Fatal(err)
	}
	close(release)
	var wg sync.WaitGroup
	errs := make(chan error, len(streams))
	for _, st := range streams {
		wg.Go(func() {
			for {
				_, err := st.Recv()
				if errors.Is(err, io.EOF) {
					return
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("stream: %v", err)
	}

	a, b := ins[0].Scrape(t), ins[1].Scrape(t)
	sum := func(name string, labels ...string) float64 {
		return a.Value(name, labels...) + b.Value(name, labels...)
	}
	var sources float64
	for _, s := range []string{"l1", "l2", "upstream", "stale", "error"} {
		sources += sum("coordd_requests_total", "source", s)
	}
	tests := []struct {
		name      string
		got, want float64
	}{
		{"upstream requests 200", sum("coordd_upstream_requests_total", "upstream", "fake", "status", "200"), 1},
		{"upstream requests", sum("coordd_upstream_requests_total"), 1},
		{"requests, all sources", sources, calls},
		{"requests from upstream (the leader's instance)", sum("coordd_requests_total", "source", "upstream"), perInstance},
		{"requests from l2 (the other instance)", sum("coordd_requests_total", "source", "l2"), perInstance},
		{"local followers", sum("coordd_followers_total", "scope", "local"), calls - 2},
		{"remote followers", sum("coordd_followers_total", "scope", "remote"), 1},
		{"follower lag observations", sum("coordd_follower_lag_seconds"), calls},
		{"lock acquired", sum("coordd_lock_attempts_total", "outcome", "acquired"), 1},
		{"lock contended", sum("coordd_lock_attempts_total", "outcome", "contended"), 1},
		{"timer wakeups a", a.Value("coordd_timer_wakeups_total"), 0},
		{"timer wakeups b", b.Value("coordd_timer_wakeups_total"), 0},
		{"redis up", sum("coordd_redis_up"), 2},
		{"redis errors", sum("coordd_redis_errors_total"), 0},
		{"cluster breaker closed", sum("coordd_breaker_state", "upstream", "fake", "scope", "cluster"), 0},
		{"cluster breaker series", float64(a.Count("coordd_breaker_state", "upstream", "fake", "scope", "cluster")), 1},
		{"instance breaker series", float64(a.Count("coordd_breaker_state", "upstream", "fake", "scope", "instance")), 1},
		{"gRPC GetOrFetch OK", sum("grpc_server_handled_total", "grpc_method", "GetOrFetch", "grpc_code", "OK"), calls},
		{"L1 entries", sum("coordd_l1_entries"), 2},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %v; want %v", tt.name, tt.got, tt.want)
		}
	}
	if got := a.Value("coordd_upstream_requests_total") + b.Value("coordd_upstream_requests_total"); got != float64(up.Count("/doc")) {
		t.Errorf("upstream requests counted %v; the upstream saw %d", got, up.Count("/doc"))
	}
}

// ruleFile is the shape of a Prometheus rule file.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// dashboard is the part of a Grafana dashboard that holds queries.
type dashboard struct {
	Title  string `json:"title"`
	Panels []struct {
		Title   string `json:"title"`
		Type    string `json:"type"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

var metricName = regexp.MustCompile(`\b(?:coordd|grpc_server)_[a-z0-9_]+`)

// TestAlertsAndDashboard parses deploy/'s alert rules and Grafana
// dashboard, and checks that every metric they name is exported by a real
// coordd, so that a typo or a renamed metric fails here, not in
// production.
func TestAlertsAndDashboard(t *testing.T) {
	var rules ruleFile
	b, err := os.ReadFile("../../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&rules); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	used := map[string][]string{} // metric → where
	var alerts []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			switch {
			case r.Alert == "" || r.Expr == "":
				t.Errorf("alerts.yml: group %s: a rule without alert or expr: %+v", g.Name, r)
			case r.Labels["severity"] == "":
				t.Errorf("alerts.yml: %s: no severity label", r.Alert)
			case r.Annotations["summary"] == "" || r.Annotations["description"] == "" || r.Annotations["runbook_url"] == "":
				t.Errorf("alerts.yml: %s: summary, description and runbook_url annotations are all needed", r.Alert)
			}
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("alerts.yml: %s: for: %v", r.Alert, err)
				}
			}
			names := metricName.FindAllString(r.Expr, -1)
			if len(names) == 0 && !strings.Contains(r.Expr, `up{job="coordd"}`) {
				t.Errorf("alerts.yml: %s: expr names no coordd metric: %s", r.Alert, r.Expr)
			}
			for _, n := range names {
				used[n] = append(used[n], "alert "+r.Alert)
			}
		}
	}
	for _, want := range []string{"CoorddBreakerOpen", "CoorddRedisDegraded", "CoorddTimerWakeups", "CoorddUpstreamTooManyRequests",
		"CoorddInstanceDown", "CoorddErrorRatio", "CoorddHighLatency", "CoorddTLSCertExpiringSoon"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("alerts.yml: no alert %s", want)
		}
	}

	var d dashboard
	b, err = os.ReadFile("../../deploy/grafana/coordd.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("coordd.json: %v", err)
	}
	queries := 0
	for _, p := range d.Panels {
		for _, q := range p.Targets {
			queries++
			for _, n := range metricName.FindAllString(q.Expr, -1) {
				used[n] = append(used[n], "panel "+p.Title)
			}
		}
	}
	for _, v := range d.Templating.List {
		for _, n := range metricName.FindAllString(v.Definition, -1) {
			used[n] = append(used[n], "variable")
		}
	}
	if queries == 0 {
		t.Fatalf("coordd.json: no queries")
	}

	// A real coordd that served one call, so that label sets known only
	// once seen (an upstream's status codes) exist.
	up := fakeupstream.New(t)
	in := startInstances(t, up, 1)[0]
	if _, err := fleettest.Get(context.Background(), in.Dial(t), &coorddv1.GetOrFetchRequest{Url: up.URL() + "/doc"}); err != nil {
		t.Fatal(err)
	}
	s := in.Scrape(t)
	for n, where := range used {
		if n == "coordd_tls_cert_not_after_seconds" {
			continue // exported only with tls; cmd/coordd's TestTLSCertNotAfterMetric scrapes it
		}
		if !s.Has(n) {
			t.Errorf("%s, used by %v, is not exported", n, slices.Compact(where))
		}
	}
	t.Logf("%d metrics used by %d alerts and %d dashboard queries, all exported", len(used), len(alerts), queries)
}

// TestProtectionMetrics: retries, a breaker opening and then rejecting, a
// rate-limit refusal and a lock lease extended by its watchdog show in
// /metrics.
func TestProtectionMetrics(t *testing.T) {
	failing, paced := fakeupstream.New(t), fakeupstream.New(t)
	failing.Set("/down", fakeupstream.Status(503))
	release := make(chan struct{})
	failing.Set("/slow", fakeupstream.Behavior{Block: release})
	rs := redistest.Start(t)
	in := fleettest.Start(t, fleettest.Options{RedisURL: rs.URL(), Metrics: true, Config: coordinator.Config{
		LockTTL: time.Second, // the watchdog extends it every 333ms; a busy machine must not starve it past the lease
		Upstreams: []coordinator.Upstream{
			{Name: "failing", BaseURL: failing.URL(), Protection: coordinator.Protection{
				RateLimit: -1,
				Retry:     coordinator.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
				Breaker:   coordinator.BreakerPolicy{FailureThreshold: 2, OpenFor: time.Hour},
			}},
			{Name: "paced", BaseURL: paced.URL(), Protection: coordinator.Protection{RateLimit: 1, MaxWait: time.Millisecond}},
		},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := in.Dial(t)
	get := func(url string) error {
		_, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: url})
		return err
	}
	// A fetch slower than the lease: the watchdog extends it.
	slow := make(chan error, 1)
	go func() { slow <- get(failing.URL() + "/slow") }()
	for in.Scrape(t).Value("coordd_lock_extensions_total", "result", "ok") == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("no lease extension")
		case <-time.After(20 * time.Millisecond):
		}
	}
	close(release)
	if err := <-slow; err != nil {
		t.Fatalf("get /slow: %v", err)
	}
	// Two failed attempts (the first and its retry) open the breaker.
	if err := get(failing.URL() + "/down"); err == nil {
		t.Fatalf("get /down: no error; want the 503")
	}
	if err := get(failing.URL() + "/down2"); err == nil {
		t.Fatalf("get /down2: no error; want breaker open")
	}
	if err := get(paced.URL() + "/a"); err != nil {
		t.Fatal(err)
	}
	if err := get(paced.URL() + "/b"); err == nil {
		t.Fatalf("get /b: no error; want rate limited")
	}

	s := in.Scrape(t)
	tests := []struct {
		name      string
		got, want float64
	}{
		{"503 attempts", s.Value("coordd_upstream_requests_total", "upstream", "failing", "status", "503"), 2},
		{"retries", s.Value("coordd_upstream_retries_total", "upstream", "failing"), 1},
		{"breaker opened", s.Value("coordd_breaker_transitions_total", "upstream", "failing", "scope", "cluster", "from", "closed", "to", "open"), 1},
		{"breaker state", s.Value("coordd_breaker_state", "upstream", "failing", "scope", "cluster"), 2},
		{"breaker rejections", s.Value("coordd_breaker_rejected_total", "upstream", "failing"), 1},
		{"paced 200s", s.Value("coordd_upstream_requests_total", "upstream", "paced", "status", "200"), 1},
		{"rate-limit refusals", s.Value("coordd_ratelimit_refused_total", "upstream", "paced"), 1},
		{"requests failed", s.Value("coordd_requests_total", "source", "error"), 3},
		{"lock acquired", s.Value("coordd_lock_attempts_total", "outcome", "acquired"), 5},
		{"timer wakeups", s.Value("coordd_timer_wakeups_total"), 0},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %v; want %v", tt.name, tt.got, tt.want)
		}
	}
}
