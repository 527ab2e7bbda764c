package coordinator_test

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/testing/enginetest"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/redistest"
	"github.com/coordd/coordd/internal/testing/storetest"
)

// Round trips to Redis on the cold path, counted at each instance's
// client (a pipeline or a script is one): the leader makes at most
// leaderBefore before its upstream request (the guard's admission among
// them) and leaderAfter after it (the landing, and the guard's record of
// the outcome); an instance that follows makes at most followerAll in all.
const (
	leaderBefore = 3
	leaderAfter  = 2
	followerAll  = 3
)

// TestColdPathRoundTrips: one cold key, a leader on one instance and a
// follower on another, for a document pushed inline and for one too large
// to be (which the follower reads from L2); on a single Redis, where the
// lock and the guard's admission are one script (store's
// claimAdmitScript), one round trip before the upstream request; and on
// a Redis Cluster, where the guard's keys are in another slot than the
// lock's, two, and the landing's event is SPUBLISHed to its shard
// channel after the landing script, a round trip more (see
// store/shard.go: a script may only publish to its keys' slot).
func TestColdPathRoundTrips(t *testing.T) {
	rs := redistest.Start(t)
	cl := redistest.StartCluster(t, 3)
	for _, tt := range []struct {
		name          string
		size          int
		client        func(t *testing.T) redis.UniversalClient
		before, after int
	}{
		{"inline", 1 << 10, func(t *testing.T) redis.UniversalClient { return rs.Client(t) }, 1, leaderAfter},
		{"from L2", 100 << 10, func(t *testing.T) redis.UniversalClient { return rs.Client(t) }, 1, leaderAfter},
		{"cluster inline", 1 << 10, func(t *testing.T) redis.UniversalClient { return cl.Client(t) }, 2, leaderAfter + 1},
		{"cluster from L2", 100 << 10, func(t *testing.T) redis.UniversalClient { return cl.Client(t) }, 2, leaderAfter + 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			up := fakeupstream.New(t)
			var ra, rb storetest.RoundTrips
			rdbA, rdbB := tt.client(t), tt.client(t)
			// Each case from an empty Redis: the guard's rate limit (20/s
			// by default) would otherwise still hold the last case's
			// slot, and the leader wait for the next, which it asks
			// again for the quota that no answer has announced yet.
			flushAll(t, rdbA)
			rdbA.AddHook(ra.Hook())
			rdbB.AddHook(rb.Hook())
			a, b := newCoordinator(t, up, rdbA), newCoordinator(t, up, rdbB)
			ra.Take() // the start's
			rb.Take()

			const path = "/cold"
			url := up.URL() + path
			release := make(chan struct{})
			up.Set(path, fakeupstream.Behavior{Block: release, Size: tt.size})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			type answer struct {
				res *coordinator.Result
				err error
			}
			leader, follows := make(chan answer, 1), make(chan answer, 1)
			go func() {
				r, err := get(t, ctx, a, url)
				leader <- answer{r, err}
			}()
			if err := up.WaitCount(ctx, path, 1); err != nil {
				t.Fatal(err)
			}
			before := ra.Take()
			go func() {
				r, err := get(t, ctx, b, url)
				follows <- answer{r, err}
			}()
			if err := enginetest.AwaitJoined(ctx, url, 1, b); err != nil { // b follows a's lease
				t.Fatal(err)
			}
			close(release)
			for _, ch := range []chan answer{leader, follows} {
				if ans := <-ch; ans.err != nil || !bytes.Equal(ans.res.Doc.Body, fakeupstream.SizedBody(path, tt.size)) {
					t.Fatalf("Get = %v; want the upstream's body", ans.err)
				}
			}
			// Close waits for the landing and the guard's record, which
			// run after the callers were answered.
			a.Close()
			b.Close()
			after, follower := onPath(ra.Take()), onPath(rb.Take())
			before = onPath(before)
			t.Logf("leader before the upstream: %v; after: %v; follower: %v",
				storetest.Steps(before), storetest.Steps(after), storetest.Steps(follower))
			if len(before) > min(tt.before, leaderBefore) || len(after) > tt.after || len(follower) > followerAll {
				t.Errorf("round trips: leader %d before the upstream, %d after, follower %d; want at most %d, %d, %d",
					len(before), len(after), len(follower), min(tt.before, leaderBefore), tt.after, followerAll)
			}
			if got := up.Count(path); got != 1 {
				t.Errorf("upstream requests = %d; want 1", got)
			}
		})
	}
}

// onPath leaves out the lease's renewals, which its watchdog sends every
// LockTTL/3 while the (here, held) fetch runs, whatever the path.
func onPath(trips []storetest.Trip) []storetest.Trip {
	return slices.DeleteFunc(trips, func(t storetest.Trip) bool { return t.Step == "extend" })
}

// flushAll empties the Redis rdb reaches, every master of a Cluster.
func flushAll(t *testing.T, rdb redis.UniversalClient) {
	t.Helper()
	ctx := context.Background()
	var err error
	if c, ok := rdb.(*redis.ClusterClient); ok {
		err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return m.FlushAll(ctx).Err() })
	} else {
		err = rdb.FlushAll(ctx).Err()
	}
	if err != nil {
		t.Fatalf("FLUSHALL: %v", err)
	}
}

// TestFollowersBookNoSlot: five instances, ten callers each, ask for one
// cold key at once, under a rate limit of 2/s (a slot every 512.5ms). Only
// the instance that takes the fill lock books a slot, in the claim's
// round trip; an instance that follows books none, though it ran the same
// script. A fetch of another key right after waits at most one slot, not
// the four more that followers would have booked.
func TestFollowersBookNoSlot(t *testing.T) {
	const instances, callers = 5, 10
	u := fakeupstream.New(t)
	rs := redistest.Start(t)
	cfg := enginetest.Protected(u, coordinator.Protection{RateLimit: 2, MaxWait: 10 * time.Second}, nil)
	cfg.RedisTimeout = 2 * time.Second // about slots, not a busy machine's Redis timeouts
	var ins []*coordinator.Coordinator
	for range instances {
		ins = append(ins, newCoordinatorWith(t, cfg, rs.Client(t)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const path = "/cold"
	release := make(chan struct{})
	u.Set(path, fakeupstream.Behavior{Block: release})
	var wg sync.WaitGroup
	for _, c := range ins {
		for range callers {
			wg.Go(func() {
				if res, err := enginetest.Get(ctx, c, u.URL()+path, "", coordinator.GetOptions{}); err != nil || !bytes.Equal(res.Doc.Body, u.Body(path)) {
					t.Errorf("Get = %v; want the upstream's body", err)
				}
			})
		}
	}
	// Every caller waits, and every instance's flight has claimed (the
	// lock's holder asks the upstream; the others wait for its push),
	// before the upstream answers.
	if err := enginetest.AwaitJoined(ctx, u.URL()+path, instances*callers, ins...); err != nil {
		t.Fatal(err)
	}
	close(release)
	wg.Wait()
	if got := u.Count(path); got != 1 {
		t.Fatalf("upstream requests = %d; want 1", got)
	}
	var wait time.Duration
	if _, err := enginetest.Get(ctx, ins[instances-1], u.URL()+"/next", "", coordinator.GetOptions{Progress: func(p coordinator.Progress) {
		if p.Stage == coordinator.StageRateLimited {
			wait = max(wait, p.Wait)
		}
	}}); err != nil {
		t.Fatal(err)
	}
	// A slot is 512.5ms at 2/s: a second of the upstream's plus 25ms of
	// margin (upstream's slotMargin), shared out.
	if slot := 513 * time.Millisecond; wait > slot {
		t.Errorf("the next fetch waited %v for its slot; want at most one slot (%v): a follower booked one", wait, slot)
	}
}
