package statuspage_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/upstream"
	"github.com/coordd/coordd/server/statuspage"
)

// fixed is a Source of one Status.
type fixed coordinator.Status

func (f fixed) Status(context.Context) coordinator.Status { return coordinator.Status(f) }

// TestPageAndJSON serves a Status with a hostile key: the page escapes it,
// status.json carries the same data with nulls where a figure is unknown,
// and both forbid loading anything from elsewhere. (The real thing, a
// coordd under a cold burst in a browser, is cmd/coordd's
// TestStatusPageBrowser and TestStatusJSON.)
func TestPageAndJSON(t *testing.T) {
	key := `<script>alert(1)</script>` + strings.Repeat("x", 200)
	s := coordinator.Status{
		Now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Flights: []coordinator.FlightStatus{{
			ID: "0123abcd", Key: key, Upstream: "docs", Role: "leader", Stage: "fetching",
			Age: 1500 * time.Millisecond, Waiters: 7, FollowersElsewhere: -1,
		}},
		Upstreams: []coordinator.UpstreamStatus{{Name: "docs", Guard: coordinator.GuardStatus{Scope: "cluster", Breaker: "open", NextProbe: 150 * time.Second, FreeSlots: -1}}},
		Redis:     coordinator.RedisStatus{Mode: "cluster", Healthy: true},
		Windows:   []coordinator.WindowStatus{{Span: time.Minute, Counts: coordinator.Counts{Calls: 10, L1: 4}}},
		Tenants:   []coordinator.TenantStatus{{Tenant: "", Calls: 10}},
	}
	srv := httptest.NewServer(statuspage.Handler(fixed(s), "test-instance", slog.New(slog.DiscardHandler)))
	defer srv.Close()
	get := func(path string) (*http.Response, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}

	resp, page := get(statuspage.PagePath)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("page: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if strings.Contains(page, "<script>alert(1)") || !strings.Contains(page, "&lt;script&gt;alert(1)") {
		t.Errorf("the key is not escaped in the page")
	}
	for _, want := range []string{"test-instance", `data-id="0123abcd"`, `<td class="num waiters">7</td>`, ">open<", "2m30s", "(default)", "cluster", "0.40"} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
		t.Errorf("Content-Security-Policy = %q; want nothing from elsewhere", csp)
	}

	resp, body := get(statuspage.JSONPath)
	if resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("status.json Content-Type = %q", resp.Header.Get("Content-Type"))
	}
	var v statuspage.View
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatal(err)
	}
	f := v.Flights[0]
	if f.Waiters != 7 || f.FollowersElsewhere != nil || f.AgeSeconds != 1.5 || len([]rune(f.Key)) != 96 || !strings.HasPrefix(f.Key, "<script>") {
		t.Errorf("flight = %+v; want 7 waiters, followers unknown, 1.5s, the key shortened to 96 runes", f)
	}
	u := v.Upstreams[0]
	if u.Breaker != "open" || u.NextProbeSeconds != 150 || u.FreeSlots != nil {
		t.Errorf("upstream = %+v; want open, probe in 150s, no rate limit (free slots null)", u)
	}
	if w := v.Windows[0]; w.Span != "1m" || w.ServedPerUpstream != nil || w.L1HitRatio == nil || *w.L1HitRatio != 0.4 {
		t.Errorf("window = %+v; want 1m, no ratio without fetches, 0.4 from L1", w)
	}
	for _, null := range []string{`"followers_elsewhere": null`, `"free_slots": null`, `"served_per_upstream_request": null`} {
		if !strings.Contains(body, null) {
			t.Errorf("status.json lacks %s", null)
		}
	}
	if resp, _ := get("/status/other"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("/status/other: %d; want 404", resp.StatusCode)
	}
}

// TestL1AndRatiosExplained: five small documents in an L1 that reserved
// 16 MiB of 256 MiB show as what they take beside the memory reserved, in
// the page and in status.json; and a cold burst's figures (100 callers,
// 3 upstream requests, none from L1) come with the ratios named and
// explained, in a tooltip on each and a line under the table, so that a
// hit ratio of 0.00 beside 33.33 served per upstream request reads right.
func TestL1AndRatiosExplained(t *testing.T) {
	s := coordinator.Status{
		Now:     time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Redis:   coordinator.RedisStatus{Mode: "single-node"},
		L1:      coordinator.L1Stats{Entries: 5, DocumentBytes: 5 * 1100, Bytes: 16 << 20, MaxBytes: 256 << 20},
		Windows: []coordinator.WindowStatus{{Span: time.Minute, Counts: coordinator.Counts{Calls: 100, Upstream: 3}}},
	}
	srv := httptest.NewServer(statuspage.Handler(fixed(s), "test-instance", slog.New(slog.DiscardHandler)))
	defer srv.Close()
	get := func(path string) string {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}

	page := get(statuspage.PagePath)
	for _, want := range []string{
		// What the documents take, beside what bigcache reserved.
		`<dd id="l1-entries">5</dd>`,
		`<dd id="l1-document-bytes">5.4 KiB</dd>`,
		`>memory reserved</dt><dd id="l1-bytes">16 MiB of 256 MiB</dd>`,
		// The ratios, named for what they count, each with a tooltip.
		`<th class="num" title="(calls − errors) ÷ upstream requests`,
		`>callers served per upstream request</th>`,
		`<th class="num" title="L1 hits ÷ calls`,
		`>share answered from L1</th>`,
		`<td class="num">33.33</td><td class="num">0.00</td>`,
		// And a line under the table saying what each means.
		`<p class="note" id="ratios-explained">`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	if i := strings.Index(page, `id="ratios-explained"`); i < 0 || !strings.Contains(page[i:], "joined") || !strings.Contains(page[i:], "cold burst") {
		t.Errorf("the line under the windows does not say why a cold burst shows few L1 hits beside many callers per request")
	}
	for _, title := range regexp.MustCompile(`title="([^"]*)"`).FindAllStringSubmatch(page, -1) {
		if len(title[1]) < 40 {
			t.Errorf("tooltip %q says too little", title[1])
		}
	}

	var v statuspage.View
	body := get(statuspage.JSONPath)
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatal(err)
	}
	if v.L1 != (statuspage.L1View{Bytes: 16 << 20, MaxBytes: 256 << 20, DocumentBytes: 5500, Entries: 5}) || !strings.Contains(body, `"document_bytes": 5500`) {
		t.Errorf("status.json l1 = %+v; want 5 documents of 5500 bytes in 16 MiB of 256 MiB, as document_bytes", v.L1)
	}
}

// TestSlotsInFlightShown: an upstream's slots in flight are on the page
// and in status.json, beside the cap; an upstream without one says so.
func TestSlotsInFlightShown(t *testing.T) {
	s := coordinator.Status{Upstreams: []coordinator.UpstreamStatus{
		{Name: "github", Guard: coordinator.GuardStatus{Scope: "cluster", Breaker: "closed", MaxInFlight: 100,
			InFlight: upstream.InFlightCount{Held: 7, Busiest: 5, Scopes: 2}}},
		{Name: "mdn", Guard: coordinator.GuardStatus{Scope: "cluster", Breaker: "closed"}},
	}}
	v := statuspage.NewView(s, "test-instance")
	if u := v.Upstreams[0]; u.InFlight != 7 || u.InFlightBusiest != 5 || u.InFlightScopes != 2 || u.MaxInFlight != 100 {
		t.Errorf("github = %+v; want 7 in flight, 5 of 100 in the busiest of 2 scopes", u)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"in_flight":7`, `"max_in_flight":100`, `"in_flight":0`, `"max_in_flight":0`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("status.json lacks %s", want)
		}
	}
	srv := httptest.NewServer(statuspage.Handler(fixed(s), "test-instance", slog.New(slog.DiscardHandler)))
	defer srv.Close()
	resp, err := http.Get(srv.URL + statuspage.PagePath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	page, _ := io.ReadAll(resp.Body)
	for _, want := range []string{">slots in flight<", "7 <span", "busiest scope 5 of 100; 2 scopes", ">no cap<"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("page lacks %q", want)
		}
	}
}
