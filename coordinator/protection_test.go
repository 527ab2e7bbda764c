package coordinator_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/testing/enginetest"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/redistest"
	"github.com/coordd/coordd/internal/testing/testclock"
)

// The tests below run real coordinators against a real redis-server and a
// real (fake) HTTP upstream.

// TestRateLimitAcrossInstances: three instances, 90 cold keys asked of each
// at once. The upstream sees one request per key, never more than
// rate_limit (+1 for timing slack) in any one-second window, and every
// caller gets its document.
func TestRateLimitAcrossInstances(t *testing.T) {
	const rate, keys = 30, 90
	u := fakeupstream.New(t)
	rs := redistest.Start(t)
	cfg := enginetest.Protected(u, coordinator.Protection{RateLimit: rate}, nil)
	// Not about Redis's timing: a busy machine (make stress-test) must not
	// find Redis down past Protected's 300ms, or each instance fetches a
	// key on its own (seen: 93 requests for 90 keys).
	cfg.RedisTimeout = 2 * time.Second
	var ins []*fleettest.Instance
	for range 3 {
		ins = append(ins, fleettest.Start(t, fleettest.Options{RedisURL: rs.URL(), Config: cfg}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var waited atomic.Int32 // calls told they wait for a slot
	for k := range keys {
		for _, in := range ins {
			wg.Go(func() {
				path := fmt.Sprintf("/doc/%d", k)
				told := false
				res, err := enginetest.Get(ctx, in.Coordinator, u.URL()+path, "", coordinator.GetOptions{Progress: func(p coordinator.Progress) {
					if p.Stage == coordinator.StageRateLimited && p.Wait > 0 && !told {
						told = true
						waited.Add(1)
					}
				}})
				if err != nil {
					t.Errorf("%s: %v", path, err)
					return
				}
				if !bytes.Equal(res.Doc.Body, u.Body(path)) {
					t.Errorf("%s: wrong body", path)
				}
			})
		}
	}
	wg.Wait()
	if got := u.Total(); got != keys {
		t.Errorf("upstream requests = %d; want %d, one per key", got, keys)
	}
	ts := u.Arrivals("/")
	most := fakeupstream.MaxInWindow(ts, time.Second-fakeupstream.ArrivalJitter)
	t.Logf("%d requests over %v; at most %d in any 1s window (rate_limit %d); %d calls were told to wait",
		len(ts), ts[len(ts)-1].Sub(ts[0]).Round(time.Millisecond), most, rate, waited.Load())
	if most > rate+1 {
		t.Errorf("%d requests in one 1s window; want at most %d", most, rate+1)
	}
	if waited.Load() == 0 {
		t.Error("no caller was told it waits for a rate-limit slot")
	}
}

// TestRateLimitWithoutSharedRedis: in single-node mode, and in every
// instance once Redis dies, the same limit holds per instance.
func TestRateLimitWithoutSharedRedis(t *testing.T) {
	const rate, keys = 20, 40
	check := func(t *testing.T, u *fakeupstream.Upstream, cs map[string]*coordinator.Coordinator) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		for name, c := range cs {
			for k := range keys {
				wg.Go(func() {
					if _, err := enginetest.Get(ctx, c, fmt.Sprintf("%s/%s/%d", u.URL(), name, k), "", coordinator.GetOptions{}); err != nil {
						t.Error(err)
					}
				})
			}
		}
		wg.Wait()
		for name := range cs {
			ts := u.Arrivals("/" + name + "/")
			most := fakeupstream.MaxInWindow(ts, time.Second-fakeupstream.ArrivalJitter)
			t.Logf("instance %s: %d requests over %v; at most %d in any 1s window (rate_limit %d)",
				name, len(ts), ts[len(ts)-1].Sub(ts[0]).Round(time.Millisecond), most, rate)
			if len(ts) != keys || most > rate+1 {
				t.Errorf("instance %s: %d requests, %d in one 1s window; want %d, at most %d", name, len(ts), most, keys, rate+1)
			}
		}
	}
	t.Run("single-node", func(t *testing.T) {
		u := fakeupstream.New(t)
		c := enginetest.New(t, enginetest.Protected(u, coordinator.Protection{RateLimit: rate}, nil))
		check(t, u, map[string]*coordinator.Coordinator{"a": c})
	})
	t.Run("redis down", func(t *testing.T) {
		u := fakeupstream.New(t)
		rs := redistest.Start(t)
		cfg := enginetest.Protected(u, coordinator.Protection{RateLimit: rate}, nil)
		a := fleettest.Start(t, fleettest.Options{RedisURL: rs.URL(), Config: cfg})
		b := fleettest.Start(t, fleettest.Options{RedisURL: rs.URL(), Config: cfg})
		rs.Kill()
		check(t, u, map[string]*coordinator.Coordinator{"a": a.Coordinator, "b": b.Coordinator})
		if a.Coordinator.RedisHealthy() || b.Coordinator.RedisHealthy() {
			t.Error("Redis still believed up")
		}
	})
}

// TestRetryAfterShared: the upstream answers 429 with Retry-After: 1
// twice. The caller succeeds on the third request, each no sooner than the
// upstream asked, and another instance backs off the upstream too.
func TestRetryAfterShared(t *testing.T) {
	u := fakeupstream.New(t)
	rs := redistest.Start(t)
	tooMany := fakeupstream.Status(http.StatusTooManyRequests).WithHeader("Retry-After", "1")
	u.SetSequence("/ra", []fakeupstream.Behavior{tooMany, tooMany, {}})
	cfg := enginetest.Protected(u, coordinator.Protection{}, nil)
	a := fleettest.Start(t, fleettest.Options{RedisURL: rs.URL(), Config: cfg})
	b := fleettest.Start(t, fleettest.Options{RedisURL: rs.URL(), Config: cfg})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	retrying := make(chan struct{}, 1)
	var attempts []int
	done := make(chan error, 1)
	go func() {
		res, err := enginetest.Get(ctx, a.Coordinator, u.URL()+"/ra", "", coordinator.GetOptions{Progress: func(p coordinator.Progress) {
			if p.Stage == coordinator.StageRetrying {
				attempts = append(attempts, p.Attempt)
				select {
				case retrying <- struct{}{}:
				default:
				}
			}
		}})
		if err == nil && !bytes.Equal(res.Doc.Body, u.Body("/ra")) {
			err = errors.New("wrong body")
		}
		done <- err
	}()
	select {
	case <-retrying: // the first 429 is recorded
	case <-ctx.Done():
		t.Fatal("no retry reported")
	}
	var backedOff bool
	if _, err := enginetest.Get(ctx, b.Coordinator, u.URL()+"/other", "", coordinator.GetOptions{Progress: func(p coordinator.Progress) {
		backedOff = backedOff || p.Stage == coordinator.StageRateLimited && strings.Contains(p.Detail, "Retry-After")
	}}); err != nil {
		t.Fatalf("other instance: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("caller: %v", err)
	}
	ts := u.Times("/ra")
	if len(ts) != 3 {
		t.Fatalf("upstream requests = %d; want 3", len(ts))
	}
	for i := 1; i < 3; i++ {
		if gap := ts[i].Sub(ts[i-1]); gap < time.Second {
			t.Errorf("request %d came %v after a Retry-After: 1", i+1, gap)
		}
	}
	if !slices.Equal(attempts, []int{2, 3}) {
		t.Errorf("retry progress attempts = %v; want [2 3]", attempts)
	}
	other := u.Times("/other")
	if len(other) != 1 || other[0].Sub(ts[0]) < time.Second {
		t.Errorf("other instance reached the upstream %v after the 429; want at least 1s", other[0].Sub(ts[0]))
	}
	if !backedOff {
		t.Error("other instance's caller was not told of the backoff")
	}
}

// TestRateLimited403Retried: a 403 that says it is a rate limit
// (GitHub's secondary limit: a Retry-After) is waited out and retried for
// its caller, as a 429 is, on every one of three instances asking the key
// at once; it counts nothing against a breaker that opens on one failure,
// so another key is fetched at once after the wait. A plain 403 is an
// answer: one request, not retried.
func TestRateLimited403Retried(t *testing.T) {
	u := fakeupstream.New(t)
	rs := redistest.Start(t)
	limited := fakeupstream.Status(http.StatusForbidden).WithHeader("Retry-After", "1")
	u.SetSequence("/secondary", []fakeupstream.Behavior{limited, {}})
	u.Set("/plain", fakeupstream.Status(http.StatusForbidden))
	cfg := enginetest.Protected(u, coordinator.Protection{
		MaxWait: 20 * time.Second,
		Retry:   coordinator.RetryPolicy{MaxAttempts: 4},
		Breaker: coordinator.BreakerPolicy{FailureThreshold: 1},
	}, nil)
	var cs []*coordinator.Coordinator
	for range 3 {
		cs = append(cs, fleettest.Start(t, fleettest.Options{RedisURL: rs.URL(), Config: cfg}).Coordinator)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 3*8)
	for _, c := range cs {
		for range 8 {
			wg.Go(func() {
				res, err := enginetest.Get(ctx, c, u.URL()+"/secondary", "", coordinator.GetOptions{})
				if err == nil && (res.Doc.StatusCode != http.StatusOK || !bytes.Equal(res.Doc.Body, u.Body("/secondary"))) {
					err = fmt.Errorf("status %d, %d bytes", res.Doc.StatusCode, len(res.Doc.Body))
				}
				errs <- err
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("caller after a rate-limited 403: %v; want the document once the Retry-After has passed", err)
		}
	}
	if ts := u.Times("/secondary"); len(ts) != 2 || ts[1].Sub(ts[0]) < time.Second {
		t.Errorf("upstream requests %v; want 2, the retry at least 1s after the 403", ts)
	}
	if _, err := enginetest.Get(ctx, cs[1], u.URL()+"/other", "", coordinator.GetOptions{}); err != nil {
		t.Errorf("another key after the rate-limited 403: %v; want it fetched (the breaker closed)", err)
	}
	res, err := enginetest.Get(ctx, cs[2], u.URL()+"/plain", "", coordinator.GetOptions{})
	if err != nil || res.Doc.StatusCode != http.StatusForbidden || u.Count("/plain") != 1 {
		t.Errorf("a plain 403: %v, %v, %d requests; want the 403 as the answer, one request", res, err, u.Count("/plain"))
	}
}

// TestRetryBudgetHolds: with half the attempts failing, retries stay within
// budget_ratio of the requests.
func TestRetryBudgetHolds(t *testing.T) {
	const calls, ratio = 200, 0.2
	u := fakeupstream.New(t)
	u.FailEvery("/doc", 2, fakeupstream.Status(http.StatusServiceUnavailable))
	c := enginetest.New(t, enginetest.Protected(u, coordinator.Protection{
		RateLimit: -1,
		Retry:     coordinator.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond, BudgetRatio: ratio, BudgetMinPerSec: -1},
		Breaker:   coordinator.BreakerPolicy{FailureThreshold: -1, FailureRate: -1},
	}, nil))
	ctx := context.Background()
	var wg sync.WaitGroup
	work := make(chan int)
	for range 4 {
		wg.Go(func() {
			for i := range work {
				_, _ = enginetest.Get(ctx, c, u.URL()+"/doc", fmt.Sprintf("key-%d", i), coordinator.GetOptions{})
			}
		})
	}
	for i := range calls {
		work <- i
	}
	close(work)
	wg.Wait()
	retries := u.Total() - calls
	t.Logf("%d calls, %d retries (%.3f per call); budget_ratio %v", calls, retries, float64(retries)/calls, ratio)
	if float64(retries) > ratio*calls+1 {
		t.Errorf("%d retries for %d calls; want at most %v", retries, calls, ratio*calls+1)
	}
	if float64(retries) < ratio*calls/2 {
		t.Errorf("%d retries for %d calls; want the budget used (about %v)", retries, calls, ratio*calls)
	}
}

// TestRetryOnlyRetryable: 4xx and 501 are answers, never retried; 5xx and
// timeouts are retried up to max_attempts.
func TestRetryOnlyRetryable(t *testing.T) {
	u := fakeupstream.New(t)
	cfg := enginetest.Protected(u, coordinator.Protection{
		Retry:   coordinator.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond},
		Breaker: coordinator.BreakerPolicy{FailureThreshold: -1, FailureRate: -1},
	}, nil)
	cfg.Upstreams[0].Timeout = 200 * time.Millisecond
	c := enginetest.New(t, cfg)
	for _, tc := range []struct {
		name string
		b    fakeupstream.Behavior
		want int
	}{
		{"400", fakeupstream.Status(400), 1},
		{"403", fakeupstream.Status(403), 1},
		{"404", fakeupstream.Status(404), 1},
		{"410", fakeupstream.Status(410), 1},
		{"501", fakeupstream.Status(501), 1},
		{"500", fakeupstream.Status(500), 3},
		{"502", fakeupstream.Status(502), 3},
		{"503", fakeupstream.Status(503), 3},
		{"timeout", fakeupstream.Hang(), 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := "/" + tc.name
			u.Set(path, tc.b)
			_, _ = enginetest.Get(context.Background(), c, u.URL()+path, "", coordinator.GetOptions{})
			if got := u.Count(path); got != tc.want {
				t.Errorf("upstream requests = %d; want %d", got, tc.want)
			}
		})
	}
}

// TestNoRetryAfterClose: a retry scheduled when the coordinator closes (the
// flight's context ends) never happens.
func TestNoRetryAfterClose(t *testing.T) {
	u := fakeupstream.New(t)
	u.Set("/slow", fakeupstream.Status(503).WithHeader("Retry-After", "5"))
	c, err := coordinator.New(enginetest.Protected(u, coordinator.Protection{}, nil), coordinator.Options{})
	if err != nil {
		t.Fatal(err)
	}
	retrying := make(chan struct{})
	var once sync.Once
	done := make(chan error, 1)
	go func() {
		_, err := enginetest.Get(context.Background(), c, u.URL()+"/slow", "", coordinator.GetOptions{Progress: func(p coordinator.Progress) {
			if p.Stage == coordinator.StageRetrying {
				once.Do(func() { close(retrying) })
			}
		}})
		done <- err
	}()
	<-retrying
	c.Close() // waits for the flight
	if err := <-done; err == nil {
		t.Error("Get succeeded; want an error")
	}
	if got := u.Count("/slow"); got != 1 {
		t.Errorf("upstream requests = %d; want 1 (no retry after close)", got)
	}
}

// TestHugeRetryAfterBacksOff: a 429 with a Retry-After too large for a
// Duration (it overflowed to a negative one: no backoff, immediate retries)
// backs the upstream off for retry_after_cap, on this instance and on the
// others: the fetch is not retried, and a call for another path is refused
// at once without reaching the upstream.
func TestHugeRetryAfterBacksOff(t *testing.T) {
	for _, shared := range []bool{false, true} {
		name := map[bool]string{false: "single-node", true: "shared"}[shared]
		t.Run(name, func(t *testing.T) {
			u := fakeupstream.New(t)
			u.Set("/ra", fakeupstream.Status(http.StatusTooManyRequests).WithHeader("Retry-After", "9223372037"))
			cfg := enginetest.Protected(u, coordinator.Protection{RetryAfterCap: time.Hour}, nil)
			var a, b *coordinator.Coordinator // b is asked for the other path
			if shared {
				rs := redistest.Start(t)
				a = fleettest.Start(t, fleettest.Options{RedisURL: rs.URL(), Config: cfg}).Coordinator
				b = fleettest.Start(t, fleettest.Options{RedisURL: rs.URL(), Config: cfg}).Coordinator
			} else {
				a = enginetest.New(t, cfg)
				b = a
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if _, err := enginetest.Get(ctx, a, u.URL()+"/ra", "", coordinator.GetOptions{}); !errors.Is(err, coordinator.ErrUnavailable) {
				t.Fatalf("429: err = %v; want ErrUnavailable", err)
			}
			if got := u.Count("/ra"); got != 1 {
				t.Errorf("upstream requests after the 429 = %d; want 1 (the retry would come after the wait bound)", got)
			}
			var waited time.Duration
			_, err := enginetest.Get(ctx, b, u.URL()+"/other", "", coordinator.GetOptions{Progress: func(p coordinator.Progress) {
				if p.Stage == coordinator.StageRateLimited {
					waited = p.Wait
				}
			}})
			if !errors.Is(err, coordinator.ErrRateLimited) {
				t.Fatalf("other path: err = %v; want ErrRateLimited", err)
			}
			if got := u.Count("/other"); got != 0 {
				t.Errorf("other path reached the upstream %d times; want 0", got)
			}
			if waited < 59*time.Minute {
				t.Errorf("reported wait %v; want about the 1h retry_after_cap", waited)
			}
		})
	}
}

// TestConditionalRevalidation: an expired copy is revalidated with
// If-None-Match and If-Modified-Since; the 304 makes it fresh again.
func TestConditionalRevalidation(t *testing.T) {
	const lastMod = "Wed, 21 Oct 2026 07:28:00 GMT"
	u := fakeupstream.New(t)
	u.Set("/c", fakeupstream.Behavior{Conditional: true}.WithHeader("Last-Modified", lastMod))
	clk := testclock.New(time.Now())
	cfg := enginetest.Protected(u, coordinator.Protection{}, nil)
	cfg.Now = clk.Now
	c := enginetest.New(t, cfg)
	ctx := context.Background()
	if _, err := enginetest.Get(ctx, c, u.URL()+"/c", "", coordinator.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(11 * time.Minute) // past the 10m TTL
	res, err := enginetest.Get(ctx, c, u.URL()+"/c", "", coordinator.GetOptions{NoStale: true})
	if err != nil {
		t.Fatal(err)
	}
	h := u.LastHeader("/c")
	if got, want := h.Get("If-None-Match"), u.ETag("/c"); got != want {
		t.Errorf("If-None-Match = %q; want %q", got, want)
	}
	if got := h.Get("If-Modified-Since"); got != lastMod {
		t.Errorf("If-Modified-Since = %q; want %q", got, lastMod)
	}
	if res.Stale || res.Source != coordinator.SourceUpstream || res.Doc.StatusCode != 200 || !bytes.Equal(res.Doc.Body, u.Body("/c")) {
		t.Errorf("revalidated: source %v, stale %v, status %d; want a fresh 200 with the old body", res.Source, res.Stale, res.Doc.StatusCode)
	}
	if got := res.Doc.FreshUntil.Sub(clk.Now()); got != 10*time.Minute {
		t.Errorf("fresh for %v after a 304; want the 10m TTL", got)
	}
	if res, _ := enginetest.Get(ctx, c, u.URL()+"/c", "", coordinator.GetOptions{}); res == nil || res.Source != coordinator.SourceL1 || res.Stale {
		t.Errorf("after revalidation: %+v; want a fresh L1 hit", res)
	}
	if got := u.Count("/c"); got != 2 {
		t.Errorf("upstream requests = %d; want 2", got)
	}
}

// TestNegativeCaching: 404 and 410 are cached for negative_ttl; other 4xx
// are not cached.
func TestNegativeCaching(t *testing.T) {
	u := fakeupstream.New(t)
	clk := testclock.New(time.Now())
	cfg := enginetest.Protected(u, coordinator.Protection{}, nil)
	cfg.Now = clk.Now
	c := enginetest.New(t, cfg)
	ctx := context.Background()
	for _, code := range []int{404, 410, 403} {
		path := fmt.Sprintf("/%d", code)
		u.Set(path, fakeupstream.Status(code))
		for range 2 {
			res, err := enginetest.Get(ctx, c, u.URL()+path, "", coordinator.GetOptions{})
			if err != nil || res.Doc.StatusCode != code {
				t.Fatalf("%s: %v, %+v; want a %d document", path, err, res, code)
			}
		}
	}
	if a, b, c := u.Count("/404"), u.Count("/410"), u.Count("/403"); a != 1 || b != 1 || c != 2 {
		t.Errorf("upstream requests for 404, 410, 403 = %d, %d, %d; want 1, 1, 2", a, b, c)
	}
	clk.Advance(time.Minute) // the default negative_ttl
	if _, err := enginetest.Get(ctx, c, u.URL()+"/404", "", coordinator.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := u.Count("/404"); got != 2 {
		t.Errorf("after negative_ttl: upstream requests = %d; want 2", got)
	}
}

// TestCacheControl: the upstream's max-age sets the fresh lifetime within
// [min_ttl, max_ttl]; no-store is delivered but not cached.
func TestCacheControl(t *testing.T) {
	u := fakeupstream.New(t)
	u.Set("/long", fakeupstream.Behavior{}.WithHeader("Cache-Control", "public, max-age=7200"))
	u.Set("/huge", fakeupstream.Behavior{}.WithHeader("Cache-Control", "max-age=31536000"))
	u.Set("/nostore", fakeupstream.Behavior{}.WithHeader("Cache-Control", "no-store"))
	c := enginetest.New(t, enginetest.Protected(u, coordinator.Protection{MaxTTL: 3 * time.Hour}, nil))
	ctx := context.Background()
	for path, want := range map[string]time.Duration{"/long": 2 * time.Hour, "/huge": 3 * time.Hour} {
		res, err := enginetest.Get(ctx, c, u.URL()+path, "", coordinator.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Doc.FreshUntil.Sub(res.Doc.FetchedAt); got != want {
			t.Errorf("%s: fresh for %v; want %v", path, got, want)
		}
	}
	for range 2 {
		res, err := enginetest.Get(ctx, c, u.URL()+"/nostore", "", coordinator.GetOptions{})
		if err != nil || !bytes.Equal(res.Doc.Body, u.Body("/nostore")) {
			t.Fatalf("no-store: %v; want the document delivered", err)
		}
	}
	if got := u.Count("/nostore"); got != 2 {
		t.Errorf("no-store: upstream requests = %d; want 2 (not cached)", got)
	}
}
