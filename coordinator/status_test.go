package coordinator_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/redistest"
	"github.com/coordd/coordd/internal/testing/testclock"
)

// waitStatus polls c.Status until ok accepts it: the flights it waits for
// are started by goroutines, and Status is what is under test.
func waitStatus(t *testing.T, c *coordinator.Coordinator, ok func(coordinator.Status) bool) coordinator.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		s := c.Status(ctx)
		if ok(s) {
			return s
		}
		select {
		case <-ctx.Done():
			t.Fatalf("status never as wanted; last: %+v", s)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestStatusSingleNode: a held cold burst shows as one leading flight with
// every caller waiting on it; once it lands, the rolling windows count the
// callers served per upstream fetch, L1 hits and the tenant's totals, and
// the one-minute window forgets them a minute later.
func TestStatusSingleNode(t *testing.T) {
	up := fakeupstream.New(t)
	release := make(chan struct{})
	up.Set("/held", fakeupstream.Behavior{Block: release})
	clock := testclock.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	c, err := coordinator.New(coordinator.Config{
		Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: up.URL()}},
		Now:       clock.Now,
	}, coordinator.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tg, err := c.ResolveIn(coordinator.Scope{Tenant: "team-a"}, up.URL()+"/held", "")
	if err != nil {
		t.Fatal(err)
	}
	const callers = 5
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			if _, err := c.Get(context.Background(), tg, coordinator.GetOptions{}); err != nil {
				t.Errorf("get: %v", err)
			}
		})
	}
	s := waitStatus(t, c, func(s coordinator.Status) bool {
		return len(s.Flights) == 1 && s.Flights[0].Waiters == callers && s.Flights[0].Stage == "fetching"
	})
	f := s.Flights[0]
	if f.Role != "leader" || f.Upstream != "fake" || f.Tenant != "team-a" || f.URL != up.URL()+"/held" || f.FollowersElsewhere != 0 || len(f.ID) != 8 {
		t.Errorf("flight = %+v; want a leader of fake for team-a, 0 followers elsewhere, an 8-digit id", f)
	}
	clock.Advance(3 * time.Second)
	if s := c.Status(context.Background()); s.Flights[0].Age != 3*time.Second {
		t.Errorf("age = %v; want 3s by the Coordinator's clock", s.Flights[0].Age)
	}
	if s.Redis.Mode != "single-node" || s.Redis.Healthy {
		t.Errorf("redis = %+v; want single-node", s.Redis)
	}
	if len(s.Upstreams) != 1 || s.Upstreams[0].Guard.Scope != "instance" || s.Upstreams[0].Guard.Breaker != "closed" {
		t.Errorf("upstreams = %+v; want fake's instance guard, closed", s.Upstreams)
	}
	close(release)
	wg.Wait()
	if _, err := c.Get(context.Background(), tg, coordinator.GetOptions{}); err != nil { // an L1 hit
		t.Fatal(err)
	}
	s = c.Status(context.Background())
	if len(s.Flights) != 0 {
		t.Errorf("flights = %+v; want none", s.Flights)
	}
	for _, w := range s.Windows {
		perFetch, ok := w.ServedPerUpstream()
		ratio, _ := w.L1HitRatio()
		if w.Calls != callers+1 || w.Upstream != 1 || !ok || perFetch != callers+1 || ratio != 1.0/(callers+1) {
			t.Errorf("%v window = %+v, %v served per fetch, %v from L1; want %d calls, 1 fetch, 1 hit", w.Span, w.Counts, perFetch, ratio, callers+1)
		}
	}
	if len(s.Tenants) != 1 || s.Tenants[0] != (coordinator.TenantStatus{Tenant: "team-a", Calls: callers + 1, Upstream: 1}) {
		t.Errorf("tenants = %+v; want team-a with 6 calls and 1 fetch", s.Tenants)
	}
	if s.L1.Entries != 1 {
		t.Errorf("l1 entries = %d; want 1", s.L1.Entries)
	}
	clock.Advance(time.Minute)
	s = c.Status(context.Background())
	if w := s.Windows[0]; w.Calls != 0 || w.Upstream != 0 {
		t.Errorf("1m window a minute later = %+v; want empty", w.Counts)
	}
	if w := s.Windows[1]; w.Calls != callers+1 {
		t.Errorf("5m window a minute later = %+v; want the %d calls", w.Counts, callers+1)
	}
}

// TestStatusSharedGuard: with Redis, Status reads the cluster's guard:
// the breaker opened by failures, when it lets a probe through, and the
// rate-limit slots taken; with Redis gone, the instance's own guard.
func TestStatusSharedGuard(t *testing.T) {
	redistest.SkipShort(t)
	up := fakeupstream.New(t)
	up.Set(fakeupstream.AllPaths, fakeupstream.Status(http.StatusServiceUnavailable))
	rs := redistest.Start(t)
	p := coordinator.Protection{
		RateLimit: 1, Burst: 3,
		Retry:   coordinator.RetryPolicy{MaxAttempts: 1},
		Breaker: coordinator.BreakerPolicy{FailureThreshold: 2, OpenFor: time.Minute},
	}
	c, err := coordinator.New(coordinator.Config{
		Upstreams:    []coordinator.Upstream{{Name: "fake", BaseURL: up.URL(), Protection: p}},
		RedisTimeout: 2 * time.Second,
	}, coordinator.Options{Redis: rs.Client(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := c.Status(context.Background())
	g := s.Upstreams[0].Guard
	if s.Redis.Mode != "redis" || !s.Redis.Healthy || g.Scope != "cluster" || g.Breaker != "closed" || g.FreeSlots != 3 || g.NextSlot != 0 || g.RateLimit != 1 || g.Burst != 3 {
		t.Fatalf("redis %+v, guard %+v; want redis up, the cluster's guard closed with 3 free slots", s.Redis, g)
	}
	for _, path := range []string{"/a", "/b"} {
		if _, err := get(t, context.Background(), c, up.URL()+path); err == nil {
			t.Fatalf("get %s: no error from a 503", path)
		}
	}
	g = c.Status(context.Background()).Upstreams[0].Guard
	if g.Scope != "cluster" || g.Breaker != "open" || g.NextProbe <= 0 || g.NextProbe > time.Minute || g.FreeSlots != 1 {
		t.Errorf("guard after 2 failures = %+v; want the cluster's open, a probe within a minute, 1 slot left", g)
	}
	if g.Requests != 2 || g.Retries != 0 {
		t.Errorf("retry budget = %d requests, %d retries; want 2, 0", g.Requests, g.Retries)
	}
	rs.Kill()
	s = waitStatus(t, c, func(s coordinator.Status) bool { return !s.Redis.Healthy })
	if g := s.Upstreams[0].Guard; g.Scope != "instance" || g.Breaker != "closed" {
		t.Errorf("guard with redis down = %+v; want the instance's own, closed", g)
	}

	// A flight with Redis down coordinates in-process: degraded, and
	// nobody elsewhere can follow it.
	release := make(chan struct{})
	up.Set("/held", fakeupstream.Behavior{Block: release})
	done := make(chan error, 1)
	go func() {
		_, err := get(t, context.Background(), c, up.URL()+"/held")
		done <- err
	}()
	s = waitStatus(t, c, func(s coordinator.Status) bool { return len(s.Flights) == 1 && s.Flights[0].Stage == "fetching" })
	if f := s.Flights[0]; f.Role != "degraded" || f.FollowersElsewhere != 0 || f.Waiters != 1 {
		t.Errorf("flight with redis down = %+v; want degraded, 0 followers elsewhere, 1 waiter", f)
	}
	close(release)
	if err := <-done; err != nil {
		t.Errorf("get with redis down: %v", err)
	}
}
