package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/coorddtest"
	"github.com/coordd/coordd/internal/fakeupstream"
	"github.com/coordd/coordd/internal/redistest"
	"github.com/coordd/coordd/internal/testclock"
)

// The tests below run real coordinators against a real redis-server and a
// real (fake) HTTP upstream.

// protConfig is a configuration with one upstream, u, protected by p. Logs
// go to buf when it is not nil, else nowhere.
func protConfig(u *fakeupstream.Upstream, p coordinator.Protection, buf *syncBuffer) coordinator.Config {
	h := slog.Handler(slog.DiscardHandler)
	if buf != nil {
		h = slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelInfo})
	}
	return coordinator.Config{
		Upstreams:    []coordinator.Upstream{{Name: "fake", BaseURL: u.URL(), Protection: p}},
		RedisTimeout: 300 * time.Millisecond,
		Logger:       slog.New(h),
	}
}

// protNew returns a single-node coordinator, closed when t ends.
func protNew(t *testing.T, cfg coordinator.Config) *coordinator.Coordinator {
	t.Helper()
	c, err := coordinator.New(cfg, coordinator.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// protGet gets url under key (empty: the url) from c.
func protGet(ctx context.Context, c *coordinator.Coordinator, url, key string, opt coordinator.GetOptions) (*coordinator.Result, error) {
	tg, err := c.Resolve(url, key)
	if err != nil {
		return nil, err
	}
	return c.Get(ctx, tg, opt)
}

// arrivals returns when every request reached u, sorted.
func arrivals(u *fakeupstream.Upstream, prefix string) []time.Time {
	var ts []time.Time
	for _, p := range u.Paths() {
		if strings.HasPrefix(p, prefix) {
			ts = append(ts, u.Times(p)...)
		}
	}
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	return ts
}

// arrivalJitter is how far an admitted request's arrival at the fake
// upstream may drift from its slot on a loaded 2-core machine (goroutine
// scheduling, the race detector): rate checks count arrivals in windows
// this much shorter than the second the limit is defined over.
const arrivalJitter = 100 * time.Millisecond

// maxInWindow returns the most of ts (sorted) that fall in any half-open
// window [t, t+w).
func maxInWindow(ts []time.Time, w time.Duration) int {
	most, j := 0, 0
	for i := range ts {
		for j < len(ts) && ts[j].Sub(ts[i]) < w {
			j++
		}
		most = max(most, j-i)
	}
	return most
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestRateLimitAcrossInstances: three instances, 90 cold keys asked of each
// at once. The upstream sees one request per key, never more than
// rate_limit (+1 for timing slack) in any one-second window, and every
// caller gets its document.
func TestRateLimitAcrossInstances(t *testing.T) {
	const rate, keys = 30, 90
	u := fakeupstream.New(t)
	rs := redistest.Start(t)
	cfg := protConfig(u, coordinator.Protection{RateLimit: rate}, nil)
	var ins []*coorddtest.Instance
	for range 3 {
		ins = append(ins, coorddtest.Start(t, coorddtest.Options{RedisURL: rs.URL(), Config: cfg}))
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
				res, err := protGet(ctx, in.Coordinator, u.URL()+path, "", coordinator.GetOptions{Progress: func(p coordinator.Progress) {
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
	ts := arrivals(u, "/")
	most := maxInWindow(ts, time.Second-arrivalJitter)
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
					if _, err := protGet(ctx, c, fmt.Sprintf("%s/%s/%d", u.URL(), name, k), "", coordinator.GetOptions{}); err != nil {
						t.Error(err)
					}
				})
			}
		}
		wg.Wait()
		for name := range cs {
			ts := arrivals(u, "/"+name+"/")
			most := maxInWindow(ts, time.Second-arrivalJitter)
			t.Logf("instance %s: %d requests over %v; at most %d in any 1s window (rate_limit %d)",
				name, len(ts), ts[len(ts)-1].Sub(ts[0]).Round(time.Millisecond), most, rate)
			if len(ts) != keys || most > rate+1 {
				t.Errorf("instance %s: %d requests, %d in one 1s window; want %d, at most %d", name, len(ts), most, keys, rate+1)
			}
		}
	}
	t.Run("single-node", func(t *testing.T) {
		u := fakeupstream.New(t)
		c := protNew(t, protConfig(u, coordinator.Protection{RateLimit: rate}, nil))
		check(t, u, map[string]*coordinator.Coordinator{"a": c})
	})
	t.Run("redis down", func(t *testing.T) {
		u := fakeupstream.New(t)
		rs := redistest.Start(t)
		cfg := protConfig(u, coordinator.Protection{RateLimit: rate}, nil)
		a := coorddtest.Start(t, coorddtest.Options{RedisURL: rs.URL(), Config: cfg})
		b := coorddtest.Start(t, coorddtest.Options{RedisURL: rs.URL(), Config: cfg})
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
	cfg := protConfig(u, coordinator.Protection{}, nil)
	a := coorddtest.Start(t, coorddtest.Options{RedisURL: rs.URL(), Config: cfg})
	b := coorddtest.Start(t, coorddtest.Options{RedisURL: rs.URL(), Config: cfg})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	retrying := make(chan struct{}, 1)
	var attempts []int
	done := make(chan error, 1)
	go func() {
		res, err := protGet(ctx, a.Coordinator, u.URL()+"/ra", "", coordinator.GetOptions{Progress: func(p coordinator.Progress) {
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
	if _, err := protGet(ctx, b.Coordinator, u.URL()+"/other", "", coordinator.GetOptions{Progress: func(p coordinator.Progress) {
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

// TestBreakerSharedAcrossInstances: an upstream that always fails opens
// the breaker through instance A; both instances then fail fast without
// calling it. Once it recovers, half-open lets exactly one probe through at
// a time, across instances, and closes after close_after (2) successes.
func TestBreakerSharedAcrossInstances(t *testing.T) {
	const openFor = time.Second
	u := fakeupstream.New(t)
	rs := redistest.Start(t)
	var logs syncBuffer
	cfg := protConfig(u, coordinator.Protection{
		Retry:   coordinator.RetryPolicy{MaxAttempts: 1},
		Breaker: coordinator.BreakerPolicy{FailureThreshold: 3, FailureRate: -1, OpenFor: openFor},
	}, &logs)
	a := coorddtest.Start(t, coorddtest.Options{RedisURL: rs.URL(), Config: cfg})
	b := coorddtest.Start(t, coorddtest.Options{RedisURL: rs.URL(), Config: cfg})
	ins := []*coorddtest.Instance{a, b}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := 0
	next := func() string { n++; return fmt.Sprintf("%s/k%d", u.URL(), n) }

	u.Set(fakeupstream.AllPaths, fakeupstream.Status(http.StatusServiceUnavailable))
	for range 3 {
		_, err := protGet(ctx, a.Coordinator, next(), "", coordinator.GetOptions{})
		if !errors.Is(err, coordinator.ErrUnavailable) || errors.Is(err, coordinator.ErrBreakerOpen) {
			t.Fatalf("closed breaker, failing upstream: err = %v; want ErrUnavailable", err)
		}
	}
	// Open: both instances fail at once, without a request.
	// Failing fast is shown by the error (ErrBreakerOpen, not a timeout) and
	// by the upstream count below, not by a wall-clock bound.
	for _, in := range ins {
		var told bool
		_, err := protGet(ctx, in.Coordinator, next(), "", coordinator.GetOptions{Progress: func(p coordinator.Progress) {
			told = told || p.Stage == coordinator.StageBreakerOpen
		}})
		if !errors.Is(err, coordinator.ErrBreakerOpen) {
			t.Fatalf("open breaker: err = %v; want ErrBreakerOpen", err)
		}
		if !told {
			t.Error("open breaker: no StageBreakerOpen progress")
		}
	}
	_, err := coorddtest.Get(ctx, b.Dial(t), &coorddv1.GetOrFetchRequest{Url: next()})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("open breaker over gRPC: %v; want UNAVAILABLE", err)
	}
	var retryIn time.Duration
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			retryIn = ri.GetRetryDelay().AsDuration()
		}
	}
	if retryIn <= 0 || retryIn > openFor {
		t.Errorf("open breaker over gRPC: RetryInfo delay %v; want the time until half-open, in (0, %v]", retryIn, openFor)
	}
	if got := u.Total(); got != 3 {
		t.Fatalf("upstream requests = %d; want 3 (none while open)", got)
	}

	// probeRound has 2·per calls (per on each instance) at once against a
	// recovered but held upstream: exactly one gets through.
	probeRound := func(per int) {
		t.Helper()
		release := make(chan struct{})
		u.Set(fakeupstream.AllPaths, fakeupstream.Behavior{Block: release})
		before := u.Total()
		errs := make(chan error, 2*per)
		for _, in := range ins {
			for range per {
				url := next()
				go func() {
					_, err := protGet(ctx, in.Coordinator, url, "", coordinator.GetOptions{})
					errs <- err
				}()
			}
		}
		for range 2*per - 1 {
			if err := <-errs; !errors.Is(err, coordinator.ErrBreakerOpen) {
				t.Fatalf("half-open, probe under way: err = %v; want ErrBreakerOpen", err)
			}
		}
		// Every other call has failed: the probe is the only one left, and
		// its request arrives soon.
		for deadline := time.Now().Add(5 * time.Second); u.Total() == before && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		if got := u.Total() - before; got != 1 {
			t.Fatalf("half-open: %d requests reached the upstream; want 1 probe", got)
		}
		close(release)
		if err := <-errs; err != nil {
			t.Fatalf("probe: %v", err)
		}
	}
	time.Sleep(openFor + 100*time.Millisecond) // open → half-open
	probeRound(3)
	probeRound(2) // one success of two: still half-open

	// Closed: every call reaches the upstream.
	u.Clear(fakeupstream.AllPaths)
	before := u.Total()
	var wg sync.WaitGroup
	for _, in := range ins {
		for range 3 {
			url := next()
			wg.Go(func() {
				if _, err := protGet(ctx, in.Coordinator, url, "", coordinator.GetOptions{}); err != nil {
					t.Errorf("closed again: %v", err)
				}
			})
		}
	}
	wg.Wait()
	if got := u.Total() - before; got != 6 {
		t.Errorf("closed again: %d requests reached the upstream; want 6", got)
	}
	for _, want := range []string{`"circuit breaker open"`, `"circuit breaker half-open"`, `"circuit breaker closed"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no %s in the logs:\n%s", want, logs.String())
		}
	}
}

// TestRetryBudgetHolds: with half the attempts failing, retries stay within
// budget_ratio of the requests.
func TestRetryBudgetHolds(t *testing.T) {
	const calls, ratio = 200, 0.2
	u := fakeupstream.New(t)
	u.FailEvery("/doc", 2, fakeupstream.Status(http.StatusServiceUnavailable))
	c := protNew(t, protConfig(u, coordinator.Protection{
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
				_, _ = protGet(ctx, c, u.URL()+"/doc", fmt.Sprintf("key-%d", i), coordinator.GetOptions{})
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
	cfg := protConfig(u, coordinator.Protection{
		Retry:   coordinator.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond},
		Breaker: coordinator.BreakerPolicy{FailureThreshold: -1, FailureRate: -1},
	}, nil)
	cfg.Upstreams[0].Timeout = 200 * time.Millisecond
	c := protNew(t, cfg)
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
			_, _ = protGet(context.Background(), c, u.URL()+path, "", coordinator.GetOptions{})
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
	c, err := coordinator.New(protConfig(u, coordinator.Protection{}, nil), coordinator.Options{})
	if err != nil {
		t.Fatal(err)
	}
	retrying := make(chan struct{})
	var once sync.Once
	done := make(chan error, 1)
	go func() {
		_, err := protGet(context.Background(), c, u.URL()+"/slow", "", coordinator.GetOptions{Progress: func(p coordinator.Progress) {
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

// TestRateLimitDeadline: a caller whose deadline ends before its slot gets
// RESOURCE_EXHAUSTED at once; one whose deadline allows waits and gets it.
func TestRateLimitDeadline(t *testing.T) {
	u := fakeupstream.New(t)
	in := coorddtest.Start(t, coorddtest.Options{Config: protConfig(u, coordinator.Protection{RateLimit: 1}, nil)})
	cl := in.Dial(t)
	get := func(path string, timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_, err := coorddtest.Get(ctx, cl, &coorddv1.GetOrFetchRequest{Url: u.URL() + path})
		return err
	}
	if err := get("/x1", 5*time.Second); err != nil {
		t.Fatal(err) // takes the slot; the next one is 1s away
	}
	// RESOURCE_EXHAUSTED, not DEADLINE_EXCEEDED: refused at once rather
	// than left to wait out its deadline.
	if err := get("/x2", 300*time.Millisecond); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("slot past the deadline: %v; want RESOURCE_EXHAUSTED", err)
	}
	if err := get("/x3", 5*time.Second); err != nil {
		t.Errorf("slot within the deadline: %v", err)
	}
	if got := u.Count("/x2"); got != 0 {
		t.Errorf("the refused call reached the upstream %d times", got)
	}
}

// TestConditionalRevalidation: an expired copy is revalidated with
// If-None-Match and If-Modified-Since; the 304 makes it fresh again.
func TestConditionalRevalidation(t *testing.T) {
	const lastMod = "Wed, 21 Oct 2026 07:28:00 GMT"
	u := fakeupstream.New(t)
	u.Set("/c", fakeupstream.Behavior{Conditional: true}.WithHeader("Last-Modified", lastMod))
	clk := testclock.New(time.Now())
	cfg := protConfig(u, coordinator.Protection{}, nil)
	cfg.Now = clk.Now
	c := protNew(t, cfg)
	ctx := context.Background()
	if _, err := protGet(ctx, c, u.URL()+"/c", "", coordinator.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(11 * time.Minute) // past the 10m TTL
	res, err := protGet(ctx, c, u.URL()+"/c", "", coordinator.GetOptions{NoStale: true})
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
	if res, _ := protGet(ctx, c, u.URL()+"/c", "", coordinator.GetOptions{}); res == nil || res.Source != coordinator.SourceL1 || res.Stale {
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
	cfg := protConfig(u, coordinator.Protection{}, nil)
	cfg.Now = clk.Now
	c := protNew(t, cfg)
	ctx := context.Background()
	for _, code := range []int{404, 410, 403} {
		path := fmt.Sprintf("/%d", code)
		u.Set(path, fakeupstream.Status(code))
		for range 2 {
			res, err := protGet(ctx, c, u.URL()+path, "", coordinator.GetOptions{})
			if err != nil || res.Doc.StatusCode != code {
				t.Fatalf("%s: %v, %+v; want a %d document", path, err, res, code)
			}
		}
	}
	if a, b, c := u.Count("/404"), u.Count("/410"), u.Count("/403"); a != 1 || b != 1 || c != 2 {
		t.Errorf("upstream requests for 404, 410, 403 = %d, %d, %d; want 1, 1, 2", a, b, c)
	}
	clk.Advance(time.Minute) // the default negative_ttl
	if _, err := protGet(ctx, c, u.URL()+"/404", "", coordinator.GetOptions{}); err != nil {
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
	c := protNew(t, protConfig(u, coordinator.Protection{MaxTTL: 3 * time.Hour}, nil))
	ctx := context.Background()
	for path, want := range map[string]time.Duration{"/long": 2 * time.Hour, "/huge": 3 * time.Hour} {
		res, err := protGet(ctx, c, u.URL()+path, "", coordinator.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Doc.FreshUntil.Sub(res.Doc.FetchedAt); got != want {
			t.Errorf("%s: fresh for %v; want %v", path, got, want)
		}
	}
	for range 2 {
		res, err := protGet(ctx, c, u.URL()+"/nostore", "", coordinator.GetOptions{})
		if err != nil || !bytes.Equal(res.Doc.Body, u.Body("/nostore")) {
			t.Fatalf("no-store: %v; want the document delivered", err)
		}
	}
	if got := u.Count("/nostore"); got != 2 {
		t.Errorf("no-store: upstream requests = %d; want 2 (not cached)", got)
	}
}
