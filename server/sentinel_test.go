package server_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/enginetest"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/redistest"
)

// fleet is coordd instances, each with its own Redis client and counted
// upstream requests, in front of one fake upstream: a fleettest.Fleet
// with the failover tests' methods.
type fleet struct {
	up        *fakeupstream.Upstream
	instances []*fleettest.Instance
	clients   []coorddv1.CoordinatorServiceClient
	fetches   []*fleettest.CountingTransport
}

func newFleet(f *fleettest.Fleet) *fleet {
	return &fleet{up: f.Up, instances: f.Instances, clients: f.Clients, fetches: f.Fetches}
}

// burst calls GetOrFetch perInstance times for each path on every
// instance, all at once, and returns every failure: an error, or a body
// other than the upstream's.
func (fl *fleet) burst(ctx context.Context, paths []string, perInstance int) []error {
	var wg sync.WaitGroup
	errs := make(chan error, len(paths)*perInstance*len(fl.clients))
	for _, p := range paths {
		for k, c := range fl.clients {
			for range perInstance {
				wg.Add(1)
				go func() {
					defer wg.Done()
					d, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: fl.up.URL() + p})
					switch {
					case err != nil:
						errs <- fmt.Errorf("%s via instance %d: %w", p, k, err)
					case !bytes.Equal(d.Body, fl.up.Body(p)):
						errs <- fmt.Errorf("%s via instance %d: body differs", p, k)
					}
				}()
			}
		}
	}
	wg.Wait()
	close(errs)
	var out []error
	for err := range errs {
		out = append(out, err)
	}
	return out
}

// hold holds the upstream's answers to paths until each has had its first
// request and perInstance callers on every instance wait for it (the
// followers joined: awaitJoined), then runs during, if set, then lets
// every answer through. If ctx ends first, it lets them through at once.
func (fl *fleet) hold(ctx context.Context, paths []string, perInstance int, during func()) {
	release := make(chan struct{})
	for _, p := range paths {
		fl.up.Set(p, fakeupstream.Behavior{Block: release})
	}
	go func() {
		defer close(release)
		if fl.awaitJoined(ctx, paths, perInstance) != nil {
			return
		}
		if during != nil {
			during()
		}
	}()
}

// awaitJoined waits until, for each of paths, perInstance callers on
// every instance wait for it, each in a flight that leads or follows
// (enginetest.Joined), or ctx ends.
func (fl *fleet) awaitJoined(ctx context.Context, paths []string, perInstance int) error {
	cs := make([]*coordinator.Coordinator, len(fl.instances))
	for i, in := range fl.instances {
		cs[i] = in.Coordinator
	}
	for _, p := range paths {
		if err := enginetest.AwaitJoined(ctx, fl.up.URL()+p, perInstance*len(cs), cs...); err != nil {
			return err
		}
	}
	return nil
}

// waves sends waves of 4 cold keys, each with also, through burst (2
// calls per instance for each key) until the returned stop is called; stop
// returns every cold key sent and every failure.
func (fl *fleet) waves(ctx context.Context, also []string, burst func(context.Context, []string, int) []error) (stop func() (cold []string, errs []error)) {
	type result struct {
		cold []string
		errs []error
	}
	quit, done := make(chan struct{}), make(chan result, 1)
	go func() {
		var r result
		for w := 0; ; w++ {
			select {
			case <-quit:
				done <- r
				return
			default:
			}
			cold := keyPaths(fmt.Sprintf("/wave%d", w), 4)
			r.cold = append(r.cold, cold...)
			r.errs = append(r.errs, burst(ctx, append(cold, also...), 2)...)
		}
	}()
	return func() ([]string, []error) {
		close(quit)
		r := <-done
		return r.cold, r.errs
	}
}

// checkFetchedAtMostOnce fails the test if an instance fetched one of
// paths more than once.
func (fl *fleet) checkFetchedAtMostOnce(t *testing.T, paths []string) {
	t.Helper()
	for _, p := range paths {
		for k, tr := range fl.fetches {
			if got := tr.Count(p); got > 1 {
				t.Errorf("during the failover: instance %d fetched %s %d times; want at most 1", k, p, got)
			}
		}
	}
}

func (fl *fleet) timerWakeups() (n int64) {
	for _, in := range fl.instances {
		n += in.Metrics.TimerWakeups()
	}
	return n
}

func keyPaths(prefix string, n int) []string {
	paths := make([]string, n)
	for i := range paths {
		paths[i] = fmt.Sprintf("%s/%d", prefix, i)
	}
	return paths
}

// TestSentinelFailover: three coordd instances on a Sentinel-managed
// master and replica, callers bursting on cold keys. The master is killed
// (SIGKILL) while leaders are fetching, and the bursts go on while the
// sentinels promote the replica: every caller is answered, each instance
// fetches a key at most once meanwhile, and once every instance is back on
// the new master a cold key is fetched exactly once across them, every
// follower woken by a push.
func TestSentinelFailover(t *testing.T) {
	s := redistest.StartSentinel(t, 1, 3)
	fl := newFleet(fleettest.StartFleet(t, 3, fleettest.FleetOptions{
		Tune:         func(cfg *coordinator.Config) { fastRedis(cfg); countPerCall(cfg) },
		CountFetches: true,
		Metrics:      true,
		RedisClient: func(cfg coordinator.Config) redis.UniversalClient {
			return s.Client(t, func(o *redis.FailoverOptions) {
				o.DialTimeout, o.ReadTimeout, o.WriteTimeout = cfg.RedisTimeout, cfg.RedisTimeout, cfg.RedisTimeout
				o.ContextTimeoutEnabled = true
			})
		},
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Coordinated before: one fetch per key.
	before := keyPaths("/before", 8)
	for _, err := range fl.burst(ctx, before, 2) {
		t.Error(err)
	}
	for _, p := range before {
		if got := fl.up.Count(p); got != 1 {
			t.Errorf("before the failover: %s: upstream requests = %d; want 1", p, got)
		}
	}

	// The leaders of these keys are fetching, their followers waiting on
	// them through Redis, when the master dies.
	held := keyPaths("/held", 8)
	release := make(chan struct{})
	for _, p := range held {
		fl.up.Set(p, fakeupstream.Behavior{Block: release})
	}
	heldErrs := make(chan []error, 1)
	go func() { heldErrs <- fl.burst(ctx, held, 3) }()
	if err := fl.awaitJoined(ctx, held, 3); err != nil {
		t.Fatal(err)
	}
	old := s.Master(t)
	old.Kill()
	close(release)

	// Waves of cold keys while the sentinels fail over, and until every
	// instance is back on Redis.
	stop := fl.waves(ctx, nil, fl.burst)
	begin := time.Now()
	nu := s.WaitFailover(t, old)
	failover := time.Since(begin)
	fl.waitHealthy(t)
	recovered := time.Since(begin)
	during, errs := stop()
	for _, err := range append(<-heldErrs, errs...) {
		t.Error(err)
	}
	fl.checkFetchedAtMostOnce(t, append(held, during...))
	if nu == old {
		t.Fatalf("the sentinels kept the killed master")
	}

	// Settled: coordinated again, through pushes.
	fl.checkCoordinated(t, ctx, "/after")
	t.Logf("master killed: sentinels failed over in %v, every instance back on Redis after %v; %d cold keys during it, each fetched at most once per instance",
		failover.Round(time.Millisecond), recovered.Round(time.Millisecond), len(held)+len(during))
}
