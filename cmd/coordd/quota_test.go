package main

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/server/statuspage"
)

// TestClearQuotas: a consistent quota spent for three hours, announced to
// a fetch without a credential, holds the upstream on both instances, as
// it should; the status page shows it with its reset, and so do the
// metrics. An operator's POST /status/quotas/clear?upstream=docs on one
// instance ends it for both without a restart: the next cold key, on the
// other instance, reaches the upstream. The call is refused without the
// metrics token, across origins, as a GET, and for an unknown upstream.
func TestClearQuotas(t *testing.T) {
	skipShort(t)
	f := startStatusFleet(t)
	reset := time.Now().Add(3 * time.Hour).Unix()
	f.up.Set("/docs/spent", fakeupstream.Status(http.StatusOK).
		WithHeader("X-RateLimit-Limit", "60").WithHeader("X-RateLimit-Remaining", "0").
		WithHeader("X-RateLimit-Reset", strconv.FormatInt(reset, 10)).WithHeader("X-RateLimit-Resource", "core"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := f.get(ctx, 0, "/docs/spent"); err != nil {
		t.Fatal(err)
	}
	if err := f.get(ctx, 1, "/docs/cold-1"); err == nil || f.up.Count("/docs/cold-1") != 0 {
		t.Fatalf("a cold key while the quota is spent for 3h: %v, %d requests; want it refused, none sent", err, f.up.Count("/docs/cold-1"))
	}
	v := f.status(t, 1)
	var seen bool
	for _, q := range v.Quotas {
		if q.Upstream == "docs" && q.Limit == 60 && q.Remaining == 0 && q.ResetSeconds > 2.9*3600 {
			seen = true
		}
	}
	if up := upstreamOf(v, "docs"); !seen || up.BackoffSeconds < 2.9*3600 {
		t.Errorf("status of instance 1: quotas %+v, backoff %vs; want the spent quota, reset and backoff in 3h", v.Quotas, up.BackoffSeconds)
	}
	_, _, metrics := f.fetch(t, 0, "/metrics", "Bearer "+statusMetricsToken)
	var resetAt float64
	for line := range strings.Lines(string(metrics)) {
		if v, ok := strings.CutPrefix(line, `coordd_upstream_quota_reset_timestamp_seconds{partition="core",upstream="docs"} `); ok {
			resetAt, _ = strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	if resetAt != float64(reset) {
		t.Errorf("coordd_upstream_quota_reset_timestamp_seconds %v; want %d", resetAt, reset)
	}

	post := func(query string, header ...string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, "http://"+f.metrics[0]+"/status/quotas/clear"+query, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	auth := "Bearer " + statusMetricsToken
	for _, c := range []struct {
		name   string
		query  string
		header []string
		want   int
	}{
		{"no token", "?upstream=docs", nil, http.StatusUnauthorized},
		{"another site", "?upstream=docs", []string{"Authorization", auth, "Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"}, http.StatusForbidden},
		{"no upstream", "", []string{"Authorization", auth}, http.StatusBadRequest},
		{"unknown upstream", "?upstream=nope", []string{"Authorization", auth}, http.StatusNotFound},
	} {
		if code, body := post(c.query, c.header...); code != c.want {
			t.Errorf("%s: %d %s; want %d", c.name, code, body, c.want)
		}
	}
	code, _, _ := f.fetch(t, 0, "/status/quotas/clear?upstream=docs", auth)
	if code != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d; want 405", code)
	}
	if err := f.get(ctx, 1, "/docs/cold-2"); err == nil {
		t.Fatal("the refused calls cleared the quota")
	}
	if code, body := post("?upstream=docs", "Authorization", auth); code != http.StatusOK || !strings.Contains(body, `"cleared":"fleet"`) {
		t.Fatalf("clear: %d %s; want 200, cleared for the fleet", code, body)
	}
	if err := f.get(ctx, 1, "/docs/cold-3"); err != nil || f.up.Count("/docs/cold-3") != 1 {
		t.Errorf("a cold key on the other instance after the clear: %v, %d requests; want it fetched", err, f.up.Count("/docs/cold-3"))
	}
	v = f.awaitStatus(t, 1, "no quota left", func(v statuspage.View) bool { return len(v.Quotas) == 0 })
	if up := upstreamOf(v, "docs"); up.BackoffSeconds != 0 {
		t.Errorf("backoff %vs after the clear; want none", up.BackoffSeconds)
	}
}
