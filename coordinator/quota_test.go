package coordinator_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/testing/enginetest"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/redistest"
)

// TestInconsistentQuotaStopsNothing: one answer whose RateLimit fields
// contradict each other (a limit of 0 with one request remaining, reset
// in 23h53m, issue 39) teaches two instances on one Redis nothing: every
// cold key after it, on both, reaches the upstream at once (before, every
// one was refused with "next slot in 23h53m"). The answer is counted in
// coordd_upstream_quota_ignored_total and logged once a minute at most,
// naming the header; a consistent answer after it is learned as it says.
func TestInconsistentQuotaStopsNothing(t *testing.T) {
	u := fakeupstream.New(t)
	rs := redistest.Start(t)
	for _, p := range []string{"/garbage", "/garbage-again"} {
		u.Set(p, fakeupstream.Status(200).WithHeader("RateLimit-Policy", `"default";q=0;w=86400`).WithHeader("RateLimit", `"default";r=1;t=86000`))
	}
	u.Set("/sane", fakeupstream.Status(200).WithHeader("RateLimit-Policy", `"default";q=5000;w=3600`).WithHeader("RateLimit", `"default";r=4000;t=1800`))
	logs := &enginetest.SyncBuffer{}
	cfg := enginetest.Protected(u, coordinator.Protection{MaxWait: 2 * time.Second}, logs)
	a := fleettest.Start(t, fleettest.Options{RedisURL: rs.URL(), Config: cfg, Metrics: true})
	b := fleettest.Start(t, fleettest.Options{RedisURL: rs.URL(), Config: cfg, Metrics: true})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, p := range []string{"/garbage", "/garbage-again"} {
		if _, err := enginetest.Get(ctx, a.Coordinator, u.URL()+p, "", coordinator.GetOptions{}); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
	}
	for i := range 10 {
		in := []*fleettest.Instance{a, b}[i%2]
		p := fmt.Sprintf("/cold/%d", i)
		if _, err := enginetest.Get(ctx, in.Coordinator, u.URL()+p, "", coordinator.GetOptions{}); err != nil || u.Count(p) != 1 {
			t.Errorf("cold key %d after an inconsistent quota: %v, %d upstream requests; want it fetched", i, err, u.Count(p))
		}
	}
	sa := a.Scrape(t)
	if n := sa.Value("coordd_upstream_quota_ignored_total", "upstream", "fake", "header", "RateLimit"); n != 2 {
		t.Errorf("coordd_upstream_quota_ignored_total = %v; want 2", n)
	}
	if rem, limit := sa.Value("coordd_upstream_quota_remaining", "upstream", "fake"), sa.Value("coordd_upstream_quota_limit", "upstream", "fake"); rem != 0 || limit != 0 {
		t.Errorf("quota gauges remaining %v, limit %v after garbage alone; want nothing learned", rem, limit)
	}
	warns := 0
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, "ignoring the quota") {
			warns++
			if !strings.Contains(line, "level=WARN") || !strings.Contains(line, "RateLimit: limit 0") || !strings.Contains(line, "upstream=fake") {
				t.Errorf("the log %q; want a WARN naming the upstream, the header and why", line)
			}
		}
	}
	if warns != 1 {
		t.Errorf("%d logs of the ignored quota for two answers; want 1 (once a minute)", warns)
	}

	start := time.Now()
	if _, err := enginetest.Get(ctx, b.Coordinator, u.URL()+"/sane", "", coordinator.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	sb := b.Scrape(t)
	rem, limit := sb.Value("coordd_upstream_quota_remaining", "upstream", "fake"), sb.Value("coordd_upstream_quota_limit", "upstream", "fake")
	reset := time.UnixMilli(int64(sb.Value("coordd_upstream_quota_reset_timestamp_seconds", "upstream", "fake") * 1000))
	if rem != 4000 || limit != 5000 || reset.Before(start.Add(29*time.Minute)) || reset.After(time.Now().Add(31*time.Minute)) {
		t.Errorf("after a consistent answer: remaining %v, limit %v, reset at %v (in %v); want 4000 of 5000, reset in 30m", rem, limit, reset, time.Until(reset))
	}
}
