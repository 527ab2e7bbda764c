package server_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/enginetest"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/testclock"
)

// TestWatchdogHoldsLeaseForSlowUpstream: an upstream slower than the lock
// lease never lets a second instance in, because the watchdog extends it.
func TestWatchdogHoldsLeaseForSlowUpstream(t *testing.T) {
	cl := startCluster(t, 3, func(c *coordinator.Config) { c.LockTTL = 300 * time.Millisecond })
	cl.up.Set("/slow", fakeupstream.Behavior{Delay: 1500 * time.Millisecond}) // 5 leases
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out := cl.burst(t, ctx, 90, func(int) *coorddv1.GetOrFetchRequest { return &coorddv1.GetOrFetchRequest{Url: cl.url("/slow")} })
	checkAll(t, out, cl.up.Body("/slow"))
	if got := cl.up.Count("/slow"); got != 1 {
		t.Fatalf("upstream requests = %d; want 1 (lease extended while fetching)", got)
	}
}

// TestProgressEvents: the leader's callers see FETCHING, other instances'
// see WAITING_LEADER, later callers are hits.
func TestProgressEvents(t *testing.T) {
	cl := startCluster(t, 2, nil)
	release := make(chan struct{})
	cl.up.Set("/p", fakeupstream.Behavior{Block: release})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type res struct {
		d   *fleettest.Doc
		err error
	}
	leader, follower := make(chan res, 1), make(chan res, 1)
	go func() {
		d, err := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url("/p")})
		leader <- res{d, err}
	}()
	if err := cl.up.WaitCount(ctx, "/p", 1); err != nil {
		t.Fatal(err)
	}
	go func() {
		d, err := fleettest.Get(ctx, cl.clients[1], &coorddv1.GetOrFetchRequest{Url: cl.url("/p")})
		follower <- res{d, err}
	}()
	if err := cl.awaitJoined(ctx, "/p", 2); err != nil {
		t.Fatal(err)
	}
	close(release)
	has := func(d *fleettest.Doc, role coorddv1.Role, stage coorddv1.Stage) bool {
		for _, p := range d.Progress {
			if p.GetRole() == role && p.GetStage() == stage {
				return true
			}
		}
		return false
	}
	l, f := <-leader, <-follower
	if l.err != nil || f.err != nil {
		t.Fatalf("errors: %v, %v", l.err, f.err)
	}
	if !has(l.d, coorddv1.Role_ROLE_LEADER, coorddv1.Stage_STAGE_FETCHING) || l.d.Meta.GetSource() != coorddv1.Source_SOURCE_UPSTREAM {
		t.Fatalf("leader progress %v, source %v; want LEADER/FETCHING and UPSTREAM", l.d.Progress, l.d.Meta.GetSource())
	}
	if !has(f.d, coorddv1.Role_ROLE_FOLLOWER, coorddv1.Stage_STAGE_WAITING_LEADER) || f.d.Meta.GetSource() != coorddv1.Source_SOURCE_L2 {
		t.Fatalf("follower progress %v, source %v; want FOLLOWER/WAITING_LEADER and L2", f.d.Progress, f.d.Meta.GetSource())
	}
	h, err := fleettest.Get(ctx, cl.clients[1], &coorddv1.GetOrFetchRequest{Url: cl.url("/p")})
	if err != nil || !has(h, coorddv1.Role_ROLE_HIT, coorddv1.Stage_STAGE_UNSPECIFIED) || h.Meta.GetSource() != coorddv1.Source_SOURCE_L1 {
		t.Fatalf("hit: %v, %v; want ROLE_HIT from L1", err, h)
	}
}

func TestUpstreamTimeout(t *testing.T) {
	cl := startCluster(t, 1, func(c *coordinator.Config) { c.Upstreams[0].Timeout = 200 * time.Millisecond })
	cl.up.Set("/hang", fakeupstream.Hang())
	_, err := fleettest.Get(context.Background(), cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url("/hang")})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("err = %v; want UNAVAILABLE after the per-attempt timeout", err)
	}
}

// TestCustomKeyCannotPoison: a caller-chosen key never answers for
// another url: not for the url whose canonical form it spells, not for
// another url sharing the key (even joining at the same moment), and
// Invalidate by key is held to the allow-list.
func TestCustomKeyCannotPoison(t *testing.T) {
	cl := startCluster(t, 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	get := func(i int, path, key string) *fleettest.Doc {
		t.Helper()
		d, err := fleettest.Get(ctx, cl.clients[i], &coorddv1.GetOrFetchRequest{Url: cl.url(path), Key: key})
		if err != nil {
			t.Fatalf("GetOrFetch(%s, key %q): %v", path, key, err)
		}
		return d
	}
	// A key spelling /b's canonical url, used for /a, is not /b's entry.
	get(0, "/a", cl.url("/b"))
	if d := get(1, "/b", ""); !bytes.Equal(d.Body, cl.up.Body("/b")) {
		t.Fatalf("plain caller of /b got %q...; want /b's body (cache poisoned through key)", d.Body[:40])
	}
	// A key stored by one url is a miss for another.
	if d := get(0, "/v1/page", "page"); d.Meta.GetKey() != "page" || !bytes.Equal(d.Body, cl.up.Body("/v1/page")) {
		t.Fatalf("key %q, body of another url", d.Meta.GetKey())
	}
	if d := get(1, "/v2/page", "page"); !bytes.Equal(d.Body, cl.up.Body("/v2/page")) {
		t.Fatal("/v2/page with key page got /v1/page's body")
	}
	// Two urls with one key at the same moment never share a flight.
	release := make(chan struct{})
	cl.up.Set("/x1", fakeupstream.Behavior{Block: release})
	cl.up.Set("/x2", fakeupstream.Behavior{Block: release})
	var wg sync.WaitGroup
	bodies := make([][]byte, 20)
	errs := make([]error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := fleettest.Get(ctx, cl.clients[i%2], &coorddv1.GetOrFetchRequest{Url: cl.url(fmt.Sprintf("/x%d", 1+i%2)), Key: "shared"})
			if d != nil {
				bodies[i] = d.Body
			}
			errs[i] = err
		}()
	}
	cs := []*coordinator.Coordinator{cl.instances[0].Coordinator, cl.instances[1].Coordinator}
	if err := enginetest.AwaitJoined(ctx, "shared", 20, cs...); err != nil {
		t.Fatal(err)
	}
	close(release)
	wg.Wait()
	for i := range 20 {
		path := fmt.Sprintf("/x%d", 1+i%2)
		if errs[i] != nil || !bytes.Equal(bodies[i], cl.up.Body(path)) {
			t.Fatalf("caller %d of %s (key shared): %v, got another url's body or none", i, path, errs[i])
		}
	}
	// Invalidate by key: a url outside every upstream is refused; a url
	// inside is its document; a bare key is that key in each upstream.
	if _, err := cl.clients[0].Invalidate(ctx, &coorddv1.InvalidateRequest{Key: "https://example.com/x"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("Invalidate(key outside) = %v; want PERMISSION_DENIED", err)
	}
	if r, err := cl.clients[0].Invalidate(ctx, &coorddv1.InvalidateRequest{Key: cl.url("/b")}); err != nil || !r.GetExisted() {
		t.Fatalf("Invalidate(key = /b's url) = %v, %v; want /b's document removed", r, err)
	}
	if r, err := cl.clients[1].Invalidate(ctx, &coorddv1.InvalidateRequest{Key: "page"}); err != nil || !r.GetExisted() {
		t.Fatalf("Invalidate(key page) = %v, %v; want existed", r, err)
	}
}

// TestManyKeysWithCancellations is a chaos burst: 3 instances, 40 keys,
// 600 callers, a third of whom give up at a random moment. Every key is
// fetched once, and every caller that stays gets its key's bytes.
func TestManyKeysWithCancellations(t *testing.T) {
	cl := startCluster(t, 3, func(c *coordinator.Config) { c.Upstreams[0].Protection.RateLimit = 100 })
	const keys, callers = 40, 600
	for k := range keys {
		cl.up.Set(fmt.Sprintf("/k%d", k), fakeupstream.Behavior{Delay: time.Duration(k%5) * 30 * time.Millisecond, Size: 1000 + k*3000})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			path := fmt.Sprintf("/k%d", i%keys)
			cctx := ctx
			if i%3 == 0 {
				var ccancel context.CancelFunc
				cctx, ccancel = context.WithTimeout(ctx, time.Duration(rand.N(150))*time.Millisecond)
				defer ccancel()
			}
			d, err := fleettest.Get(cctx, cl.clients[i%3], &coorddv1.GetOrFetchRequest{Url: cl.url(path)})
			if i%3 == 0 {
				// A short deadline may also mean no rate-limit slot in time.
				if c := status.Code(err); err != nil && c != codes.DeadlineExceeded && c != codes.Canceled && c != codes.ResourceExhausted {
					errs <- fmt.Errorf("caller %d: %v", i, err)
				}
				return
			}
			if err != nil {
				errs <- fmt.Errorf("caller %d: %v", i, err)
				return
			}
			if !bytes.Equal(d.Body, fakeupstream.SizedBody(path, 1000+(i%keys)*3000)) {
				errs <- fmt.Errorf("caller %d: body differs", i)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for k := range keys {
		if got := cl.up.Count(fmt.Sprintf("/k%d", k)); got != 1 {
			t.Fatalf("/k%d: upstream requests = %d; want 1", k, got)
		}
	}
	cl.checkPushOnly(t)
}

// TestStaleRefreshedByOneInstance: every instance holds a stale copy and
// serves it at once to a burst of callers; exactly one instance refreshes
// it (stale-while-revalidate under the fill lock).
func TestStaleRefreshedByOneInstance(t *testing.T) {
	clk := testclock.New(time.Now())
	cl := startCluster(t, 3, func(c *coordinator.Config) { c.Now = clk.Now; c.Upstreams[0].TTL = time.Minute })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, c := range cl.clients { // every L1 holds the document
		if _, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: cl.url("/swr")}); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(2 * time.Minute)
	release := make(chan struct{})
	cl.up.Set("/swr", fakeupstream.Behavior{Block: release})
	out := cl.burst(t, ctx, 150, func(int) *coorddv1.GetOrFetchRequest { return &coorddv1.GetOrFetchRequest{Url: cl.url("/swr")} })
	for i, o := range out {
		if o.err != nil || !o.doc.Meta.GetStale() {
			t.Fatalf("caller %d: %v, %v; want the stale copy at once", i, o.err, o.doc.GetMeta())
		}
	}
	close(release)
	cl.waitUnlocked(t, cl.url("/swr"))
	if got := cl.up.Count("/swr"); got != 2 {
		t.Fatalf("upstream requests = %d; want 2 (the first fill, then one refresh for all instances)", got)
	}
	// After the refresh, a no_stale caller anywhere gets the fresh copy.
	for i, c := range cl.clients {
		d, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: cl.url("/swr"), NoStale: true})
		if err != nil || d.Meta.GetStale() {
			t.Fatalf("instance %d after refresh: %v, %v", i, err, d.GetMeta())
		}
	}
	if got := cl.up.Count("/swr"); got != 2 {
		t.Fatalf("upstream requests = %d after the refresh; want still 2", got)
	}
}

// TestStuckReaderBlocksNoOne: callers that open a stream for a large
// document and never read it hold only their own stream; everyone else
// gets the document.
func TestStuckReaderBlocksNoOne(t *testing.T) {
	cl := startCluster(t, 1, nil)
	const size = 2 << 20 // well over the stream flow-control windows
	cl.up.Set("/big", fakeupstream.Behavior{Size: size})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stuckCtx, unstick := context.WithCancel(ctx)
	for range 5 {
		st, err := cl.clients[0].GetOrFetch(stuckCtx, &coorddv1.GetOrFetchRequest{Url: cl.url("/big")})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil { // read one message, then stall
			t.Fatal(err)
		}
	}
	out := cl.burst(t, ctx, 20, func(int) *coorddv1.GetOrFetchRequest { return &coorddv1.GetOrFetchRequest{Url: cl.url("/big")} })
	checkAll(t, out, fakeupstream.SizedBody("/big", size))
	unstick()
	if got := cl.up.Count("/big"); got != 1 {
		t.Fatalf("upstream requests = %d; want 1", got)
	}
}

// TestMaxAge: a caller's max_age refuses older copies, fresh or stale, in
// L1 and L2; the newer copy is fetched once for everyone who needs it.
func TestMaxAge(t *testing.T) {
	clk := testclock.New(time.Now())
	cl := startCluster(t, 2, func(c *coordinator.Config) { c.Now = clk.Now; c.Upstreams[0].TTL = 10 * time.Minute })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	get := func(i int, maxAge time.Duration) *fleettest.Doc {
		t.Helper()
		req := &coorddv1.GetOrFetchRequest{Url: cl.url("/age")}
		if maxAge > 0 {
			req.MaxAge = durationpb.New(maxAge)
		}
		d, err := fleettest.Get(ctx, cl.clients[i], req)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	get(0, 0)
	clk.Advance(5 * time.Minute) // fresh for 5 more minutes, but 5 minutes old
	if d := get(0, 10*time.Minute); d.Meta.GetSource() != coorddv1.Source_SOURCE_L1 {
		t.Fatalf("max_age 10m: source %v; want the L1 copy", d.Meta.GetSource())
	}
	// Concurrent callers on both instances that want at most 1 minute:
	// one new fetch, shared.
	out := cl.burst(t, ctx, 60, func(int) *coorddv1.GetOrFetchRequest {
		return &coorddv1.GetOrFetchRequest{Url: cl.url("/age"), MaxAge: durationpb.New(time.Minute)}
	})
	for i, o := range out {
		if o.err != nil {
			t.Fatalf("caller %d: %v", i, o.err)
		}
		if age := o.doc.Meta.GetAge().AsDuration(); age > time.Minute {
			t.Fatalf("caller %d: age %v; want at most 1m", i, age)
		}
	}
	if got := cl.up.Count("/age"); got != 2 {
		t.Fatalf("upstream requests = %d; want 2 (the first fill, one refetch for max_age)", got)
	}
	// The newer copy now serves everyone, from either tier.
	if d := get(1, time.Minute); d.Meta.GetSource() == coorddv1.Source_SOURCE_UPSTREAM {
		t.Fatal("refetched a copy that is recent enough")
	}
	if _, err := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url("/age"), MaxAge: durationpb.New(-time.Second)}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("negative max_age: %v; want INVALID_ARGUMENT", err)
	}
	if got := cl.up.Count("/age"); got != 2 {
		t.Fatalf("upstream requests = %d; want still 2", got)
	}
}
