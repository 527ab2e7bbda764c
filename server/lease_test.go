package server_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
)

// Tests of the fill lock's lease: a live holder keeps it however long its
// fetch takes, and the followers wait for its push; a holder cut off from
// Redis loses it within LockTTL, and a follower elsewhere takes over.

// extensions is how many times in its watchdog extended a lease.
func extensions(t *testing.T, in *fleettest.Instance) float64 {
	return in.Scrape(t).Value("coordd_lock_extensions_total", "result", "ok")
}

// gets runs callers calls of url on each client, and returns a channel
// that yields each call's error (nil: the right body) as it ends.
func gets(ctx context.Context, clients []coorddv1.CoordinatorServiceClient, callers int, url string, want []byte) <-chan error {
	out := make(chan error, callers*len(clients))
	for _, c := range clients {
		for range callers {
			go func() {
				d, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: url})
				if err == nil && !bytes.Equal(d.Body, want) {
					err = errShape("wrong body")
				}
				out <- err
			}()
		}
	}
	return out
}

// leadAndFollow makes one call of path on instance 0, which leads, the
// upstream holding its answer (set by the caller), then callers calls on
// every other instance, and returns once they all follow it: the leader's
// and the followers' outcomes, as gets yields them.
func (fl *replayFleet) leadAndFollow(t testing.TB, ctx context.Context, path string, callers int) (leader, followers <-chan error) {
	t.Helper()
	url, want := fl.up.URL()+path, fl.up.Body(path)
	leader = gets(ctx, fl.clients[:1], 1, url, want)
	if err := fl.up.WaitCount(ctx, path, 1); err != nil {
		t.Fatal(err)
	}
	followers = gets(ctx, fl.clients[1:], callers, url, want)
	fl.waitFollowing(t, callers)
	return leader, followers
}

// TestSlowHolderKeepsFollowersPushed: a fetch outlasts the lease many
// times over (a 300ms lease, extended until the leader's watchdog has
// renewed it 6 times, one of them with its reply lost with its
// connection). The followers on the other instances look again when the
// lease they saw would end, find it renewed by the same holder, and go on
// waiting for its push: none is counted as woken by a lapsed lease, and
// the upstream is asked once.
func TestSlowHolderKeepsFollowersPushed(t *testing.T) {
	fl := startReplayFleet(t, 3, slowLease, func(c *coordinator.Config) { c.LockTTL = 300 * time.Millisecond })
	const path = "/slow-holder"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	release := make(chan struct{})
	fl.up.Set(path, fakeupstream.Behavior{Block: release})
	const callers = 5
	leader, followers := fl.leadAndFollow(t, ctx, path, callers)
	dropped := fl.proxy.DropNext(calls.ExtendCall(fl.up.URL() + path)...) // the watchdog's next extension
	<-dropped
	base := extensions(t, fl.instances[0])
	waitFor(t, 30*time.Second, func() bool { return extensions(t, fl.instances[0]) >= base+5 })
	close(release)
	if err := <-leader; err != nil {
		t.Fatal(err)
	}
	for range 2 * callers {
		if err := <-followers; err != nil {
			t.Fatal(err)
		}
	}
	fl.checkPushOnly(t)
	if got := fl.up.Count(path); got != 1 {
		t.Fatalf("upstream requests = %d; want 1", got)
	}
}

// TestRedisStallsKeepLease: with the default lease, Redis stalling for
// 500ms (SIGSTOP), three times while a fetch runs, costs no second fetch:
// the watchdog's renewals land late but in time, and the followers that
// look at the lease meanwhile find it renewed and go on waiting for the
// push. The Redis timeout is above the stalls, so that no instance takes
// Redis for down (it would then fail open, one fetch per instance).
func TestRedisStallsKeepLease(t *testing.T) {
	fl := startReplayFleet(t, 3, func(c *coordinator.Config) { c.RedisTimeout = 2 * time.Second })
	const path = "/stalls"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	release := make(chan struct{})
	fl.up.Set(path, fakeupstream.Behavior{Block: release})
	const callers = 5
	leader, followers := fl.leadAndFollow(t, ctx, path, callers)
	for range 3 {
		fl.rs.Pause()
		time.Sleep(500 * time.Millisecond) // the stall's length is what is tested
		fl.rs.Resume()
		base := extensions(t, fl.instances[0])
		waitFor(t, 30*time.Second, func() bool { return extensions(t, fl.instances[0]) > base })
	}
	close(release)
	if err := <-leader; err != nil {
		t.Fatal(err)
	}
	for range 2 * callers {
		if err := <-followers; err != nil {
			t.Fatal(err)
		}
	}
	if got := fl.up.Count(path); got != 1 {
		t.Fatalf("upstream requests = %d; want 1", got)
	}
	fl.checkPushOnly(t)
}

// cutOff measures the wait that a lease bounds: three instances with
// lockTTL and otherwise the default configuration; instance 0 leads, the
// upstream holding its answer, and 5 callers on each other instance follow
// it; then instance 0 is cut off from Redis (every reply held back). It
// returns how long after the cut the last follower was answered, and
// checks that each got the body, from one takeover: the upstream is asked
// twice, by instance 0 (whose answer never lands) and by one follower.
func cutOff(t testing.TB, lockTTL time.Duration) time.Duration {
	fl := startReplayFleet(t, 3, func(c *coordinator.Config) {
		c.LockTTL = lockTTL
		c.RedisTimeout = 500 * time.Millisecond // the default (fleettest's is longer)
		c.Upstreams[0].Timeout = time.Minute    // instance 0's fetch outlasts the measure, without a retry
	})
	const path = "/cut-off"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	release := make(chan struct{})
	defer close(release)
	fl.up.SetSequence(path, []fakeupstream.Behavior{{Block: release}, {}})
	const callers = 5
	_, followers := fl.leadAndFollow(t, ctx, path, callers)
	fl.proxy.Cut(true)
	defer fl.proxy.Cut(false)
	cut := time.Now()
	for range 2 * callers {
		if err := <-followers; err != nil {
			t.Fatal(err)
		}
	}
	worst := time.Since(cut)
	if got := fl.up.Count(path); got != 2 {
		t.Fatalf("upstream requests = %d; want 2: the cut-off leader's and one takeover", got)
	}
	return worst
}

// TestHolderCutOffFollowersTakeOver: with the default lease, followers
// take over from a holder cut off from Redis (timing: BenchmarkHolderCutOff).
func TestHolderCutOffFollowersTakeOver(t *testing.T) {
	t.Logf("last follower answered %v after the cut", cutOff(t, 0).Round(time.Millisecond))
}

// BenchmarkHolderCutOff reports the worst follower wait after the lock's
// holder is cut off from Redis, with the default lease and with the 10s
// lease that was the default before, as a baseline.
func BenchmarkHolderCutOff(b *testing.B) {
	var def, old time.Duration
	for range b.N {
		def = max(def, cutOff(b, 0))
		old = max(old, cutOff(b, 10*time.Second))
	}
	b.ReportMetric(def.Seconds(), "worst-wait-s")
	b.ReportMetric(old.Seconds(), "worst-wait-10s-lease-s")
	b.ReportMetric(old.Seconds()/def.Seconds(), "x-faster")
}
