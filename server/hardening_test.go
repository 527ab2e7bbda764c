package server_test

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/enginetest"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/redistest"
	"github.com/coordd/coordd/internal/testing/storetest"
	"github.com/coordd/coordd/internal/testing/testclock"
)

// Tests of the coordination protocol's hardening: failed writes and lost
// replies never make followers wait a whole lease, Invalidate fences fills
// in flight, events are taken only from the leader waited for.

// slowLease makes a lease long enough that a follower woken by its timer
// instead of a push shows in Metrics.TimerWakeups, and fails the test.
func slowLease(c *coordinator.Config) {
	c.LockTTL = 3 * time.Second
	c.RedisTimeout = 300 * time.Millisecond
	c.RedisRetryInterval = 100 * time.Millisecond
}

// TestFailedL2WriteWakesFollowers: the leader's L2 write is refused (OOM
// under maxmemory noeviction). An OOM is "this write failed", not "Redis
// is down": no instance degrades, and the followers on the other
// instances are pushed a release at once instead of waiting out the lease.
func TestFailedL2WriteWakesFollowers(t *testing.T) {
	cl := startCluster(t, 3, slowLease)
	const path = "/oom"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb := cl.redis.Client(t)
	cl.holdFirst(ctx, path, 90, func() {
		if err := rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
			t.Error(err)
		}
		if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
			t.Error(err)
		}
	})
	out := cl.burst(t, ctx, 90, func(int) *coorddv1.GetOrFetchRequest { return &coorddv1.GetOrFetchRequest{Url: cl.url(path)} })
	checkAll(t, out, cl.up.Body(path))
	cl.checkPushOnly(t)
	for i, in := range cl.instances {
		if !in.Coordinator.RedisHealthy() || in.Metrics.RedisDowns() != 0 {
			t.Fatalf("instance %d: healthy %v after %d down transitions; want Redis never marked down by an OOM reply",
				i, in.Coordinator.RedisHealthy(), in.Metrics.RedisDowns())
		}
	}
	if _, per := totalFetches(cl); per[0]+per[1]+per[2] > 3 {
		t.Fatalf("upstream fetches per instance %v; want at most one each", per)
	}
}

// TestLostLockReplyStillWakesFollowers: the reply to instance 0's lock
// request is lost (the command ran; the reply never came back within the
// timeout), so it leads holding a lock it does not know it has. Its
// landing still uses the lock's token: the follower on instance 1 is
// pushed the document, and nobody fetches twice.
func TestLostLockReplyStillWakesFollowers(t *testing.T) {
	rs := redistest.Start(t)
	up := fakeupstream.New(t)
	cfg := coordinator.Config{Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: up.URL()}}}
	slowLease(&cfg)
	const path = "/lost-reply"
	proxy := redistest.StartProxy(t, rs.Addr())
	a := fleettest.Start(t, fleettest.Options{RedisURL: proxy.URL(), Config: cfg})
	b := fleettest.Start(t, fleettest.Options{RedisURL: rs.URL(), Config: cfg})
	ca, cb := a.Dial(t), b.Dial(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Load the scripts into Redis, so the lock command runs at once.
	if _, err := fleettest.Get(ctx, ca, &coorddv1.GetOrFetchRequest{Url: up.URL() + "/warm"}); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	up.Set(path, fakeupstream.Behavior{Block: release})
	held, _ := proxy.HoldNext("lock", path)
	get := func(c coorddv1.CoordinatorServiceClient, who string, out chan<- error) {
		d, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: up.URL() + path})
		if err == nil && !bytes.Equal(d.Body, up.Body(path)) {
			err = errShape(who + ": wrong body")
		}
		out <- err
	}
	leader, follower := make(chan error, 1), make(chan error, 1)
	go get(ca, "leader", leader)
	if err := up.WaitCount(ctx, path, 1); err != nil {
		t.Fatal(err)
	}
	<-held // the lock command ran, its reply lost
	go get(cb, "follower", follower)
	if err := enginetest.AwaitJoined(ctx, up.URL()+path, 1, b.Coordinator); err != nil { // the follower subscribed
		t.Fatal(err)
	}
	close(release)
	if err := <-leader; err != nil {
		t.Fatal(err)
	}
	if err := <-follower; err != nil {
		t.Fatal(err)
	}
	if n := b.Metrics.TimerWakeups(); n != 0 {
		t.Fatalf("the follower was woken by its lease timer (%d); want a push", n)
	}
	if got := up.Count(path); got != 1 {
		t.Fatalf("upstream requests = %d; want 1", got)
	}
}

type errShape string

func (e errShape) Error() string { return string(e) }

// TestInvalidateFencesFillInFlight: a fill that started before Invalidate
// never lands its older body afterwards, in L1 or L2, on any instance.
func TestInvalidateFencesFillInFlight(t *testing.T) {
	cl := startCluster(t, 2, slowLease)
	const path = "/fenced"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	release := make(chan struct{})
	old, cur := []byte("old body"), []byte("new body")
	cl.up.SetSequence(path, []fakeupstream.Behavior{{Block: release, Body: old}, {Body: cur}})
	first := make(chan *fleettest.Doc, 1)
	go func() {
		d, _ := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url(path)})
		first <- d
	}()
	if err := cl.up.WaitCount(ctx, path, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.clients[1].Invalidate(ctx, &coorddv1.InvalidateRequest{Url: cl.url(path)}); err != nil {
		t.Fatal(err)
	}
	// The invalidation reaches instance 0 by pub/sub; it fences the running
	// flight there, which then leaves the instance's flights.
	waitFor(t, 10*time.Second, func() bool { return cl.instances[0].Metrics.RunningFlights() == 0 })
	close(release)
	<-first // joined before the invalidation: either body is fine
	for i, c := range cl.clients {
		for range 2 {
			d, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: cl.url(path)})
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(d.Body, cur) {
				t.Fatalf("instance %d after Invalidate: got %q from %v; want %q (a fill from before the invalidation landed)", i, d.Body, d.Meta.GetSource(), cur)
			}
		}
	}
}

// TestInvalidateWithdrawsFlightsStaleCopy: while a refresh runs, its
// stale copy is offered to new callers; after Invalidate, it is not.
func TestInvalidateWithdrawsFlightsStaleCopy(t *testing.T) {
	clk := testclock.New(time.Now())
	cl := startCluster(t, 1, func(c *coordinator.Config) {
		c.Now = clk.Now
		c.Upstreams[0].TTL = time.Minute
	})
	const path = "/withdrawn"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	release := make(chan struct{})
	v0, v1, v2 := []byte("v0"), []byte("v1"), []byte("v2")
	cl.up.SetSequence(path, []fakeupstream.Behavior{{Body: v0}, {Block: release, Body: v1}, {Body: v2}})
	defer close(release)
	c := cl.clients[0]
	if _, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: cl.url(path)}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Minute) // stale
	if d, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: cl.url(path)}); err != nil || !d.Meta.GetStale() {
		t.Fatalf("%v, %v; want the stale copy while the refresh runs", err, d.GetMeta())
	}
	if err := cl.up.WaitCount(ctx, path, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Invalidate(ctx, &coorddv1.InvalidateRequest{Url: cl.url(path)}); err != nil {
		t.Fatal(err)
	}
	d, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: cl.url(path)})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(d.Body, v2) {
		t.Fatalf("after Invalidate: got %q (stale %v); want %q, fetched anew", d.Body, d.Meta.GetStale(), v2)
	}
}

// TestLateFailFromAnotherLeaderIgnored: a fail event that does not carry
// the token of the lock the follower waits on (an earlier leader's, sent
// late) does not fail the follower.
func TestLateFailFromAnotherLeaderIgnored(t *testing.T) {
	cl := startCluster(t, 2, slowLease)
	const path = "/late-fail"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := storetest.New(cl.redis.Client(t), "")
	// A marker in both instances' L1, dropped by an invalidation that the
	// leader's instance publishes after the fail event: once the
	// follower's instance dropped it, it had received the fail.
	const marker = "/late-fail-marker"
	for _, c := range cl.clients {
		if _, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: cl.url(marker)}); err != nil {
			t.Fatal(err)
		}
	}
	cl.holdFirst(ctx, path, 20, func() {
		ev := storetest.Event{Type: storetest.EventFail, Key: cl.url(path), Token: "an-earlier-leader", Kind: "unavailable", Msg: "late"}
		if err := st.Publish(ctx, ev); err != nil {
			t.Error(err)
		}
		follower := 0
		for i, in := range cl.instances {
			for _, f := range enginetest.Flights(in.Coordinator) {
				if f.URL == cl.url(path) && f.Role == "follower" {
					follower = i
				}
			}
		}
		if _, err := cl.clients[1-follower].Invalidate(ctx, &coorddv1.InvalidateRequest{Url: cl.url(marker)}); err != nil {
			t.Error(err)
		}
		err := enginetest.Poll(ctx, func() bool { return cl.instances[follower].Coordinator.L1Stats().Entries == 0 })
		if err != nil {
			t.Errorf("the invalidation published after the fail event never reached both instances: %v", err)
		}
	})
	out := cl.burst(t, ctx, 20, func(int) *coorddv1.GetOrFetchRequest { return &coorddv1.GetOrFetchRequest{Url: cl.url(path)} })
	checkAll(t, out, cl.up.Body(path))
	if got := cl.up.Count(path); got != 1 {
		t.Fatalf("upstream requests = %d; want 1", got)
	}
}

// TestOlderL2CopyNeverReplacesNewerL1: an instance whose L1 holds a newer
// copy than L2 (its L2 write was refused) keeps serving the newer one.
func TestOlderL2CopyNeverReplacesNewerL1(t *testing.T) {
	clk := testclock.New(time.Now())
	cl := startCluster(t, 1, func(c *coordinator.Config) {
		c.Now = clk.Now
		c.Upstreams[0].TTL = time.Minute
		c.RefreshCooldown = -1
		countPerCall(c)
	})
	const path = "/newer"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v1, v2 := []byte("v1"), []byte("v2")
	cl.up.SetSequence(path, []fakeupstream.Behavior{{Body: v1}, {Body: v2}, fakeupstream.Status(503)})
	c := cl.clients[0]
	rdb := cl.redis.Client(t)
	get := func() *fleettest.Doc {
		t.Helper()
		d, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: cl.url(path)})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	get() // v1 in L1 and L2
	clk.Advance(2 * time.Minute)
	// The refresh to v2 lands in L1, but L2 refuses the write.
	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if d, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: cl.url(path), NoStale: true}); err != nil || !bytes.Equal(d.Body, v2) {
		t.Fatalf("refresh: %v, %q; want v2", err, d.GetMeta())
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, cl.instances[0].Coordinator.RedisHealthy) // the refresh below reads L2
	clk.Advance(2 * time.Minute)                                         // v2 stale too; the next refresh fails
	if d := get(); !bytes.Equal(d.Body, v2) {
		t.Fatalf("got %q; want v2", d.Body)
	}
	if err := cl.up.WaitCount(ctx, path, 3); err != nil { // the refresh read L2, then failed
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() bool { return cl.instances[0].Metrics.RunningFlights() == 0 })
	for range 2 {
		if d := get(); !bytes.Equal(d.Body, v2) {
			t.Fatalf("got %q (source %v); want v2: the older L2 copy replaced the newer L1 one", d.Body, d.Meta.GetSource())
		}
	}
}

// TestMaxAgeFloor: a max_age under the floor is raised to it, so that
// callers cannot turn every call into an upstream request.
func TestMaxAgeFloor(t *testing.T) {
	clk := testclock.New(time.Now())
	cl := startCluster(t, 1, func(c *coordinator.Config) { c.Now = clk.Now; c.MaxAgeFloor = 10 * time.Second })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 20 {
		clk.Advance(100 * time.Millisecond)
		if _, err := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url("/floor"), MaxAge: durationpb.New(time.Nanosecond)}); err != nil {
			t.Fatal(err)
		}
	}
	if got := cl.up.Count("/floor"); got != 1 {
		t.Fatalf("upstream requests = %d for 20 calls with max_age 1ns within 2s; want 1 (max_age raised to the 10s floor)", got)
	}
	clk.Advance(10 * time.Second)
	if _, err := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url("/floor"), MaxAge: durationpb.New(time.Nanosecond)}); err != nil {
		t.Fatal(err)
	}
	if got := cl.up.Count("/floor"); got != 2 {
		t.Fatalf("upstream requests = %d; want 2 once the copy is older than the floor", got)
	}
}

// TestBypassDoesNotQueueAheadOfColdMisses: with the rate limit's queue
// full of cold misses, callers refusing fresh copies through max_age do
// not take slots ahead of them: they are refused (or served) at once,
// and every cold miss is answered.
func TestBypassDoesNotQueueAheadOfColdMisses(t *testing.T) {
	clk := testclock.New(time.Now())
	cl := startCluster(t, 1, func(c *coordinator.Config) {
		c.Now = clk.Now
		c.MaxAgeFloor = time.Second
		c.Upstreams[0].Protection.RateLimit = 5
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 5 {
		if _, err := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url("/hot/" + string(rune('a'+i)))}); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(2 * time.Second) // the hot copies are fresh, but older than a bypass wants
	var wg sync.WaitGroup
	coldErrs := make(chan error, 10)
	for i := range 10 {
		wg.Go(func() {
			_, err := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url("/cold/" + string(rune('a'+i)))})
			coldErrs <- err
		})
	}
	// Once the cold misses queue (the 2nd has asked upstream, the rest
	// wait), the bypassing callers come.
	waitFor(t, 10*time.Second, func() bool { return cl.up.Total() >= 7 })
	var bypass []*fleettest.Doc
	var mu sync.Mutex
	for i := range 5 {
		wg.Go(func() {
			d, _ := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url("/hot/" + string(rune('a'+i))), MaxAge: durationpb.New(time.Second)})
			mu.Lock()
			bypass = append(bypass, d)
			mu.Unlock()
		})
	}
	wg.Wait()
	close(coldErrs)
	for err := range coldErrs {
		if err != nil {
			t.Fatalf("cold miss: %v", err)
		}
	}
	hot := 0
	for _, p := range cl.up.Paths() {
		if len(p) > 5 && p[:5] == "/hot/" {
			hot += cl.up.Count(p)
		}
	}
	t.Logf("bypassing callers caused %d upstream requests while 10 cold misses queued", hot-5)
	if hot-5 > 1 {
		t.Fatalf("bypassing callers took %d slots while cold misses queued; want at most 1", hot-5)
	}
}

// TestRedisFlapsEveryInstanceRecovers: Redis killed and restarted over
// and over, with traffic; every instance ends coordinating again (the
// health state has one owner, so no recovery is lost), and a new cold key
// is then fetched once across instances.
func TestRedisFlapsEveryInstanceRecovers(t *testing.T) {
	cl := startCluster(t, 3, fastRedis)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range cl.clients {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				_, _ = fleettest.Get(ctx, cl.clients[i], &coorddv1.GetOrFetchRequest{Url: cl.url("/flap/" + string(rune('a'+n%20)))})
			}
		})
	}
	// Each flap is seen by every instance (none believes Redis up); Redis
	// dies again as soon as one instance is back, while the others may be
	// in the middle of recovering.
	for range 6 {
		cl.redis.Kill()
		waitFor(t, 10*time.Second, func() bool {
			for _, in := range cl.instances {
				if in.Coordinator.RedisHealthy() {
					return false
				}
			}
			return true
		})
		cl.redis.Restart()
		waitFor(t, 10*time.Second, func() bool {
			for _, in := range cl.instances {
				if in.Coordinator.RedisHealthy() {
					return true
				}
			}
			return false
		})
	}
	close(stop)
	wg.Wait()
	waitFor(t, 15*time.Second, func() bool {
		for _, in := range cl.instances {
			if !in.Coordinator.RedisHealthy() {
				return false
			}
		}
		return true
	})
	const path = "/after-flaps"
	cl.holdFirst(ctx, path, 60, nil)
	out := cl.burst(t, ctx, 60, func(int) *coorddv1.GetOrFetchRequest { return &coorddv1.GetOrFetchRequest{Url: cl.url(path)} })
	checkAll(t, out, cl.up.Body(path))
	if got := cl.up.Count(path); got != 1 {
		t.Fatalf("after the flaps: upstream requests = %d; want 1", got)
	}
}

// TestUncacheableAnswerDropsStaleCopy: a url whose refresh answers
// something uncacheable (here a 403) stops being served from its old copy,
// on this instance (L1) and the others (L2).
func TestUncacheableAnswerDropsStaleCopy(t *testing.T) {
	clk := testclock.New(time.Now())
	cl := startCluster(t, 2, func(c *coordinator.Config) {
		c.Now = clk.Now
		c.Upstreams[0].TTL = time.Minute
		countPerCall(c)
	})
	const path = "/turned-forbidden"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl.up.SetSequence(path, []fakeupstream.Behavior{{}, fakeupstream.Status(403)})
	get := func(i int) *fleettest.Doc {
		t.Helper()
		d, err := fleettest.Get(ctx, cl.clients[i], &coorddv1.GetOrFetchRequest{Url: cl.url(path)})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	get(0)
	get(1)
	clk.Advance(2 * time.Minute)
	if d := get(0); !d.Meta.GetStale() || d.Meta.GetStatusCode() != 200 {
		t.Fatalf("first call past ttl: %v; want the stale 200 while it refreshes", d.Meta)
	}
	if err := cl.up.WaitCount(ctx, path, 2); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() bool { return cl.instances[0].Metrics.RunningFlights() == 0 })
	if d := get(0); d.Meta.GetStatusCode() != 403 {
		t.Fatalf("instance 0 after the refresh answered 403: status %d (stale %v); want 403, the old copy dropped",
			d.Meta.GetStatusCode(), d.Meta.GetStale())
	}
	// Instance 1 drops its copy when the leader's announcement reaches it.
	var d *fleettest.Doc
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if d = get(1); d.Meta.GetStatusCode() == 403 || time.Now().After(deadline) {
			break
		}
	}
	if d.Meta.GetStatusCode() != 403 {
		t.Fatalf("instance 1 after the refresh answered 403: status %d (stale %v); want 403, the old copy dropped",
			d.Meta.GetStatusCode(), d.Meta.GetStale())
	}
}

// TestFailedRefreshCoolsDown: after a background refresh fails, stale
// hits serve the stale copy without asking the upstream again on every
// hit, until refresh_cooldown has passed.
func TestFailedRefreshCoolsDown(t *testing.T) {
	clk := testclock.New(time.Now())
	cl := startCluster(t, 1, func(c *coordinator.Config) {
		c.Now = clk.Now
		c.Upstreams[0].TTL = time.Minute
		c.RefreshCooldown = 5 * time.Second
		countPerCall(c)
	})
	const path = "/cooldown"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl.up.SetSequence(path, []fakeupstream.Behavior{{}, fakeupstream.Status(503)})
	in := cl.instances[0]
	get := func() {
		t.Helper()
		d, err := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url(path)})
		if err != nil || !bytes.Equal(d.Body, cl.up.Body(path)) {
			t.Fatalf("%v; want the (stale) body", err)
		}
		waitFor(t, 5*time.Second, func() bool { return in.Metrics.RunningFlights() == 0 })
	}
	get()
	clk.Advance(2 * time.Minute)
	for range 10 {
		get()
	}
	if got := cl.up.Count(path); got != 2 {
		t.Fatalf("upstream requests = %d after 10 stale hits; want 2 (the fill, one failed refresh, then a cooldown)", got)
	}
	clk.Advance(6 * time.Second)
	get()
	if got := cl.up.Count(path); got != 3 {
		t.Fatalf("upstream requests = %d after the cooldown; want 3", got)
	}
}

// TestSmallDocumentsHandedOffInline: a small document rides in the done
// event, so the followers on other instances never read L2 for it (no
// GET), while a large one is read from L2 (one GET per follower instance).
func TestSmallDocumentsHandedOffInline(t *testing.T) {
	// The landing script's own lock check is one GET; each follower
	// instance reading L2 adds one.
	for _, tt := range []struct {
		name     string
		size     int
		wantGets int
	}{{"1KiB inline", 1 << 10, 1}, {"64KiB from L2", 64 << 10, 3}} {
		t.Run(tt.name, func(t *testing.T) {
			cl := startCluster(t, 3, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			rdb := cl.redis.Client(t)
			const path = "/inline"
			release := make(chan struct{})
			cl.up.Set(path, fakeupstream.Behavior{Block: release, Size: tt.size})
			go func() {
				// Every caller joined before the count starts.
				if err := cl.awaitJoined(ctx, path, 30); err != nil {
					t.Error(err)
				}
				if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
					t.Error(err)
				}
				close(release)
			}()
			out := cl.burst(t, ctx, 30, func(int) *coorddv1.GetOrFetchRequest { return &coorddv1.GetOrFetchRequest{Url: cl.url(path)} })
			checkAll(t, out, fakeupstream.SizedBody(path, tt.size))
			cl.checkPushOnly(t)
			stats, err := rdb.Info(ctx, "commandstats").Result()
			if err != nil {
				t.Fatal(err)
			}
			gets := 0
			if _, rest, ok := strings.Cut(stats, "cmdstat_get:calls="); ok {
				gets, _ = strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			}
			if gets != tt.wantGets {
				t.Fatalf("GET calls after the answer: %d; want %d\n%s", gets, tt.wantGets, stats)
			}
		})
	}
}

// TestDegradedLeaderNeverWritesUnannounced: an instance that found Redis
// down leads in-process; Redis comes back before its fetch lands. Whatever
// it then stores in L2 is announced: followers elsewhere never miss a
// document sitting in L2 (the old leader wrote it and published nothing).
func TestDegradedLeaderNeverWritesUnannounced(t *testing.T) {
	rs := redistest.Start(t)
	up := fakeupstream.New(t)
	cfg := coordinator.Config{Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: up.URL()}}}
	fastRedis(&cfg)
	proxy := redistest.StartProxy(t, rs.Addr())
	a := fleettest.Start(t, fleettest.Options{RedisURL: proxy.URL(), Config: cfg})
	b := fleettest.Start(t, fleettest.Options{RedisURL: rs.URL(), Config: cfg})
	ca, cb := a.Dial(t), b.Dial(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const path = "/degraded-leader"
	url := up.URL() + path
	relA, relB := make(chan struct{}), make(chan struct{})
	defer close(relB)
	up.SetSequence(path, []fakeupstream.Behavior{{Block: relA}, {Block: relB}})
	st := storetest.New(rs.Client(t), "")
	sub, err := st.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	var doneSeen atomic.Bool
	go func() {
		for {
			ev, err := sub.Next(ctx)
			if err != nil {
				return
			}
			if ev.Type == storetest.EventDone && strings.Contains(ev.Key, path) {
				doneSeen.Store(true)
			}
		}
	}()

	proxy.Freeze(true) // instance a finds Redis down and leads in-process
	resA := make(chan error, 1)
	go func() {
		_, err := fleettest.Get(ctx, ca, &coorddv1.GetOrFetchRequest{Url: url})
		resA <- err
	}()
	if err := up.WaitCount(ctx, path, 1); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = fleettest.Get(ctx, cb, &coorddv1.GetOrFetchRequest{Url: url}) }() // b leads through Redis
	if err := up.WaitCount(ctx, path, 2); err != nil {
		t.Fatal(err)
	}
	proxy.Freeze(false) // Redis is back for a before its fetch lands
	waitFor(t, 10*time.Second, a.Coordinator.RedisHealthy)
	close(relA)
	if err := <-resA; err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return a.Metrics.RunningFlights() == 0 })
	stored, err := st.DocStored(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	// Written: its announcement must come (it may still be on its way).
	for deadline := time.Now().Add(5 * time.Second); stored && !doneSeen.Load(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the degraded leader wrote L2 and announced nothing")
		}
	}
}
