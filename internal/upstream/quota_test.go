package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestParseQuota(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	epoch := func(d time.Duration) string { return strconv.FormatInt(now.Add(d).Unix(), 10) }
	tests := []struct {
		name string
		h    map[string]string
		want Quota
		ok   bool
	}{
		{"github", map[string]string{"X-RateLimit-Limit": "5000", "X-RateLimit-Remaining": "4999", "X-RateLimit-Reset": epoch(time.Hour), "X-RateLimit-Resource": "core"},
			Quota{Limit: 5000, Remaining: 4999, Reset: time.Hour, Partition: "core", Source: "X-RateLimit-Remaining"}, true},
		{"reset in seconds", map[string]string{"X-RateLimit-Limit": "100", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "30"},
			Quota{Limit: 100, Remaining: 0, Reset: 30 * time.Second, Source: "X-RateLimit-Remaining"}, true},
		{"draft", map[string]string{"RateLimit": `"default";r=50;t=30`, "RateLimit-Policy": `"burst";q=10;w=1, "default";q=100;w=60`},
			Quota{Limit: 100, Remaining: 50, Reset: 30 * time.Second, Source: "RateLimit"}, true},
		{"draft wins", map[string]string{"RateLimit": `"search";r=5;t=10`, "RateLimit-Policy": `"search";q=30;w=60`, "X-RateLimit-Limit": "100", "X-RateLimit-Remaining": "99", "X-RateLimit-Reset": "60"},
			Quota{Limit: 30, Remaining: 5, Reset: 10 * time.Second, Partition: "search", Source: "RateLimit"}, true},
		{"draft partition key", map[string]string{"RateLimit": `"default";r=1;t=5;pk=:dXNlcjE=:`, "RateLimit-Policy": `"default";q=10`},
			Quota{Limit: 10, Remaining: 1, Reset: 5 * time.Second, Partition: "dXNlcjE=", Source: "RateLimit"}, true},
		{"draft spent for a day", map[string]string{"RateLimit": `"default";r=0;t=86400`, "RateLimit-Policy": `"default";q=5000;w=86400`},
			Quota{Limit: 5000, Remaining: 0, Reset: 24 * time.Hour, Source: "RateLimit"}, true},
		{"none", map[string]string{}, Quota{}, false},
		{"a limit alone", map[string]string{"X-RateLimit-Limit": "100"}, Quota{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tt.h {
				h.Set(k, v)
			}
			got, ok, garbage := readQuota(h, now)
			if ok != tt.ok || got != tt.want || garbage != "" {
				t.Errorf("readQuota = %+v, %v, %q; want %+v, %v, no garbage", got, ok, garbage, tt.want, tt.ok)
			}
		})
	}
}

// garbageCase is one case of testdata/quota-garbage: headers that are
// garbage, and the numbers a naive reading takes from them (for the
// shared store's script, internal/store).
type garbageCase struct {
	Name    string            `json:"name"`
	Headers map[string]string `json:"headers"`
}

// garbageHeaders reads testdata/quota-garbage, X-RateLimit-Reset's
// "+N" and "-N" made Unix times N seconds from now, "ms+N" in
// milliseconds.
func garbageHeaders(t testing.TB, now time.Time) []garbageCase {
	t.Helper()
	b, err := os.ReadFile("../../testdata/quota-garbage/cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var corpus struct{ Cases []garbageCase }
	if err := json.Unmarshal(b, &corpus); err != nil {
		t.Fatal(err)
	}
	for _, c := range corpus.Cases {
		v := c.Headers["X-RateLimit-Reset"]
		delta, ms := strings.CutPrefix(v, "ms")
		if delta != "" && (delta[0] == '+' || delta[0] == '-') {
			n, err := strconv.ParseInt(delta, 10, 64)
			if err != nil {
				t.Fatalf("%s: reset %q", c.Name, v)
			}
			at := now.Add(time.Duration(n) * time.Second)
			if ms {
				c.Headers["X-RateLimit-Reset"] = strconv.FormatInt(at.UnixMilli(), 10)
			} else {
				c.Headers["X-RateLimit-Reset"] = strconv.FormatInt(at.Unix(), 10)
			}
		}
	}
	return corpus.Cases
}

// TestGarbageQuotaIgnored: every answer of the corpus the docs call
// garbage teaches nothing, and says which header and why.
func TestGarbageQuotaIgnored(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, c := range garbageHeaders(t, now) {
		h := http.Header{}
		for k, v := range c.Headers {
			h.Set(k, v)
		}
		q, ok, garbage := readQuota(h, now)
		if ok || garbage == "" {
			t.Errorf("%s: readQuota = %+v, %v, %q; want nothing learned, and why", c.Name, q, ok, garbage)
		}
	}
}

// FuzzParseQuota: whatever the headers hold, a quota believed is one
// consistent (limit, remaining, reset): a limit of at least 1, a
// remaining within it, a reset within a day; and an answer that says a
// quota is either believed or garbage, with a reason. The seeds are the
// garbage corpus.
func FuzzParseQuota(f *testing.F) {
	now := time.Unix(1_800_000_000, 0)
	f.Add("5000", "4999", "1800003600", `"default";r=50;t=30`, `"default";q=100;w=60`)
	f.Add("-1", "x", "99999999999999999999", `;;;=`, `"";q=`)
	for _, c := range garbageHeaders(f, now) {
		f.Add(c.Headers["X-RateLimit-Limit"], c.Headers["X-RateLimit-Remaining"], c.Headers["X-RateLimit-Reset"], c.Headers["RateLimit"], c.Headers["RateLimit-Policy"])
	}
	f.Fuzz(func(t *testing.T, limit, remaining, reset, rl, policy string) {
		h := http.Header{"X-Ratelimit-Limit": {limit}, "X-Ratelimit-Remaining": {remaining}, "X-Ratelimit-Reset": {reset}}
		if rl != "" {
			h.Set("RateLimit", rl)
			h.Set("RateLimit-Policy", policy)
		}
		q, ok, garbage := readQuota(h, now)
		if ok == (garbage != "") && (ok || strings.TrimSpace(remaining) != "" || rl != "") {
			t.Fatalf("readQuota = %+v, %v, %q: an answer that says a quota is believed or garbage", q, ok, garbage)
		}
		if !ok {
			return
		}
		if q.Limit < 1 || q.Remaining < 0 || q.Remaining > q.Limit || q.Reset < 0 || q.Reset > maxQuotaReset {
			t.Fatalf("believed %+v", q)
		}
	})
}

// TestRateLimited403: a 403 that says the quota is spent is backed off
// until its reset by the next fetch, which fails fast without reaching the
// upstream, and it counts no breaker failure (a breaker opening on one
// failure stays closed); a 403 that says nothing of a quota is a document.
func TestRateLimited403(t *testing.T) {
	var hits atomic.Int32
	reset := time.Now().Add(30 * time.Second).Unix()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.URL.Path == "/forbidden" {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		w.Header().Set("X-RateLimit-Limit", "60")
		w.Header().Set("X-RateLimit-Remaining", "0")
		w.Header().Set("X-RateLimit-Reset", strconv.FormatInt(reset, 10))
		w.WriteHeader(http.StatusForbidden)
	}))
	defer srv.Close()
	up := Config{Name: "api", BaseURL: srv.URL}
	up.Protection.Breaker.FailureThreshold = 1
	up.Protection.MaxWait = 100 * time.Millisecond
	SetDefaults(&up)
	if err := Validate(&up, "upstreams[0]"); err != nil {
		t.Fatal(err)
	}
	cl := NewClient(&up, Options{})
	ctx := context.Background()
	resp, err := cl.Fetch(ctx, FetchRequest{URL: srv.URL + "/forbidden"}, nil)
	if err != nil || resp.StatusCode != http.StatusForbidden || RateLimited(resp) || cl.Backoff(resp) != 0 {
		t.Fatalf("a plain 403: %v, %v; want a document with no backoff", resp, err)
	}
	resp, err = cl.Fetch(ctx, FetchRequest{URL: srv.URL + "/user"}, nil)
	if err != nil || !RateLimited(resp) {
		t.Fatalf("first fetch: %v, %v; want the rate-limited 403", resp, err)
	}
	if b := cl.Backoff(resp); b < 25*time.Second || b > 31*time.Second {
		t.Errorf("backoff %v; want until the reset, about 30s", b)
	}
	if shared, local := cl.Breakers(ctx); local != "closed" {
		t.Errorf("breaker %q/%q after a rate-limited 403; want closed", shared, local)
	}
	_, err = cl.Fetch(ctx, FetchRequest{URL: srv.URL + "/user"}, nil)
	if !errors.Is(err, ErrRateLimited) || RetryAfter(err) < 25*time.Second {
		t.Fatalf("second fetch: %v; want ErrRateLimited with the reset as its retry-after", err)
	}
	if n := hits.Load(); n != 2 {
		t.Errorf("upstream requests = %d; want 2 (the second fetch backed off)", n)
	}
}

// TestSpentQuotaOfACredential: a credential's spent quota (a rate-limited
// 403 answering a fetch that carried it) holds back no other fetch of the
// upstream: another credential's, or one without, reaches the upstream at
// once. Its own callers still get the wait until the reset (Backoff).
func TestSpentQuotaOfACredential(t *testing.T) {
	var hits atomic.Int32
	reset := time.Now().Add(30 * time.Second).Unix()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("X-RateLimit-Limit", "60")
		if r.Header.Get("Authorization") == "Bearer spent" {
			w.Header().Set("X-RateLimit-Remaining", "0")
			w.Header().Set("X-RateLimit-Reset", strconv.FormatInt(reset, 10))
			w.WriteHeader(http.StatusForbidden)
			return
		}
		w.Header().Set("X-RateLimit-Remaining", "10")
		w.Header().Set("X-RateLimit-Reset", strconv.FormatInt(reset, 10))
	}))
	defer srv.Close()
	up := Config{Name: "api", BaseURL: srv.URL}
	up.Protection.MaxWait = 100 * time.Millisecond
	SetDefaults(&up)
	if err := Validate(&up, "upstreams[0]"); err != nil {
		t.Fatal(err)
	}
	cl := NewClient(&up, Options{})
	ctx := context.Background()
	spent := FetchRequest{URL: srv.URL + "/user", Scoped: true, QuotaScope: "s/spent", Header: http.Header{"Authorization": {"Bearer spent"}}}
	resp, err := cl.Fetch(ctx, spent, nil)
	if err != nil || !RateLimited(resp) || cl.Backoff(resp) < 25*time.Second {
		t.Fatalf("the spent credential: %v, %v; want the rate-limited 403 with the reset as its wait", resp, err)
	}
	for name, fr := range map[string]FetchRequest{
		"another credential": {URL: srv.URL + "/user", Scoped: true, QuotaScope: "s/fresh", Header: http.Header{"Authorization": {"Bearer fresh"}}},
		"no credential":      {URL: srv.URL + "/user"},
	} {
		before := hits.Load()
		resp, err := cl.Fetch(ctx, fr, nil)
		if err != nil || resp.StatusCode != http.StatusOK || hits.Load() != before+1 {
			t.Errorf("%s after a spent credential: %v, %v, %d requests; want it answered at once", name, resp, err, hits.Load()-before)
		}
	}
}
