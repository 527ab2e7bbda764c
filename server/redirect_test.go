package server_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
)

// basePath appends path to the upstream's base_url, which startCluster
// sets to the fake upstream's root, and then applies more.
func basePath(path string, more ...func(*coordinator.Config)) func(*coordinator.Config) {
	return func(c *coordinator.Config) {
		c.Upstreams[0].BaseURL += path
		for _, f := range more {
			f(c)
		}
	}
}

// protect sets the upstream's protection.
func protect(p coordinator.Protection) func(*coordinator.Config) {
	return func(c *coordinator.Config) { c.Upstreams[0].Protection = p }
}

// newURIs returns the request targets u received since the previous call,
// as sent on the wire.
func newURIs(u *fakeupstream.Upstream, seen *int) []string {
	all := u.RequestURIs()
	got := all[*seen:]
	*seen = len(all)
	return got
}

// chain scripts a redirect chain prefix0 → prefix1 → … → prefix<n>, where
// prefix<n> answers 200, and returns the paths in order.
func chain(u *fakeupstream.Upstream, prefix string, n int) []string {
	paths := make([]string, n+1)
	for i := range paths {
		paths[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	for i := range n {
		u.Set(paths[i], fakeupstream.Redirect(paths[i+1]))
	}
	return paths
}

// TestRedirectTricksStayInBase: the upstream's base_url has a path, /docs,
// and its pages redirect with path tricks. coordd sends exactly the url it
// checked, so no request ever reaches the upstream outside /docs, escaped,
// or with a segment a server may read as "..". Refused redirects are
// delivered as the 302 they are.
func TestRedirectTricksStayInBase(t *testing.T) {
	cl := startCluster(t, 1, basePath("/docs", countPerCall))
	ctx := context.Background()
	tests := []struct {
		name     string
		location string
		wantHTTP int32
		wantNext string // the second request the upstream sees; "" for none
	}{
		{"escaped slashes climbing back in", "/admin/..%2f..%2fdocs/x", 302, ""},
		{"escaped slashes climbing out", "/docs/..%2F..%2Fadmin/x", 302, ""},
		{"escaped dots climbing back in", "/admin/%2e%2e/docs/x", 302, ""},
		{"dotdot params", "/docs/..;/admin/x", 302, ""},
		{"backslash", `/docs/..\admin/x`, 302, ""},
		{"escaped backslash", "/docs/..%5Cadmin/x", 302, ""},
		{"double escape", "/docs/%252e%252e/admin/x", 302, ""},
		{"dot segments leaving", "/docs/../admin/x", 302, ""},
		{"dot segments resolved inside", "/admin/../docs/x", 200, "/docs/x"},
		{"relative", "y", 200, "/docs/y"},
	}
	seen := 0
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := fmt.Sprintf("/docs/start%d", i)
			cl.up.Set(start, fakeupstream.Redirect(tt.location))
			d, err := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url(start)})
			if err != nil {
				t.Fatalf("GetOrFetch: %v", err)
			}
			if got := d.Meta.GetStatusCode(); got != tt.wantHTTP {
				t.Errorf("status_code = %d; want %d", got, tt.wantHTTP)
			}
			want := []string{start}
			if tt.wantNext != "" {
				want = append(want, tt.wantNext)
			}
			if got := newURIs(cl.up, &seen); !slices.Equal(got, want) {
				t.Errorf("upstream request targets = %q; want %q", got, want)
			}
		})
	}
	for _, uri := range cl.up.RequestURIs() {
		if !strings.HasPrefix(uri, "/docs/") || strings.ContainsAny(uri, `%\;`) || strings.Contains(uri, "..") {
			t.Errorf("the upstream received %q: outside /docs or not canonical", uri)
		}
	}
}

// TestRedirectHopsPassTheGuard: every redirect followed is an upstream
// request admitted by the guard like any other attempt.
func TestRedirectHopsPassTheGuard(t *testing.T) {
	t.Run("rate limit paces hops", func(t *testing.T) {
		// Four requests in one chain, at rate_limit 2: they are paced, not
		// sent back to back.
		const rate = 2
		cl := startCluster(t, 1, protect(coordinator.Protection{RateLimit: rate}))
		paths := chain(cl.up, "/paced", 3)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		d, err := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url(paths[0])})
		if err != nil || d.Meta.GetStatusCode() != 200 {
			t.Fatalf("GetOrFetch = %v, %v; want 200", d.GetMeta(), err)
		}
		if got := cl.up.RequestURIs(); !slices.Equal(got, paths) {
			t.Errorf("upstream request targets = %q; want %q", got, paths)
		}
		ts := cl.up.Arrivals("/paced")
		most := fakeupstream.MaxInWindow(ts, time.Second-fakeupstream.ArrivalJitter)
		t.Logf("%d requests (1 + %d redirects) over %v; at most %d in any 1s window (rate_limit %d)",
			len(ts), len(ts)-1, ts[len(ts)-1].Sub(ts[0]).Round(time.Millisecond), most, rate)
		if most > rate+1 {
			t.Errorf("%d requests in one 1s window; want at most %d", most, rate+1)
		}
		waited := slices.ContainsFunc(d.Progress, func(p *coorddv1.Progress) bool {
			return p.GetStage() == coorddv1.Stage_STAGE_RATE_LIMITED && p.GetWait().AsDuration() > 0
		})
		if !waited {
			t.Error("the caller was not told a hop waits for a rate-limit slot")
		}
	})
	t.Run("hop refused past the deadline", func(t *testing.T) {
		// rate_limit 1: the first request takes the slot, the redirect's
		// slot is a second away, past the caller's deadline.
		cl := startCluster(t, 1, protect(coordinator.Protection{RateLimit: 1}))
		paths := chain(cl.up, "/refused", 1)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, err := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url(paths[0])})
		if got := status.Code(err); got != codes.ResourceExhausted {
			t.Errorf("code = %v (%v); want RESOURCE_EXHAUSTED", got, err)
		}
		if got := cl.up.RequestURIs(); !slices.Equal(got, paths[:1]) {
			t.Errorf("upstream request targets = %q; want %q", got, paths[:1])
		}
	})
	t.Run("breaker counts hops", func(t *testing.T) {
		// Each call is a 302 then a 503: two attempts, half failed. After
		// two calls the breaker has seen min_requests (4) at failure_rate
		// 0.5 and opens; the third call never reaches the upstream.
		cl := startCluster(t, 1, protect(coordinator.Protection{
			Retry:   coordinator.RetryPolicy{MaxAttempts: 1},
			Breaker: coordinator.BreakerPolicy{FailureThreshold: -1, FailureRate: 0.5, MinRequests: 4},
		}))
		cl.up.Set("/broken", fakeupstream.Status(http.StatusServiceUnavailable))
		ctx := context.Background()
		for i := range 3 {
			from := fmt.Sprintf("/to-broken%d", i)
			cl.up.Set(from, fakeupstream.Redirect("/broken"))
			_, err := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url(from)})
			if got := status.Code(err); got != codes.Unavailable {
				t.Fatalf("call %d: code = %v (%v); want UNAVAILABLE", i+1, got, err)
			}
		}
		if got, want := cl.up.Total(), 4; got != want {
			t.Errorf("upstream requests = %d; want %d (none once the breaker opened)", got, want)
		}
	})
}

// TestRedirectHopLimit: at most coordinator.MaxRedirects redirects are
// followed; the next one is delivered as the answer.
func TestRedirectHopLimit(t *testing.T) {
	cl := startCluster(t, 1, countPerCall)
	ctx := context.Background()
	const limit = coordinator.MaxRedirects
	tests := []struct {
		name      string
		redirects int
		wantHTTP  int32
	}{
		{"at the limit", limit, 200},
		{"past the limit", limit + 2, 302},
	}
	seen := 0
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			paths := chain(cl.up, fmt.Sprintf("/chain%d-", i), tt.redirects)
			d, err := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url(paths[0])})
			if err != nil {
				t.Fatalf("GetOrFetch: %v", err)
			}
			if got := d.Meta.GetStatusCode(); got != tt.wantHTTP {
				t.Errorf("status_code = %d; want %d", got, tt.wantHTTP)
			}
			want := paths[:limit+1] // the first request and limit redirects
			if got := newURIs(cl.up, &seen); !slices.Equal(got, want) {
				t.Errorf("upstream request targets = %q; want %q", got, want)
			}
		})
	}
	t.Run("loop", func(t *testing.T) {
		cl.up.Set("/loop", fakeupstream.Redirect("/loop"))
		d, err := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url("/loop")})
		if err != nil || d.Meta.GetStatusCode() != 302 {
			t.Fatalf("GetOrFetch = %v, %v; want the 302", d.GetMeta(), err)
		}
		if got := cl.up.Count("/loop"); got != limit+1 {
			t.Errorf("upstream requests = %d; want %d", got, limit+1)
		}
	})
}

// TestPathTricksRefusedBeforeIO: with base_url .../docs/, path tricks are
// INVALID_ARGUMENT and /docs (the directory without its slash) is
// PERMISSION_DENIED, before any upstream request.
func TestPathTricksRefusedBeforeIO(t *testing.T) {
	cl := startCluster(t, 1, basePath("/docs/"))
	c := cl.clients[0]
	ctx := context.Background()
	tests := []struct {
		name, path string
		want       codes.Code
	}{
		{"directory without slash", "/docs", codes.PermissionDenied},
		{"dotdot params", "/docs/..;/admin", codes.InvalidArgument},
		{"dot params", "/docs/.;x/a", codes.InvalidArgument},
		{"escaped semicolon", "/docs/..%3b/admin", codes.InvalidArgument},
		{"escaped slash", "/docs/..%2F..%2Fadmin", codes.InvalidArgument},
		{"escaped slash climbing in", "/admin/..%2f..%2fdocs/x", codes.InvalidArgument},
		{"escaped dots", "/docs/%2E%2E/admin", codes.InvalidArgument},
		{"escaped percent", "/docs/%25", codes.InvalidArgument},
		{"double escape", "/docs/%252e%252e/admin", codes.InvalidArgument},
		{"backslash", `/docs/..\admin`, codes.InvalidArgument},
		{"escaped backslash", "/docs/..%5cadmin", codes.InvalidArgument},
		{"escaped nul", "/docs/a%00", codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: cl.url(tt.path)})
			if got := status.Code(err); got != tt.want {
				t.Fatalf("code = %v (%v); want %v", got, err, tt.want)
			}
		})
	}
	if _, err := c.Invalidate(ctx, &coorddv1.InvalidateRequest{Url: cl.url("/docs/..;/admin")}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Invalidate(trick) = %v; want INVALID_ARGUMENT", err)
	}
	if n := cl.up.Total(); n != 0 {
		t.Fatalf("upstream saw %d requests (%q); want 0", n, cl.up.RequestURIs())
	}
	if _, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: cl.url("/docs/")}); err != nil {
		t.Fatalf("the directory itself: %v", err)
	}
}
