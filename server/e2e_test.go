package server_test

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/enginetest"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/redistest"
	"github.com/coordd/coordd/internal/testing/storetest"
	"github.com/coordd/coordd/internal/testing/testclock"
)

// cluster is n coordd instances sharing one real Redis, in front of one
// fake upstream.
type cluster struct {
	redis     *redistest.Server
	up        *fakeupstream.Upstream
	instances []*fleettest.Instance
	clients   []coorddv1.CoordinatorServiceClient
}

// startCluster starts a Redis and n instances on it (fleettest.StartFleet),
// each configured by tune when it is set.
func startCluster(t testing.TB, n int, tune func(*coordinator.Config)) *cluster {
	t.Helper()
	rs := redistest.Start(t)
	f := fleettest.StartFleet(t, n, fleettest.FleetOptions{RedisURL: rs.URL(), Tune: tune})
	return &cluster{redis: rs, up: f.Up, instances: f.Instances, clients: f.Clients}
}

func (cl *cluster) url(path string) string { return cl.up.URL() + path }

// checkPushOnly fails the test if any follower was woken by its lease
// timer instead of a push.
func (cl *cluster) checkPushOnly(t testing.TB) {
	t.Helper()
	for i, in := range cl.instances {
		if n := in.Metrics.TimerWakeups(); n != 0 {
			t.Fatalf("instance %d: %d followers woken by the lease timer; want every wakeup pushed", i, n)
		}
	}
}

// countPerCall turns off retries and the breaker, for tests that count the
// upstream requests each call makes.
func countPerCall(c *coordinator.Config) {
	for i := range c.Upstreams {
		c.Upstreams[i].Protection.Retry.MaxAttempts = 1
		c.Upstreams[i].Protection.Breaker = coordinator.BreakerPolicy{FailureThreshold: -1, FailureRate: -1}
	}
}

// holdFirst holds the upstream's answers to path from its first request
// until callers callers wait for it across the instances (every one of
// them joined a flight that leads or follows: enginetest.Joined), then runs
// during, if set, then lets every answer through. If ctx ends first, it
// lets them through at once.
func (cl *cluster) holdFirst(ctx context.Context, path string, callers int, during func()) {
	release := make(chan struct{})
	cl.up.Set(path, fakeupstream.Behavior{Block: release})
	go func() {
		defer close(release)
		if cl.awaitJoined(ctx, path, callers) != nil {
			return
		}
		if during != nil {
			during()
		}
	}()
}

// awaitJoined waits until callers callers wait for path across the
// instances, each in a flight that leads or follows (enginetest.Joined),
// or ctx ends.
func (cl *cluster) awaitJoined(ctx context.Context, path string, callers int) error {
	cs := make([]*coordinator.Coordinator, len(cl.instances))
	for i, in := range cl.instances {
		cs[i] = in.Coordinator
	}
	return enginetest.AwaitJoined(ctx, cl.url(path), callers, cs...)
}

// waitUnlocked waits until no instance holds key's fill lock.
func (cl *cluster) waitUnlocked(t testing.TB, key string) {
	t.Helper()
	st := storetest.New(cl.redis.Client(t), "")
	for deadline := time.Now().Add(10 * time.Second); ; {
		held, err := st.LockHeld(context.Background(), key)
		if err == nil && !held {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("fill lock of %s still held", key)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type outcome struct {
	doc      *fleettest.Doc
	err      error
	instance int
	at       time.Time // when the metadata arrived
}

// burst runs callers concurrent GetOrFetch calls for path, spread over the
// instances, released together.
func (cl *cluster) burst(t *testing.T, ctx context.Context, callers int, req func(i int) *coorddv1.GetOrFetchRequest) []outcome {
	t.Helper()
	out := make([]outcome, callers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			k := i % len(cl.clients)
			d, err := fleettest.Get(ctx, cl.clients[k], req(i))
			out[i] = outcome{doc: d, err: err, instance: k, at: time.Now()}
		}()
	}
	close(start)
	wg.Wait()
	return out
}

func TestStampedeAcrossInstances(t *testing.T) {
	cl := startCluster(t, 3, nil)
	const path = "/en-US/docs/Web/API/Fetch"
	// Hold the upstream answer until every caller has joined, so that all
	// 300 are waiting when it lands.
	var landed atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const callers = 300
	cl.holdFirst(ctx, path, callers, func() { landed.Store(time.Now().UnixNano()) })
	out := cl.burst(t, ctx, callers, func(int) *coorddv1.GetOrFetchRequest {
		return &coorddv1.GetOrFetchRequest{Url: cl.url(path)}
	})
	want := cl.up.Body(path)
	sources := map[coorddv1.Source]int{}
	var lags []time.Duration
	for i, o := range out {
		if o.err != nil {
			t.Fatalf("caller %d: %v", i, o.err)
		}
		if !bytes.Equal(o.doc.Body, want) {
			t.Fatalf("caller %d: body differs (%d bytes; want %d)", i, len(o.doc.Body), len(want))
		}
		if o.doc.Meta.GetStatusCode() != 200 || o.doc.Meta.GetStale() {
			t.Fatalf("caller %d: metadata %v", i, o.doc.Meta)
		}
		sources[o.doc.Meta.GetSource()]++
		lags = append(lags, o.at.Sub(time.Unix(0, landed.Load())))
	}
	if got := cl.up.Count(path); got != 1 {
		t.Fatalf("upstream requests = %d; want exactly 1", got)
	}
	var fetched int64
	for _, in := range cl.instances {
		fetched += in.Metrics.Fetches()
	}
	if fetched != 1 {
		t.Fatalf("instances started %d upstream fetches; want 1", fetched)
	}
	cl.checkPushOnly(t)
	// One instance's flight fetched (its callers see UPSTREAM); the other
	// two were pushed the result through Redis (L2).
	if sources[coorddv1.Source_SOURCE_UPSTREAM] != callers/3 || sources[coorddv1.Source_SOURCE_L2] != 2*callers/3 {
		t.Fatalf("sources = %v; want %d UPSTREAM and %d L2", sources, callers/3, 2*callers/3)
	}
	sort.Slice(lags, func(i, j int) bool { return lags[i] < lags[j] })
	p50, p99, worst := lags[len(lags)/2], lags[len(lags)*99/100], lags[len(lags)-1]
	t.Logf("follower lag after the upstream answered (300 callers, 3 instances): p50=%v p99=%v max=%v", p50, p99, worst)
}

func TestLargeBodyStreamsInChunks(t *testing.T) {
	cl := startCluster(t, 2, nil)
	const path = "/big"
	const size = 6 << 20
	cl.up.Set(path, fakeupstream.Behavior{Size: size})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	want := fakeupstream.SizedBody(path, size)
	for i, c := range []coorddv1.CoordinatorServiceClient{cl.clients[0], cl.clients[1], cl.clients[0]} {
		d, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: cl.url(path)})
		if err != nil {
			t.Fatalf("get %d: %v", i, err)
		}
		if !bytes.Equal(d.Body, want) {
			t.Fatalf("get %d: body differs", i)
		}
		if wantChunks := size / (64 << 10); d.Chunks != wantChunks {
			t.Fatalf("get %d: %d chunks; want %d of 64 KiB", i, d.Chunks, wantChunks)
		}
		wantSrc := []coorddv1.Source{coorddv1.Source_SOURCE_UPSTREAM, coorddv1.Source_SOURCE_L2, coorddv1.Source_SOURCE_L1}[i]
		if d.Meta.GetSource() != wantSrc {
			t.Fatalf("get %d: source %v; want %v", i, d.Meta.GetSource(), wantSrc)
		}
	}
	if got := cl.up.Count(path); got != 1 {
		t.Fatalf("upstream requests = %d; want 1", got)
	}
}

func TestBodyOverLimitFailsAndIsNotCached(t *testing.T) {
	cl := startCluster(t, 1, func(c *coordinator.Config) { c.Upstreams[0].MaxBodyBytes = 1000 })
	cl.up.Set("/huge", fakeupstream.Behavior{Size: 5000})
	ctx := context.Background()
	for range 2 {
		_, err := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url("/huge")})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "max_body_bytes") {
			t.Fatalf("err = %v; want FAILED_PRECONDITION naming max_body_bytes", err)
		}
	}
	if got := cl.up.Count("/huge"); got != 2 {
		t.Fatalf("upstream requests = %d; want 2 (never cached)", got)
	}
}

func TestStaleIfErrorAndWhileRevalidate(t *testing.T) {
	clk := testclock.New(time.Now())
	cl := startCluster(t, 2, func(c *coordinator.Config) {
		countPerCall(c)
		c.Now = clk.Now
		c.Upstreams[0].TTL = time.Minute
		c.Upstreams[0].StaleTTL = time.Hour
	})
	const path = "/stale"
	ctx := context.Background()
	get := func(i int, noStale bool) (*fleettest.Doc, error) {
		return fleettest.Get(ctx, cl.clients[i], &coorddv1.GetOrFetchRequest{Url: cl.url(path), NoStale: noStale})
	}
	if _, err := get(0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := get(1, false); err != nil { // instance 1 now holds it in L1 too
		t.Fatal(err)
	}
	// ifError's copy may be served stale instead of an error for an hour,
	// but no longer while it is revalidated: past its TTL, its callers
	// wait for the flight.
	const ifError = "/stale-if-error"
	cl.up.Set(ifError, fakeupstream.Behavior{}.WithHeader("Cache-Control", "max-age=60, stale-while-revalidate=1, stale-if-error=3600"))
	if _, err := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url(ifError)}); err != nil {
		t.Fatal(err)
	}
	want := cl.up.Body(path)
	clk.Advance(2 * time.Minute) // past TTL, inside the stale window
	cl.up.Set(path, fakeupstream.Status(503))
	cl.up.Set(ifError, fakeupstream.Status(503))

	// stale-if-error: the flight fails; the stale copy is served instead,
	// to a call that accepts one.
	d, err := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url(ifError)})
	if err != nil || !d.Meta.GetStale() || !bytes.Equal(d.Body, cl.up.Body(ifError)) || d.Meta.GetStatusCode() != 200 {
		t.Fatalf("stale-if-error call: %v, %+v; want the stale copy", err, d.GetMeta())
	}
	if got := cl.up.Count(ifError); got != 2 {
		t.Fatalf("stale-if-error: upstream requests = %d; want 2 (the fill, the failed refresh)", got)
	}
	// A call that refuses stale copies gets the flight's error.
	if _, err := get(0, true); status.Code(err) != codes.Unavailable {
		t.Fatalf("no_stale call: err = %v; want UNAVAILABLE", err)
	}
	// stale-while-revalidate: served at once from L1, refreshed in the background.
	d, err = get(1, false)
	if err != nil || !d.Meta.GetStale() || !bytes.Equal(d.Body, want) || d.Meta.GetStatusCode() != 200 {
		t.Fatalf("stale call: %v, %+v; want the stale copy", err, d)
	}
	if err := cl.up.WaitCount(ctx, path, 3); err != nil { // 1 fill + the no_stale try + the background refresh
		t.Fatal(err)
	}
	cl.waitUnlocked(t, cl.url(path)) // the failed refresh has ended
	// Once the upstream recovers, a refresh lands and both instances serve it fresh.
	cl.up.Clear(path)
	d, err = get(0, true)
	if err != nil || d.Meta.GetStale() || d.Meta.GetSource() != coorddv1.Source_SOURCE_UPSTREAM {
		t.Fatalf("after recovery: %v, %+v; want a fresh upstream copy", err, d.Meta)
	}
	d, err = get(1, true)
	if err != nil || d.Meta.GetStale() {
		t.Fatalf("instance 1 after recovery: %v, %+v; want fresh", err, d.Meta)
	}
}

func TestStaleIfErrorFromL2(t *testing.T) {
	// A stale copy another instance stored in Redis is served on error.
	clk := testclock.New(time.Now())
	cl := startCluster(t, 2, func(c *coordinator.Config) { c.Now = clk.Now; c.Upstreams[0].TTL = time.Minute })
	ctx := context.Background()
	if _, err := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url("/x")}); err != nil {
		t.Fatal(err)
	}
	// The leader answers its callers before it stores in Redis; the store
	// and the unlock are one script.
	cl.waitUnlocked(t, cl.url("/x"))
	clk.Advance(2 * time.Minute)
	cl.up.Set("/x", fakeupstream.ResetConnection())
	d, err := fleettest.Get(ctx, cl.clients[1], &coorddv1.GetOrFetchRequest{Url: cl.url("/x")})
	if err != nil || !d.Meta.GetStale() || d.Meta.GetSource() != coorddv1.Source_SOURCE_L2 {
		t.Fatalf("got %v, %+v; want the stale L2 copy", err, d)
	}
}

// TestStaleCopyLandedAfterL2MissServedOnError: instance b misses in L2
// while a leads; a lands and unlocks before b asks for the lock, and the
// copy expires. b takes the lock and finds the expired copy on its second
// look: it serves it (stale-while-revalidate) and revalidates it with a
// conditional request. It used to fetch as if the key were cold, and
// failed with the upstream.
func TestStaleCopyLandedAfterL2MissServedOnError(t *testing.T) {
	rs, up, clk := redistest.Start(t), fakeupstream.New(t), testclock.New(time.Now())
	cfg := coordinator.Config{Now: clk.Now, Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: up.URL(), TTL: time.Minute}}}
	countPerCall(&cfg)
	const path = "/late-land"
	proxy := redistest.StartProxy(t, rs.Addr())
	a := fleettest.Start(t, fleettest.Options{RedisURL: rs.URL(), Config: cfg})
	b := fleettest.Start(t, fleettest.Options{RedisURL: proxy.URL(), Config: cfg})
	ca, cb := a.Dial(t), b.Dial(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	release := make(chan struct{})
	up.Set(path, fakeupstream.Behavior{Block: release})
	get := func(c coorddv1.CoordinatorServiceClient, out chan<- outcome) {
		d, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: up.URL() + path})
		out <- outcome{doc: d, err: err}
	}
	ra, rb := make(chan outcome, 1), make(chan outcome, 1)
	go get(ca, ra) // a leads; the upstream holds its answer
	if err := up.WaitCount(ctx, path, 1); err != nil {
		t.Fatal(err)
	}
	held, releaseB := proxy.HoldNext("lock", path)
	go get(cb, rb)
	select { // b's claim (its L2 read) ran: a miss
	case <-held:
	case <-ctx.Done():
		t.Fatal("b's claim never reached Redis")
	}
	close(release)
	if o := <-ra; o.err != nil {
		t.Fatal(o.err)
	}
	want := up.Body(path)
	(&cluster{redis: rs}).waitUnlocked(t, up.URL()+path) // a landed
	clk.Advance(2 * time.Minute)                         // past the TTL, inside the stale window
	up.Set(path, fakeupstream.Status(503))
	releaseB() // b learns of its miss, and finds the lock free
	o := <-rb
	if o.err != nil || !o.doc.Meta.GetStale() || !bytes.Equal(o.doc.Body, want) {
		t.Fatalf("b: %v, %+v; want the stale copy a landed", o.err, o.doc)
	}
	if err := up.WaitCount(ctx, path, 2); err != nil { // b revalidates, in the background
		t.Fatal(err)
	}
	if inm := up.LastHeader(path).Get("If-None-Match"); inm != up.ETag(path) {
		t.Fatalf("b's revalidation If-None-Match = %q; want %q", inm, up.ETag(path))
	}
}

func TestBadInputRefusedBeforeIO(t *testing.T) {
	cl := startCluster(t, 1, nil)
	c := cl.clients[0]
	ctx := context.Background()
	tests := []struct {
		name string
		req  *coorddv1.GetOrFetchRequest
		want codes.Code
	}{
		{"empty", &coorddv1.GetOrFetchRequest{}, codes.InvalidArgument},
		{"relative", &coorddv1.GetOrFetchRequest{Url: "/en-US/docs/Web"}, codes.InvalidArgument},
		{"scheme", &coorddv1.GetOrFetchRequest{Url: "ftp://127.0.0.1/a"}, codes.InvalidArgument},
		{"userinfo", &coorddv1.GetOrFetchRequest{Url: strings.Replace(cl.url("/a"), "http://", "http://u:p@", 1)}, codes.InvalidArgument},
		{"control", &coorddv1.GetOrFetchRequest{Url: cl.url("/a\r\nX-Injected: 1")}, codes.InvalidArgument},
		{"oversized url", &coorddv1.GetOrFetchRequest{Url: cl.url("/" + strings.Repeat("a", 3000))}, codes.InvalidArgument},
		{"oversized key", &coorddv1.GetOrFetchRequest{Url: cl.url("/a"), Key: strings.Repeat("k", 600)}, codes.InvalidArgument},
		{"outside upstream", &coorddv1.GetOrFetchRequest{Url: "https://example.com/a"}, codes.PermissionDenied},
		{"internal host", &coorddv1.GetOrFetchRequest{Url: "http://127.0.0.1:6379/"}, codes.PermissionDenied},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := fleettest.Get(ctx, c, tt.req)
			if got := status.Code(err); got != tt.want {
				t.Fatalf("code = %v (%v); want %v", got, err, tt.want)
			}
		})
	}
	if _, err := c.Invalidate(ctx, &coorddv1.InvalidateRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Invalidate(empty) = %v; want INVALID_ARGUMENT", err)
	}
	if _, err := c.Invalidate(ctx, &coorddv1.InvalidateRequest{Url: "https://example.com/"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("Invalidate(outside) = %v; want PERMISSION_DENIED", err)
	}
	if n := cl.up.Total(); n != 0 {
		t.Fatalf("upstream saw %d requests; want 0", n)
	}
	// And the server still serves.
	if _, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: cl.url("/ok")}); err != nil {
		t.Fatalf("after bad input: %v", err)
	}
}

func TestUpstreamStatuses(t *testing.T) {
	cl := startCluster(t, 1, countPerCall)
	ctx := context.Background()
	cl.up.Set("/missing", fakeupstream.Status(404))
	cl.up.Set("/gone", fakeupstream.Status(410))
	cl.up.Set("/forbidden", fakeupstream.Status(403))
	cl.up.Set("/broken", fakeupstream.Status(500))
	cl.up.Set("/outside", fakeupstream.Redirect("https://example.com/elsewhere"))
	cl.up.Set("/inside", fakeupstream.Redirect("/target"))
	tests := []struct {
		path      string
		wantCode  codes.Code
		wantHTTP  int32
		wantCount int // upstream requests after two calls
	}{
		{"/missing", codes.OK, 404, 1},   // cached briefly
		{"/gone", codes.OK, 410, 1},      // cached briefly
		{"/forbidden", codes.OK, 403, 2}, // delivered as is, not cached
		{"/broken", codes.Unavailable, 0, 2},
		{"/outside", codes.OK, 302, 2}, // not followed out of the upstream
		{"/inside", codes.OK, 200, 1},  // followed within it
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			for range 2 {
				d, err := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url(tt.path)})
				if status.Code(err) != tt.wantCode {
					t.Fatalf("code = %v (%v); want %v", status.Code(err), err, tt.wantCode)
				}
				if err == nil && d.Meta.GetStatusCode() != tt.wantHTTP {
					t.Fatalf("status_code = %d; want %d", d.Meta.GetStatusCode(), tt.wantHTTP)
				}
			}
			if got := cl.up.Count(tt.path); got != tt.wantCount {
				t.Fatalf("upstream requests = %d; want %d", got, tt.wantCount)
			}
		})
	}
	if got := cl.up.Count("/target"); got != 1 {
		t.Fatalf("redirect target requests = %d; want 1", got)
	}
}

func TestInvalidateEveryInstance(t *testing.T) {
	cl := startCluster(t, 3, nil)
	ctx := context.Background()
	const path = "/inval"
	for _, c := range cl.clients {
		if _, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: cl.url(path)}); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := cl.clients[2].Invalidate(ctx, &coorddv1.InvalidateRequest{Url: cl.url(path)})
	if err != nil || !resp.GetExisted() {
		t.Fatalf("Invalidate = %v, %v; want existed", resp, err)
	}
	// The invalidation reaches the other instances through pub/sub; wait
	// for their L1 to drop it rather than sleeping.
	deadline := time.Now().Add(5 * time.Second)
	for _, c := range cl.clients {
		for {
			d, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: cl.url(path)})
			if err != nil {
				t.Fatal(err)
			}
			if d.Meta.GetSource() != coorddv1.Source_SOURCE_L1 || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if got := cl.up.Count(path); got != 2 {
		t.Fatalf("upstream requests = %d; want 2 (one before, one after invalidation)", got)
	}
}

func TestSingleNodeMode(t *testing.T) {
	up := fakeupstream.New(t)
	in := fleettest.Start(t, fleettest.Options{Config: coordinator.Config{Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: up.URL()}}}})
	c := in.Dial(t)
	release := make(chan struct{})
	up.Set("/a", fakeupstream.Behavior{Block: release})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go func() { _ = enginetest.AwaitJoined(ctx, up.URL()+"/a", 200, in.Coordinator); close(release) }()
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: up.URL() + "/a"})
			if err == nil && !bytes.Equal(d.Body, up.Body("/a")) {
				err = fmt.Errorf("body differs")
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := up.Count("/a"); got != 1 {
		t.Fatalf("upstream requests = %d; want 1", got)
	}
}
