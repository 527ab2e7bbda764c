package coordinator_test

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/coordtest"
	"github.com/coordd/coordd/internal/fakeupstream"
	"github.com/coordd/coordd/internal/redistest"
	"github.com/coordd/coordd/internal/storetest"
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
// to be (which the follower reads from L2); on a single Redis, and on a
// Redis Cluster, where the landing's event is SPUBLISHed to its shard
// channel after the landing script, a round trip more (see
// store/shard.go: a script may only publish to its keys' slot).
func TestColdPathRoundTrips(t *testing.T) {
	rs := redistest.Start(t)
	cl := redistest.StartCluster(t, 3)
	for _, tt := range []struct {
		name   string
		size   int
		client func(t *testing.T) redis.UniversalClient
		after  int
	}{
		{"inline", 1 << 10, func(t *testing.T) redis.UniversalClient { return rs.Client(t) }, leaderAfter},
		{"from L2", 100 << 10, func(t *testing.T) redis.UniversalClient { return rs.Client(t) }, leaderAfter},
		{"cluster inline", 1 << 10, func(t *testing.T) redis.UniversalClient { return cl.Client(t) }, leaderAfter + 1},
		{"cluster from L2", 100 << 10, func(t *testing.T) redis.UniversalClient { return cl.Client(t) }, leaderAfter + 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			up := fakeupstream.New(t)
			var ra, rb storetest.RoundTrips
			rdbA, rdbB := tt.client(t), tt.client(t)
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
			if err := coordtest.AwaitJoined(ctx, url, 1, b); err != nil { // b follows a's lease
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
			if len(before) > leaderBefore || len(after) > tt.after || len(follower) > followerAll {
				t.Errorf("round trips: leader %d before the upstream, %d after, follower %d; want at most %d, %d, %d",
					len(before), len(after), len(follower), leaderBefore, tt.after, followerAll)
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
