package server_test

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/redistest"
	"github.com/coordd/coordd/internal/testing/storetest"
)

// Tests of replies lost with their connection: a command reaches Redis
// and runs, and the connection drops before the reply comes back (a
// proxy or balancer restart, a failover, a blip). go-redis then replays
// the command on a new connection (MaxRetries), so every script must be
// safe to run twice: the replay must answer what the first run did, and
// change nothing more.

// replayFleet is instance 0 reaching Redis through a proxy that drops
// connections on demand, and n-1 instances reaching it directly.
type replayFleet struct {
	rs        *redistest.Server
	proxy     *redistest.Proxy
	up        *fakeupstream.Upstream
	instances []*fleettest.Instance
	clients   []coorddv1.CoordinatorServiceClient
}

func startReplayFleet(t testing.TB, n int, tune ...func(*coordinator.Config)) *replayFleet {
	t.Helper()
	rs := redistest.Start(t)
	fl := &replayFleet{rs: rs, proxy: redistest.StartProxy(t, rs.Addr()), up: fakeupstream.New(t)}
	for i := range n {
		cfg := coordinator.Config{Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: fl.up.URL()}}}
		for _, f := range tune {
			f(&cfg)
		}
		url := rs.URL()
		if i == 0 {
			url = fl.proxy.URL()
		}
		in := fleettest.Start(t, fleettest.Options{RedisURL: url, Config: cfg, Metrics: true})
		fl.instances = append(fl.instances, in)
		fl.clients = append(fl.clients, in.Dial(t))
	}
	// Load the scripts into Redis through every instance, so that each
	// script runs as one EVALSHA, the command the proxy drops.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range fl.clients {
		if _, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: fl.up.URL() + "/warm"}); err != nil {
			t.Fatal(err)
		}
	}
	return fl
}

// waitFollowing waits until every instance but the first has callers
// callers of one flight waiting: one remote follower (the flight follows
// the lock) and callers-1 local ones (calls joined the flight).
func (fl *replayFleet) waitFollowing(t testing.TB, callers int) {
	t.Helper()
	for i, in := range fl.instances[1:] {
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			s := in.Scrape(t)
			if s.Value("coordd_followers_total", "scope", "remote") >= 1 &&
				s.Value("coordd_followers_total", "scope", "local") >= float64(callers-1) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("instance %d: %d callers not following after 20s", i+1, callers)
			}
		}
	}
}

// checkPushOnly fails the test if a follower anywhere was woken by its
// lease timer instead of a push.
func (fl *replayFleet) checkPushOnly(t *testing.T) {
	t.Helper()
	for i, in := range fl.instances {
		if n := in.Metrics.TimerWakeups(); n != 0 {
			t.Fatalf("instance %d: %d followers woken by the lease timer; want every wakeup pushed", i, n)
		}
	}
}

// TestLockReplyLostWithConnection: instance 0's lock request runs and its
// connection drops before the reply. go-redis replays the script, which
// finds the lock held by instance 0's own token: that is instance 0's
// lease, so it leads, and the 40 callers on the other instances are
// pushed its document. It used to take its own token for another
// holder's and follow itself until the lease ran out, with every caller
// on every instance.
func TestLockReplyLostWithConnection(t *testing.T) {
	fl := startReplayFleet(t, 3, slowLease)
	const path = "/dropped-a"
	url := fl.up.URL() + path
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	release := make(chan struct{})
	fl.up.Set(path, fakeupstream.Behavior{Block: release})
	dropped := fl.proxy.DropNext(calls.ClaimCall(url, "fake")...) // the claim folds in the guard's admission

	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	get := func(c coorddv1.CoordinatorServiceClient, check func(*fleettest.Doc) error) {
		defer wg.Done()
		d, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: url})
		if err == nil && !bytes.Equal(d.Body, fl.up.Body(path)) {
			err = errShape("wrong body")
		}
		if err == nil && check != nil {
			err = check(d)
		}
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	wg.Add(1)
	go get(fl.clients[0], func(d *fleettest.Doc) error {
		for _, p := range d.Progress {
			if p.GetRole() == coorddv1.Role_ROLE_FOLLOWER {
				return errShape("instance 0 followed: " + p.String())
			}
		}
		return nil
	})
	<-dropped
	if err := fl.up.WaitCount(ctx, path, 1); err != nil {
		t.Fatal(err) // with the old code, only after the lease ran out
	}
	const callers = 20
	for _, c := range fl.clients[1:] {
		for range callers {
			wg.Add(1)
			go get(c, nil)
		}
	}
	fl.waitFollowing(t, callers)
	close(release)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	fl.checkPushOnly(t)
	if got := fl.up.Count(path); got != 1 {
		t.Fatalf("upstream requests = %d; want 1", got)
	}
}

// calls picks out the store's commands on the wire, for the proxy.
var calls = storetest.New(nil, "")

// events counts the events published about one url, by type.
type events struct {
	sub    *storetest.Events
	url    string
	counts map[string]int
}

func watchEvents(t *testing.T, rs *redistest.Server, url string) *events {
	t.Helper()
	sub, err := storetest.New(rs.Client(t), "").Subscribe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	return &events{sub: sub, url: url, counts: make(map[string]int)}
}

// count returns how many events of typ were published before count was
// called.
func (ev *events) count(t *testing.T, typ string) int {
	t.Helper()
	evs, err := ev.sub.Sync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.Key == ev.url {
			ev.counts[e.Type]++
		}
	}
	return ev.counts[typ]
}

// TestLandReplyLostWithConnection: the landing's connection drops before
// its reply. The replay answers the first run's "landed" and publishes
// nothing more: one done event, no release, followers pushed. It used to
// store and publish the document again.
func TestLandReplyLostWithConnection(t *testing.T) {
	fl := startReplayFleet(t, 2, slowLease)
	const path = "/dropped-land"
	url := fl.up.URL() + path
	ev := watchEvents(t, fl.rs, url)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	release := make(chan struct{})
	// no-cache: the leader lands before it answers its callers, so its
	// answer comes after the landing and its replay.
	fl.up.Set(path, fakeupstream.Behavior{Block: release}.WithHeader("Cache-Control", "no-cache"))
	dropped := fl.proxy.DropNext(calls.LandCall(url)...)
	leader, follower := fl.leadAndFollow(t, ctx, path, 1)
	close(release)
	<-dropped
	if err := <-leader; err != nil {
		t.Fatal(err)
	}
	if err := <-follower; err != nil {
		t.Fatal(err)
	}
	fl.checkPushOnly(t)
	if n := ev.count(t, "done"); n != 1 {
		t.Fatalf("%d done events; want 1 (the replay published again)", n)
	}
	if n := ev.count(t, "release"); n != 0 {
		t.Fatalf("%d release events; want none (the replay was taken for a refused landing)", n)
	}
	if got := fl.up.Count(path); got != 1 {
		t.Fatalf("upstream requests = %d; want 1", got)
	}
}

// noRetries makes each call one upstream attempt, and lets one failure
// open the breaker when threshold is 1.
func noRetries(threshold int) func(*coordinator.Config) {
	return func(c *coordinator.Config) {
		p := &c.Upstreams[0].Protection
		p.Retry.MaxAttempts = 1
		p.Breaker.FailureThreshold = threshold
		p.Breaker.FailureRate = -1
	}
}

// TestHandOffReplyLostWithConnection: a failed fetch's hand-off (release
// the lock, publish fail) loses its reply with its connection. The
// follower on the other instance gets the error pushed, once.
func TestHandOffReplyLostWithConnection(t *testing.T) {
	fl := startReplayFleet(t, 2, slowLease, noRetries(-1))
	const path = "/dropped-handoff"
	url := fl.up.URL() + path
	ev := watchEvents(t, fl.rs, url)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	release := make(chan struct{})
	fl.up.Set(path, fakeupstream.Behavior{Block: release, Status: 503})
	dropped := fl.proxy.DropNext(calls.HandOffCall(url)...)
	leader, follower := fl.leadAndFollow(t, ctx, path, 1)
	close(release)
	<-dropped
	if err := <-leader; status.Code(err) != codes.Unavailable {
		t.Fatalf("leader: %v; want Unavailable", err)
	}
	if err := <-follower; status.Code(err) != codes.Unavailable {
		t.Fatalf("follower: %v; want the leader's Unavailable, pushed", err)
	}
	fl.checkPushOnly(t)
	if n := ev.count(t, "fail"); n != 1 {
		t.Fatalf("%d fail events; want 1 (the replay published again)", n)
	}
	if got := fl.up.Count(path); got != 1 {
		t.Fatalf("upstream requests = %d; want 1", got)
	}
}

// TestInvalidateReplyLostWithConnection: Invalidate's connection drops
// before its reply. The replay answers what the first run found (the
// document existed), and publishes no second inval. It used to answer
// existed=false: the first run had deleted it.
func TestInvalidateReplyLostWithConnection(t *testing.T) {
	fl := startReplayFleet(t, 2, slowLease)
	const path = "/dropped-invalidate"
	url := fl.up.URL() + path
	ev := watchEvents(t, fl.rs, url)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := fleettest.Get(ctx, fl.clients[1], &coorddv1.GetOrFetchRequest{Url: url}); err != nil {
		t.Fatal(err)
	}
	(&cluster{redis: fl.rs}).waitUnlocked(t, url) // landed: the caller is answered first
	dropped := fl.proxy.DropNext(calls.InvalidateCall(url)...)
	resp, err := fl.clients[0].Invalidate(ctx, &coorddv1.InvalidateRequest{Url: url})
	if err != nil {
		t.Fatal(err)
	}
	<-dropped
	if !resp.GetExisted() {
		t.Fatal("existed = false; want true: the first run deleted the document")
	}
	if n := ev.count(t, "inval"); n != 1 {
		t.Fatalf("%d inval events; want 1 (the replay published again)", n)
	}
}

// TestBreakerRecordReplyLostWithConnection: recording a failed attempt in
// the shared breaker loses its reply with its connection. The replay does
// not count the failure twice: with a threshold of 2 the breaker stays
// closed after one failure, and the next fetch reaches the upstream. It
// used to open the breaker.
func TestBreakerRecordReplyLostWithConnection(t *testing.T) {
	fl := startReplayFleet(t, 2, slowLease, noRetries(2))
	const failing, next = "/dropped-record", "/after-record"
	fl.up.Set(failing, fakeupstream.Status(503))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dropped := fl.proxy.DropNext(calls.RecordCall("fake", true)...) // the record of a failure
	if _, err := fleettest.Get(ctx, fl.clients[0], &coorddv1.GetOrFetchRequest{Url: fl.up.URL() + failing}); status.Code(err) != codes.Unavailable {
		t.Fatalf("failing fetch: %v; want Unavailable", err)
	}
	<-dropped
	d, err := fleettest.Get(ctx, fl.clients[1], &coorddv1.GetOrFetchRequest{Url: fl.up.URL() + next})
	if err != nil {
		t.Fatalf("next fetch: %v; want it let through: one failure, below the threshold of 2", err)
	}
	if !bytes.Equal(d.Body, fl.up.Body(next)) {
		t.Fatal("next fetch: wrong body")
	}
}

// TestBreakerProbeAdmitReplyLostWithConnection: the admission of the
// half-open breaker's one probe loses its reply with its connection. The
// replay answers the slot the first run took: the probe goes out. It used
// to find the probe slot taken (by itself) and fail the fetch as if the
// breaker were open, holding the slot until its lease ended.
func TestBreakerProbeAdmitReplyLostWithConnection(t *testing.T) {
	fl := startReplayFleet(t, 2, slowLease, func(c *coordinator.Config) {
		noRetries(1)(c)
		c.Upstreams[0].Protection.Breaker.OpenFor = time.Millisecond
	})
	const failing, probe = "/opens-breaker", "/probe"
	fl.up.Set(failing, fakeupstream.Status(503))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := fleettest.Get(ctx, fl.clients[1], &coorddv1.GetOrFetchRequest{Url: fl.up.URL() + failing}); status.Code(err) != codes.Unavailable {
		t.Fatalf("failing fetch: %v; want Unavailable", err)
	}
	// The breaker is open for 1ms; the next admission turns it half-open
	// and takes its only probe slot. Wait until the shared guard says so
	// (open, its time up): the failure is recorded after its caller is
	// answered, and on a fast machine the probe could come within the 1ms.
	waitFor(t, 20*time.Second, func() bool {
		g := fl.instances[0].Coordinator.Status(ctx).Upstreams[0].Guard
		return g.Scope == "cluster" && g.Breaker == "open" && g.NextProbe == 0
	})
	dropped := fl.proxy.DropNext(calls.ClaimCall(fl.up.URL()+probe, "fake")...) // the claim folds in the admission
	d, err := fleettest.Get(ctx, fl.clients[0], &coorddv1.GetOrFetchRequest{Url: fl.up.URL() + probe})
	if err != nil {
		t.Fatalf("probe: %v; want it admitted", err)
	}
	<-dropped
	if !bytes.Equal(d.Body, fl.up.Body(probe)) {
		t.Fatal("probe: wrong body")
	}
	if got := fl.up.Count(probe); got != 1 {
		t.Fatalf("probe upstream requests = %d; want 1", got)
	}
}

// TestRateLimitAdmitReplyLostWithConnection: an admission by the shared
// rate limit loses its reply with its connection. The replay answers the
// slot the first run booked instead of booking a second: at 1 request per
// second with a burst of 2, the next fetch takes the burst's second slot
// at once. It used to find both slots booked, and be refused for a wait
// past the 100ms bound.
func TestRateLimitAdmitReplyLostWithConnection(t *testing.T) {
	fl := startReplayFleet(t, 2, slowLease, func(c *coordinator.Config) {
		noRetries(-1)(c)
		p := &c.Upstreams[0].Protection
		p.RateLimit, p.Burst, p.MaxWait = 1, 2, 100*time.Millisecond
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The two warm-up fetches booked the next 2s of slots; a full burst is
	// free again once they have passed. Nothing signals it but the clock.
	time.Sleep(2 * time.Second)
	dropped := fl.proxy.DropNext(calls.ClaimCall(fl.up.URL()+"/first", "fake")...) // the claim folds in the admission
	if _, err := fleettest.Get(ctx, fl.clients[0], &coorddv1.GetOrFetchRequest{Url: fl.up.URL() + "/first"}); err != nil {
		t.Fatal(err)
	}
	<-dropped
	if _, err := fleettest.Get(ctx, fl.clients[1], &coorddv1.GetOrFetchRequest{Url: fl.up.URL() + "/second"}); err != nil {
		t.Fatalf("second fetch: %v; want the burst's second slot", err)
	}
}
