package coordinator_test

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/testing/enginetest"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/redistest"
)

func newCoordinator(t *testing.T, up *fakeupstream.Upstream, rdb redis.UniversalClient) *coordinator.Coordinator {
	t.Helper()
	c, err := coordinator.New(coordinator.Config{
		Upstreams:    []coordinator.Upstream{{Name: "fake", BaseURL: up.URL()}},
		RedisTimeout: 300 * time.Millisecond,
	}, coordinator.Options{Redis: rdb})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// newCoordinatorWith returns a coordinator of cfg on rdb, closed when t
// ends.
func newCoordinatorWith(t *testing.T, cfg coordinator.Config, rdb redis.UniversalClient) *coordinator.Coordinator {
	t.Helper()
	c, err := coordinator.New(cfg, coordinator.Options{Redis: rdb})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func get(t *testing.T, ctx context.Context, c *coordinator.Coordinator, url string) (*coordinator.Result, error) {
	t.Helper()
	tg, err := c.Resolve(url, "")
	if err != nil {
		t.Fatal(err)
	}
	return c.Get(ctx, tg, coordinator.GetOptions{})
}

// TestCallerLeavesFlightGoesOn: every caller gives up, yet the flight
// finishes filling the cache, and the next caller is a hit.
func TestCallerLeavesFlightGoesOn(t *testing.T) {
	up := fakeupstream.New(t)
	rs := redistest.Start(t)
	c := newCoordinator(t, up, rs.Client(t))
	release := make(chan struct{})
	up.Set("/a", fakeupstream.Behavior{Block: release})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := get(t, ctx, c, up.URL()+"/a"); !errors.Is(err, context.Canceled) {
				t.Errorf("err = %v; want context.Canceled", err)
			}
		}()
	}
	if err := up.WaitCount(context.Background(), "/a", 1); err != nil {
		t.Fatal(err)
	}
	cancel()
	wg.Wait()
	close(release)
	// The filled copy lands in L2: a second instance finds it there.
	c2 := newCoordinator(t, up, rs.Client(t))
	var res *coordinator.Result
	for deadline := time.Now().Add(5 * time.Second); ; {
		r, err := get(t, context.Background(), c2, up.URL()+"/a")
		if err != nil {
			t.Fatal(err)
		}
		if r.Source == coordinator.SourceL2 || time.Now().After(deadline) {
			res = r
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if res.Source != coordinator.SourceL2 || !bytes.Equal(res.Doc.Body, up.Body("/a")) {
		t.Fatalf("source = %v; want the flight's copy from L2", res.Source)
	}
	if got := up.Count("/a"); got != 1 {
		t.Fatalf("upstream requests = %d; want 1", got)
	}
}

// TestRedisCluster runs two coordinators on a 3-master Redis Cluster.
func TestRedisCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	up := fakeupstream.New(t)
	release := make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs := []*coordinator.Coordinator{newCoordinator(t, up, cl.Client(t)), newCoordinator(t, up, cl.Client(t))}
	paths := []string{"/a", "/b", "/c", "/d", "/e", "/f"} // spread over hash slots
	for _, p := range paths {
		up.Set(p, fakeupstream.Behavior{Block: release})
	}
	go func() { // every caller joined: each path's 20 wait
		defer close(release)
		for _, p := range paths {
			if enginetest.AwaitJoined(ctx, up.URL()+p, 120/len(paths), cs...) != nil {
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for i := range 120 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := paths[i%len(paths)]
			r, err := get(t, ctx, cs[i%2], up.URL()+p)
			if err != nil {
				t.Error(err)
				return
			}
			if !bytes.Equal(r.Doc.Body, up.Body(p)) {
				t.Errorf("%s: body differs", p)
			}
		}()
	}
	wg.Wait()
	for _, p := range paths {
		if got := up.Count(p); got != 1 {
			t.Errorf("%s: upstream requests = %d; want 1", p, got)
		}
	}
}

// TestCloseLeavesNoGoroutines: Close stops every background goroutine.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	up := fakeupstream.New(t)
	rs := redistest.Start(t)
	rdb := rs.Client(t)
	base := runtime.NumGoroutine()
	c, err := coordinator.New(coordinator.Config{Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: up.URL()}}}, coordinator.Options{Redis: rdb})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/a", "/b", "/a"} {
		if _, err := get(t, context.Background(), c, up.URL()+p); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	rdb.Close()
	up.Client().CloseIdleConnections()
	var n int
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if n = runtime.NumGoroutine(); n <= base {
			return
		}
	}
	buf := make([]byte, 1<<16)
	t.Fatalf("%d goroutines after Close; %d before New:\n%s", n, base, buf[:runtime.Stack(buf, true)])
}

// TestRecoveryNotLostWhenRedisFailsWhileRecovering: Redis fails again at
// the very moment the instance marks it up (inside the health callback).
// The failure must not be lost: once Redis is back, the instance
// coordinates again, rather than staying degraded for good while Redis
// answers PING.
func TestRecoveryNotLostWhenRedisFailsWhileRecovering(t *testing.T) {
	rs := redistest.Start(t)
	up := fakeupstream.New(t)
	rdb := rs.Client(t, func(o *redis.Options) {
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = 200*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond
		o.ContextTimeoutEnabled = true
	})
	var (
		armed  sync.Once
		arm    = make(chan struct{})
		c      *coordinator.Coordinator
		target coordinator.Target
	)
	onHealth := func(healthy bool) {
		if !healthy {
			return
		}
		select {
		case <-arm:
		default:
			return
		}
		armed.Do(func() {
			// Marked up: Redis dies again at once, and a call notices.
			rs.Kill()
			_, _ = c.Invalidate(context.Background(), target)
			rs.Restart()
		})
	}
	var err error
	c, err = coordinator.New(coordinator.Config{
		Upstreams:          []coordinator.Upstream{{Name: "fake", BaseURL: up.URL()}},
		RedisTimeout:       200 * time.Millisecond,
		RedisRetryInterval: 50 * time.Millisecond,
	}, coordinator.Options{Redis: rdb, OnRedisHealth: onHealth})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if target, err = c.Resolve(up.URL()+"/doc", ""); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, c.RedisHealthy)
	rs.Kill()
	_, _ = c.Invalidate(context.Background(), target) // notices Redis down
	waitUntil(t, func() bool { return !c.RedisHealthy() })
	close(arm)
	rs.Restart()
	// Coordinated through Redis again (the first call may still meet a
	// connection from before the restart).
	waitUntil(t, func() bool {
		_, err := c.Invalidate(context.Background(), target)
		return err == nil && c.RedisHealthy()
	})
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
