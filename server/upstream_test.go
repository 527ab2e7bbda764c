package server_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/testclock"
)

// TestUpstreamHeadersSanitized: an upstream header coordd stores and
// returns in the metadata (ETag, Content-Type, Last-Modified) that is not
// valid UTF-8, holds a control character or is longer than 1 KiB is
// dropped; the document is served to the first caller, from L1 and from
// L2, and the other headers are kept.
func TestUpstreamHeadersSanitized(t *testing.T) {
	cl := startCluster(t, 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const (
		ctype   = "text/html; charset=utf-8"
		lastMod = "Wed, 21 Oct 2026 07:28:00 GMT"
	)
	longTag := `"` + strings.Repeat("a", 1000) + `"`
	tests := []struct {
		path                   string
		header                 string // the header set to value
		value                  string
		wantCType, wantLastMod string
		wantETag               string // "" for the default, checked against the upstream's
		wantNoETag             bool
	}{
		{path: "/etag-latin1", header: "ETag", value: "\"caf\xe9\"", wantCType: ctype, wantLastMod: lastMod, wantNoETag: true},
		{path: "/etag-control", header: "ETag", value: "\"a\u0085b\"", wantCType: ctype, wantLastMod: lastMod, wantNoETag: true}, // NEL, a C1 control
		{path: "/etag-huge", header: "ETag", value: `"` + strings.Repeat("x", 5<<20) + `"`, wantCType: ctype, wantLastMod: lastMod, wantNoETag: true},
		{path: "/etag-long-ok", header: "ETag", value: longTag, wantCType: ctype, wantLastMod: lastMod, wantETag: longTag},
		{path: "/ctype", header: "Content-Type", value: "text/html; charset=\xff\xfe", wantLastMod: lastMod},
		{path: "/ctype-huge", header: "Content-Type", value: "text/html; x=" + strings.Repeat("y", 2000), wantLastMod: lastMod},
		{path: "/lastmod", header: "Last-Modified", value: "Wed, 21 Oct 2026 07:28:00 \x80MT", wantCType: ctype},
		{path: "/lastmod-utf8", header: "Last-Modified", value: "Mié, 21 Oct 2026", wantCType: ctype, wantLastMod: "Mié, 21 Oct 2026"},
	}
	for _, tt := range tests {
		t.Run(strings.TrimPrefix(tt.path, "/"), func(t *testing.T) {
			b := fakeupstream.Behavior{}.WithHeader("Last-Modified", lastMod)
			b.Header.Set(tt.header, tt.value)
			cl.up.Set(tt.path, b)
			wantETag := tt.wantETag
			if wantETag == "" && !tt.wantNoETag {
				wantETag = cl.up.ETag(tt.path)
			}
			for i, step := range []struct {
				instance int
				source   coorddv1.Source
			}{{0, coorddv1.Source_SOURCE_UPSTREAM}, {0, coorddv1.Source_SOURCE_L1}, {1, coorddv1.Source_SOURCE_L2}} {
				d, err := fleettest.Get(ctx, cl.clients[step.instance], &coorddv1.GetOrFetchRequest{Url: cl.url(tt.path)})
				if err != nil {
					t.Fatalf("call %d (instance %d): %v", i+1, step.instance, err)
				}
				m := d.Meta
				if !bytes.Equal(d.Body, cl.up.Body(tt.path)) || m.GetStatusCode() != 200 || m.GetSource() != step.source {
					t.Fatalf("call %d: status %d, source %v, %d bytes; want 200 from %v with the body", i+1, m.GetStatusCode(), m.GetSource(), len(d.Body), step.source)
				}
				for _, f := range []struct{ name, got, want string }{
					{"etag", m.GetEtag(), wantETag},
					{"content_type", m.GetContentType(), tt.wantCType},
					{"last_modified", m.GetLastModified(), tt.wantLastMod},
				} {
					if f.got != f.want || !utf8.ValidString(f.got) {
						t.Errorf("call %d: %s = %.40q (%d bytes); want %.40q", i+1, f.name, f.got, len(f.got), f.want)
					}
				}
			}
			if got := cl.up.Count(tt.path); got != 1 {
				t.Errorf("upstream requests = %d; want 1", got)
			}
		})
	}
}

// TestDroppedETagNotSentBack: an expired copy whose ETag was dropped is
// revalidated without If-None-Match (a repaired ETag would not match the
// upstream's) and with If-Modified-Since.
func TestDroppedETagNotSentBack(t *testing.T) {
	clk := testclock.New(time.Now())
	cl := startCluster(t, 1, func(c *coordinator.Config) { c.Now = clk.Now })
	const lastMod = "Wed, 21 Oct 2026 07:28:00 GMT"
	cl.up.Set("/p", fakeupstream.Behavior{ETag: "\"caf\xe9\""}.WithHeader("Last-Modified", lastMod))
	ctx := context.Background()
	for _, noStale := range []bool{false, true} { // the second waits for the revalidation
		if _, err := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url("/p"), NoStale: noStale}); err != nil {
			t.Fatal(err)
		}
		clk.Advance(11 * time.Minute) // past the 10m TTL
	}
	h := cl.up.LastHeader("/p")
	if got := cl.up.Count("/p"); got != 2 {
		t.Fatalf("upstream requests = %d; want 2", got)
	}
	if got, ok := h["If-None-Match"]; ok {
		t.Errorf("If-None-Match = %q; want none", got)
	}
	if got := h.Get("If-Modified-Since"); got != lastMod {
		t.Errorf("If-Modified-Since = %q; want %q", got, lastMod)
	}
}

// TestCacheControlStaleServing: once a copy is past its fresh lifetime
// and the upstream fails, a must-revalidate (or proxy-revalidate) copy is
// not served stale, neither from L1 (stale-while-revalidate) nor from L2
// (stale-if-error): the call fails UNAVAILABLE. A no-cache copy is served
// only by stale-if-error; a plain one by either.
func TestCacheControlStaleServing(t *testing.T) {
	clk := testclock.New(time.Now())
	cl := startCluster(t, 2, func(c *coordinator.Config) {
		countPerCall(c)
		c.Now = clk.Now
		c.Upstreams[0].StaleTTL = time.Hour
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tests := []struct {
		path, cc  string
		wantStale bool // served stale; else UNAVAILABLE
	}{
		{"/plain", "max-age=120", true},
		{"/must-revalidate", "max-age=120, must-revalidate", false},
		{"/proxy-revalidate", "proxy-revalidate, max-age=120", false},
		{"/no-cache", "no-cache", true},
		{"/no-cache-must-revalidate", "no-cache, must-revalidate", false},
	}
	for _, tt := range tests {
		cl.up.Set(tt.path, fakeupstream.Behavior{}.WithHeader("Cache-Control", tt.cc))
		// Instance 0 holds the copy in L1; instance 1 finds it in L2.
		if _, err := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url(tt.path)}); err != nil {
			t.Fatalf("%s: %v", tt.path, err)
		}
	}
	clk.Advance(3 * time.Minute) // past every fresh lifetime, inside the stale window
	for _, tt := range tests {
		t.Run(strings.TrimPrefix(tt.path, "/"), func(t *testing.T) {
			cl.up.Set(tt.path, fakeupstream.Status(503))
			for i := range cl.clients {
				d, err := fleettest.Get(ctx, cl.clients[i], &coorddv1.GetOrFetchRequest{Url: cl.url(tt.path)})
				switch {
				case tt.wantStale && (err != nil || !d.Meta.GetStale() || !bytes.Equal(d.Body, cl.up.Body(tt.path))):
					t.Errorf("instance %d: %v, %v; want the stale copy", i, err, d.GetMeta())
				case !tt.wantStale && status.Code(err) != codes.Unavailable:
					t.Errorf("instance %d: %v, %v; want UNAVAILABLE", i, err, d.GetMeta())
				}
				cl.waitUnlocked(t, cl.url(tt.path)) // a background revalidation has ended
			}
		})
	}
}

// TestStaleWindowsFromCacheControl: stale-while-revalidate=N and
// stale-if-error=N (RFC 5861) end their stale-serving windows early, on
// every instance (L1 and L2 keep them): past N, a stale copy is no longer
// served while revalidating, nor instead of an error. It is still kept for
// stale_ttl, for a conditional request. Both used to last all of
// stale_ttl.
func TestStaleWindowsFromCacheControl(t *testing.T) {
	clk := testclock.New(time.Now())
	cl := startCluster(t, 2, func(c *coordinator.Config) {
		countPerCall(c)
		c.Now = clk.Now
		c.Upstreams[0].StaleTTL = time.Hour
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const cc = "max-age=60, stale-while-revalidate=30, stale-if-error=300"
	paths := []string{"/past-swr", "/inside-sie", "/past-sie", "/revalidated"}
	for _, p := range paths {
		cl.up.Set(p, fakeupstream.Behavior{Conditional: true}.WithHeader("Cache-Control", cc))
		if _, err := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url(p)}); err != nil {
			t.Fatal(err)
		}
		cl.waitUnlocked(t, cl.url(p)) // in L2 too
	}
	get := func(i int, p string) (*fleettest.Doc, error) {
		return fleettest.Get(ctx, cl.clients[i], &coorddv1.GetOrFetchRequest{Url: cl.url(p)})
	}
	clk.Advance(2 * time.Minute) // age 120 s: past stale-while-revalidate, inside stale-if-error
	if d, err := get(1, "/past-swr"); err != nil || d.Meta.GetStale() || d.Meta.GetSource() != coorddv1.Source_SOURCE_UPSTREAM {
		t.Errorf("past stale-while-revalidate: %v, %v; want a fresh copy, not the stale one", err, d.GetMeta())
	}
	cl.up.Set("/inside-sie", fakeupstream.Status(503))
	for i := range cl.clients {
		if d, err := get(i, "/inside-sie"); err != nil || !d.Meta.GetStale() {
			t.Errorf("instance %d inside stale-if-error: %v, %v; want the stale copy", i, err, d.GetMeta())
		}
		cl.waitUnlocked(t, cl.url("/inside-sie"))
	}
	clk.Advance(5 * time.Minute) // age 420 s: past stale-if-error, inside stale_ttl
	cl.up.Set("/past-sie", fakeupstream.Status(503))
	for i := range cl.clients {
		if d, err := get(i, "/past-sie"); status.Code(err) != codes.Unavailable {
			t.Errorf("instance %d past stale-if-error: %v, %v; want UNAVAILABLE", i, err, d.GetMeta())
		}
	}
	if d, err := get(1, "/revalidated"); err != nil || d.Meta.GetStale() || !bytes.Equal(d.Body, cl.up.Body("/revalidated")) {
		t.Errorf("revalidated: %v, %v; want a fresh copy", err, d.GetMeta())
	}
	if inm := cl.up.LastHeader("/revalidated").Get("If-None-Match"); inm != cl.up.ETag("/revalidated") {
		t.Errorf("revalidation If-None-Match = %q; want %q", inm, cl.up.ETag("/revalidated"))
	}
}

// TestNoCacheRevalidatedEveryCall: a copy the upstream marks no-cache,
// max-age=0 or s-maxage=0 is revalidated before every use, on every
// instance, with a conditional request: each call reaches the upstream
// with If-None-Match, gets a 304, and is served the body fresh.
func TestNoCacheRevalidatedEveryCall(t *testing.T) {
	cl := startCluster(t, 2, countPerCall)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, cc := range []string{"no-cache", "max-age=0", "s-maxage=0, max-age=600", "no-cache, must-revalidate"} {
		path := fmt.Sprintf("/nc%d", i)
		t.Run(cc, func(t *testing.T) {
			cl.up.Set(path, fakeupstream.Behavior{Conditional: true}.WithHeader("Cache-Control", cc))
			for call, in := range []int{0, 0, 1, 1, 0} {
				d, err := fleettest.Get(ctx, cl.clients[in], &coorddv1.GetOrFetchRequest{Url: cl.url(path)})
				if err != nil {
					t.Fatalf("call %d: %v", call+1, err)
				}
				if d.Meta.GetStale() || d.Meta.GetSource() != coorddv1.Source_SOURCE_UPSTREAM || !bytes.Equal(d.Body, cl.up.Body(path)) {
					t.Errorf("call %d: %v; want a fresh upstream copy with the body", call+1, d.Meta)
				}
				if got := cl.up.Count(path); got != call+1 {
					t.Fatalf("call %d: upstream requests = %d; want %d", call+1, got, call+1)
				}
				inm := cl.up.LastHeader(path).Get("If-None-Match")
				if want := cl.up.ETag(path); call > 0 && inm != want {
					t.Errorf("call %d: If-None-Match = %q; want %q", call+1, inm, want)
				}
			}
		})
	}
}

// TestNoCacheStampedeAcrossInstances: a copy that is stale the moment it
// lands (no-cache, max-age=0) is still the answer to the flight that
// fetched it, on every instance. Followers of another instance used to
// discard it as not fresh and take the lock to fetch again, one instance
// after the other: a cold no-cache key cost one upstream request per
// instance.
func TestNoCacheStampedeAcrossInstances(t *testing.T) {
	for i, cc := range []string{"no-cache", "max-age=0"} {
		t.Run(cc, func(t *testing.T) {
			cl := startCluster(t, 3, countPerCall)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			path := fmt.Sprintf("/nc-herd%d", i)
			release := make(chan struct{})
			cl.up.Set(path, fakeupstream.Behavior{Block: release, Conditional: true}.WithHeader("Cache-Control", cc))
			go func() {
				defer close(release)
				_ = cl.awaitJoined(ctx, path, 30) // the other callers join and subscribe
			}()
			out := cl.burst(t, ctx, 30, func(int) *coorddv1.GetOrFetchRequest {
				return &coorddv1.GetOrFetchRequest{Url: cl.url(path)}
			})
			for k, o := range out {
				if o.err != nil || !bytes.Equal(o.doc.Body, cl.up.Body(path)) || o.doc.Meta.GetStale() {
					t.Fatalf("caller %d (instance %d): %v, %v; want the fresh body", k, o.instance, o.err, o.doc)
				}
			}
			if got := cl.up.Count(path); got != 1 {
				t.Fatalf("upstream requests = %d for one burst of 30 callers on 3 instances; want 1", got)
			}
			cl.checkPushOnly(t)
		})
	}
}
