package server_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
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
	"github.com/coordd/coordd/internal/testing/storetest"
)

// clusterStat returns field of node's CLUSTER INFO; Redis leaves out a
// message counter that is still 0, so absent reads as 0.
func clusterStat(t *testing.T, rdb *redis.Client, field string) int64 {
	t.Helper()
	info, err := rdb.ClusterInfo(context.Background()).Result()
	if err != nil {
		t.Fatalf("CLUSTER INFO: %v", err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("CLUSTER INFO %s = %q", field, v)
			}
			return n
		}
	}
	return 0
}

// TestRedisClusterShardedPubSub: three coordd instances on a 3-master Redis
// Cluster, bursting on many cold keys spread over the slots, make one
// upstream request per key, every follower woken by a push; and the events
// travel as sharded pub/sub, each to one node, never broadcast over the
// cluster bus as plain PUBLISH is.
func TestRedisClusterShardedPubSub(t *testing.T) {
	rc := redistest.StartCluster(t, 3)
	up := fakeupstream.New(t)
	var ins []*fleettest.Instance
	var clients []coorddv1.CoordinatorServiceClient
	for range 3 {
		in := fleettest.Start(t, fleettest.Options{
			RedisClient: rc.Client(t),
			Config:      coordinator.Config{Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: up.URL()}}},
		})
		ins = append(ins, in)
		clients = append(clients, in.Dial(t))
	}
	nodes := make([]*redis.Client, rc.Len())
	for i := range nodes {
		nodes[i] = rc.Node(i).Client(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const keys, perInstance = 48, 3
	paths := make([]string, keys)
	release := make(chan struct{})
	for i := range paths {
		paths[i] = fmt.Sprintf("/doc/%d", i)
		up.Set(paths[i], fakeupstream.Behavior{Block: release})
	}
	// Hold every answer until each key's leader is fetching and its
	// followers joined.
	go func() {
		defer close(release)
		cs := make([]*coordinator.Coordinator, len(ins))
		for i, in := range ins {
			cs[i] = in.Coordinator
		}
		for _, p := range paths {
			if enginetest.AwaitJoined(ctx, up.URL()+p, perInstance*len(ins), cs...) != nil {
				return
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, keys*perInstance*len(ins))
	for _, p := range paths {
		for k := range ins {
			for range perInstance {
				wg.Add(1)
				go func() {
					defer wg.Done()
					d, err := fleettest.Get(ctx, clients[k], &coorddv1.GetOrFetchRequest{Url: up.URL() + p})
					switch {
					case err != nil:
						errs <- fmt.Errorf("%s via instance %d: %w", p, k, err)
					case !bytes.Equal(d.Body, up.Body(p)):
						errs <- fmt.Errorf("%s via instance %d: body differs", p, k)
					}
				}()
			}
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, p := range paths {
		if got := up.Count(p); got != 1 {
			t.Errorf("%s: upstream requests = %d; want 1", p, got)
		}
	}
	for i, in := range ins {
		if n := in.Metrics.TimerWakeups(); n != 0 {
			t.Errorf("instance %d: %d followers woken by the lease timer; want every wakeup pushed", i, n)
		}
	}

	// An invalidation reaches every instance's L1 the same way.
	target := up.URL() + paths[0]
	if _, err := clients[0].Invalidate(ctx, &coorddv1.InvalidateRequest{Url: target}); err != nil {
		t.Fatalf("Invalidate: %v", err)
	}
	for k := 1; k < len(ins); k++ {
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			d, err := fleettest.Get(ctx, clients[k], &coorddv1.GetOrFetchRequest{Url: target})
			if err != nil {
				t.Fatal(err)
			}
			if src := d.Meta.GetSource(); src != coorddv1.Source_SOURCE_L1 {
				break
			} else if time.Now().After(deadline) {
				t.Fatalf("instance %d: source = %v 5s after Invalidate; want the copy dropped from L1", k, src)
			}
		}
	}

	// No event crossed the cluster bus as a broadcast, and none travelled
	// on a plain channel; the shard channels live on their slots' nodes,
	// each with one subscriber per instance.
	var shardChannels []string
	for i, n := range nodes {
		if got := clusterStat(t, n, "cluster_stats_messages_publish_sent"); got != 0 {
			t.Errorf("node %d: cluster_stats_messages_publish_sent = %d; want 0 (no PUBLISH broadcast)", i, got)
		}
		if got, err := n.PubSubChannels(ctx, "*").Result(); err != nil || len(got) != 0 {
			t.Errorf("node %d: PUBSUB CHANNELS = %v, %v; want none", i, got, err)
		}
		chs, err := n.PubSubShardChannels(ctx, "*").Result()
		if err != nil {
			t.Fatalf("node %d: PUBSUB SHARDCHANNELS: %v", i, err)
		}
		if len(chs) == 0 {
			t.Errorf("node %d: no shard channel; want the events spread over every node", i)
		}
		for _, ch := range chs {
			subs, err := n.PubSubShardNumSub(ctx, ch).Result()
			if err != nil || subs[ch] != int64(len(ins)) {
				t.Errorf("node %d: PUBSUB SHARDNUMSUB %s = %v, %v; want %d", i, ch, subs, err, len(ins))
			}
		}
		shardChannels = append(shardChannels, chs...)
	}
	if got, want := len(shardChannels), 16; got != want {
		t.Errorf("shard channels = %d (%v); want %d", got, shardChannels, want)
	}
	slices.Sort(shardChannels)
	t.Logf("%d keys x %d callers on 3 instances: 1 upstream request per key; shard channels %v", keys, perInstance*len(ins), shardChannels)
}

// TestRedisClusterSubscriptionCut: cutting the shard channel subscriptions
// of one node (CLIENT KILL TYPE pubsub) while followers wait loses no
// wakeup and degrades nothing: the hub subscribes again, the waiters of
// those channels re-check, and every follower is still pushed its result.
func TestRedisClusterSubscriptionCut(t *testing.T) {
	rc := redistest.StartCluster(t, 3)
	fl := clusterFleet(t, rc, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	paths := keyPaths("/cut", 24)
	node := rc.Node(1).Client(t)
	fl.hold(ctx, paths, 3, func() {
		chs, err := node.PubSubShardChannels(ctx, "*").Result()
		if err != nil || len(chs) == 0 {
			t.Errorf("PUBSUB SHARDCHANNELS on node 1 = %v, %v; want the shard channels it serves", chs, err)
		}
		n, err := node.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Int()
		if err != nil || n == 0 {
			t.Errorf("CLIENT KILL TYPE pubsub on node 1 = %d, %v; want the instances' subscriptions cut", n, err)
		}
		if err := awaitSubscribers(ctx, node, chs, true, len(fl.instances)); err != nil {
			t.Errorf("the hubs never subscribed again: %v", err)
		}
	})
	for _, err := range fl.burst(ctx, paths, 3) {
		t.Error(err)
	}
	for _, p := range paths {
		if got := fl.up.Count(p); got != 1 {
			t.Errorf("%s: upstream requests = %d; want 1", p, got)
		}
	}
	for i, in := range fl.instances {
		if !in.Coordinator.RedisHealthy() {
			t.Errorf("instance %d degraded by a cut subscription", i)
		}
	}
	if n := fl.timerWakeups(); n != 0 {
		t.Errorf("%d followers woken by the lease timer; want every wakeup pushed", n)
	}
}

// TestRedisClusterShardChannelSlotMoves: when the slot of a shard channel
// moves to another node, that node's subscribers are dropped
// (sunsubscribe); every hub subscribes again on the new owner, and a burst
// is still coordinated through pushes.
func TestRedisClusterShardChannelSlotMoves(t *testing.T) {
	rc := redistest.StartCluster(t, 3)
	fl := clusterFleet(t, rc, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	channel := storetest.New(nil, "").ShardChannels()[5] // its slot is in [5120, 6144)
	from, to := rc.Node(0).Client(t), rc.Node(1).Client(t)
	slot, err := from.ClusterKeySlot(ctx, channel).Result()
	if err != nil || slot > 5460 {
		t.Fatalf("CLUSTER KEYSLOT %s = %d, %v; want a slot of node 0's, of 0-5460", channel, slot, err)
	}
	waitSubs := func(rdb *redis.Client, want int64) {
		t.Helper()
		waitFor(t, 10*time.Second, func() bool {
			subs, err := rdb.PubSubShardNumSub(ctx, channel).Result()
			return err == nil && subs[channel] == want
		})
	}
	waitSubs(from, 3)
	ids := make([]string, rc.Len())
	for i := range ids {
		if ids[i], err = rc.Node(i).Client(t).ClusterMyID(ctx).Result(); err != nil {
			t.Fatalf("CLUSTER MYID: %v", err)
		}
	}
	// No key lives in the slot yet, so the move needs no MIGRATE.
	steps := []struct {
		rdb  *redis.Client
		args []any
	}{
		{to, []any{"CLUSTER", "SETSLOT", slot, "IMPORTING", ids[0]}},
		{from, []any{"CLUSTER", "SETSLOT", slot, "MIGRATING", ids[1]}},
		{to, []any{"CLUSTER", "SETSLOT", slot, "NODE", ids[1]}},
		{from, []any{"CLUSTER", "SETSLOT", slot, "NODE", ids[1]}},
		{rc.Node(2).Client(t), []any{"CLUSTER", "SETSLOT", slot, "NODE", ids[1]}},
	}
	for _, s := range steps {
		if err := s.rdb.Do(ctx, s.args...).Err(); err != nil {
			t.Fatalf("%v: %v", s.args, err)
		}
	}
	begin := time.Now()
	waitSubs(to, 3)
	t.Logf("every hub subscribed on the slot's new owner %v after the move", time.Since(begin).Round(time.Millisecond))

	paths := keyPaths("/moved", 48)
	fl.hold(ctx, paths, 2, nil)
	for _, err := range fl.burst(ctx, paths, 2) {
		t.Error(err)
	}
	for _, p := range paths {
		if got := fl.up.Count(p); got != 1 {
			t.Errorf("%s: upstream requests = %d; want 1", p, got)
		}
	}
	if n := fl.timerWakeups(); n != 0 {
		t.Errorf("%d followers woken by the lease timer; want every wakeup pushed", n)
	}
}

// clusterFleet starts n coordd instances on Redis Cluster rc, in front of
// one fake upstream.
func clusterFleet(t *testing.T, rc *redistest.Cluster, n int) *fleet {
	t.Helper()
	return newFleet(fleettest.StartFleet(t, n, fleettest.FleetOptions{
		RedisClient: func(coordinator.Config) redis.UniversalClient { return rc.Client(t) },
	}))
}

// TestRedisClusterFailover: three coordd instances on a Redis Cluster of
// three masters with a replica each, under steady traffic (callers on
// every instance, on warm urls and on cold ones). The master serving a
// key's slot, and shard channels, is killed (SIGKILL) while that key's
// leader is fetching and followers wait for it on every instance; the
// cluster promotes its replica. Meanwhile every call is answered within
// its deadline (from L1, L2, or by in-process coordination: at most one
// fetch per key per instance). Once the instances follow the promoted
// replica (go-redis reloads its map of the slots), a cold key costs one
// upstream request across the instances, every follower woken by a push.
func TestRedisClusterFailover(t *testing.T) {
	rc := redistest.StartClusterWithReplicas(t, 3, 1)
	fl := failoverFleet(t, rc)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Warm: in every instance's L1, and in L2.
	warm := keyPaths("/warm", 8)
	for _, err := range fl.burstWithin(ctx, warm, 1) {
		t.Error(err)
	}

	// The leaders of these keys are fetching, their followers waiting on
	// them through Redis, when the master of the first one's slot dies.
	held := keyPaths("/held", 8)
	victim := rc.MasterOf(t, storetest.New(nil, "").SlotKey(fl.up.URL()+held[0]))
	if chs, err := victim.Client(t).PubSubShardChannels(ctx, "*").Result(); err != nil || len(chs) == 0 {
		t.Fatalf("PUBSUB SHARDCHANNELS on the victim = %v, %v; want the shard channels it serves", chs, err)
	}
	release := make(chan struct{})
	for _, p := range held {
		fl.up.Set(p, fakeupstream.Behavior{Block: release})
	}
	heldErrs := make(chan []error, 1)
	go func() { heldErrs <- fl.burstWithin(ctx, held, 3) }()
	if err := fl.awaitJoined(ctx, held, 3); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	victim.Kill()
	close(release)

	// Steady traffic while the cluster fails over, and until every
	// instance is back on Redis: waves of warm and cold urls.
	stop := fl.waves(ctx, warm, fl.burstWithin)
	nu := rc.WaitFailover(t, victim)
	failover := time.Since(begin)
	fl.waitHealthy(t)
	during, errs := stop()
	for _, err := range append(<-heldErrs, errs...) {
		t.Error(err)
	}
	fl.checkFetchedAtMostOnce(t, append(held, during...))
	for _, p := range warm {
		if got := fl.up.Count(p); got != 1 {
			t.Errorf("warm %s: upstream requests = %d; want 1 (served from L1 throughout)", p, got)
		}
	}

	attempts := fl.waitCoordinated(t, ctx, nu)
	t.Logf("master %s killed: replica %s promoted after %v, coordination restored after %v (%d extra attempts); %d cold keys during it, each fetched at most once per instance; Redis marked down %d times",
		victim.Addr(), nu.Addr(), failover.Round(time.Millisecond), time.Since(begin).Round(time.Millisecond), attempts, len(held)+len(during), fl.redisDowns())
	fl.checkCoordinated(t, ctx, "/after")
}

// TestRedisClusterFailoverWithoutShardChannel: the killed master serves no
// shard channel (their slots were moved off it first), so no subscription
// breaks, and none is re-established, to make go-redis reload its map of
// the slots, which would otherwise route the dead master's slots to it for
// up to a minute: meanwhile the instances would believe Redis up (their
// ping, keyless, is answered by a live master) while the keys of those
// slots are coordinated in-process only. The instances must find the
// promoted replica by themselves and coordinate again.
func TestRedisClusterFailoverWithoutShardChannel(t *testing.T) {
	rc := redistest.StartClusterWithReplicas(t, 3, 1)
	fl := failoverFleet(t, rc)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	victim, other := rc.Node(0), rc.Node(1)
	vc, oc := victim.Client(t), other.Client(t)
	chs, err := vc.PubSubShardChannels(ctx, "*").Result()
	if err != nil || len(chs) == 0 {
		t.Fatalf("PUBSUB SHARDCHANNELS on node 0 = %v, %v; want the shard channels it serves", chs, err)
	}
	for _, ch := range chs {
		rc.MoveSlot(t, rc.KeySlot(t, ch), other)
	}
	waitFor(t, 10*time.Second, func() bool {
		subs, err := oc.PubSubShardNumSub(ctx, chs...).Result()
		if err != nil {
			return false
		}
		for _, ch := range chs {
			if subs[ch] != int64(len(fl.instances)) {
				return false
			}
		}
		left, err := vc.PubSubShardChannels(ctx, "*").Result()
		return err == nil && len(left) == 0
	})

	begin := time.Now()
	victim.Kill()
	// Callers of keys in the dead master's slots are answered by
	// in-process coordination.
	for _, err := range fl.burstWithin(ctx, keyPaths("/during", 12), 2) {
		t.Error(err)
	}
	nu := rc.WaitFailover(t, victim)
	failover := time.Since(begin)
	fl.waitHealthy(t)
	attempts := fl.waitCoordinated(t, ctx, nu)
	t.Logf("master %s (no shard channel) killed: replica %s promoted after %v, coordination restored after %v (%d extra attempts); Redis marked down %d times",
		victim.Addr(), nu.Addr(), failover.Round(time.Millisecond), time.Since(begin).Round(time.Millisecond), attempts, fl.redisDowns())
	fl.checkCoordinated(t, ctx, "/after")
}

// failoverFleet starts three coordd instances on rc, with short Redis
// timeouts and lease (fastRedis), each with its own cluster client and
// counted upstream requests.
func failoverFleet(t *testing.T, rc *redistest.Cluster) *fleet {
	t.Helper()
	return newFleet(fleettest.StartFleet(t, 3, fleettest.FleetOptions{
		Tune:         func(cfg *coordinator.Config) { fastRedis(cfg); countPerCall(cfg) },
		CountFetches: true,
		Metrics:      true,
		RedisClient: func(cfg coordinator.Config) redis.UniversalClient {
			return rc.Client(t, func(o *redis.ClusterOptions) {
				o.DialTimeout, o.ReadTimeout, o.WriteTimeout = cfg.RedisTimeout, cfg.RedisTimeout, cfg.RedisTimeout
				o.ContextTimeoutEnabled = true
			})
		},
	}))
}

// burstWithin is burst with every call's deadline failoverCallTimeout away.
func (fl *fleet) burstWithin(ctx context.Context, paths []string, perInstance int) []error {
	ctx, cancel := context.WithTimeout(ctx, failoverCallTimeout)
	defer cancel()
	return fl.burst(ctx, paths, perInstance)
}

// failoverCallTimeout is each call's deadline in the failover tests: a
// follower whose leader could not announce its result waits out the lease
// (fastRedis: 1s, plus jitter) before it fetches in-process.
const failoverCallTimeout = 8 * time.Second

// waitHealthy waits (at most 20s) until every instance believes Redis up.
func (fl *fleet) waitHealthy(t *testing.T) {
	t.Helper()
	waitFor(t, 20*time.Second, func() bool {
		for _, in := range fl.instances {
			if !in.Coordinator.RedisHealthy() {
				return false
			}
		}
		return true
	})
}

// redisFailures counts the Redis operations that got no answer, on every
// instance started with Metrics: each one may have made its flight
// coordinate in-process.
func (fl *fleet) redisFailures(t *testing.T) (n float64) {
	for _, in := range fl.instances {
		if in.MetricsURL != "" {
			n += in.Scrape(t).Value("coordd_redis_errors_total", "kind", "unavailable")
		}
	}
	return n
}

func (fl *fleet) redisDowns() (n int64) {
	for _, in := range fl.instances {
		n += in.Metrics.RedisDowns()
	}
	return n
}

// waitCoordinated waits (at most 20s) until every instance is subscribed
// on the shard channels of nu, a promoted replica, and a burst over keys of
// every master is coordinated: one upstream request per key, every
// follower pushed. It returns how many bursts were not. Any failed call
// fails the test.
func (fl *fleet) waitCoordinated(t *testing.T, ctx context.Context, nu *redistest.Server) (attempts int) {
	t.Helper()
	nuc := nu.Client(t)
	waitFor(t, 20*time.Second, func() bool {
		chs, err := nuc.PubSubShardChannels(ctx, "*").Result()
		if err != nil {
			return false
		}
		subs, err := nuc.PubSubShardNumSub(ctx, chs...).Result()
		if err != nil {
			return false
		}
		for _, ch := range chs {
			if subs[ch] != int64(len(fl.instances)) {
				return false
			}
		}
		return true
	})
	for deadline := time.Now().Add(20 * time.Second); ; attempts++ {
		wakeups := fl.timerWakeups()
		paths := keyPaths(fmt.Sprintf("/restore%d", attempts), 12)
		fl.hold(ctx, paths, 2, nil)
		errs := fl.burstWithin(ctx, paths, 2)
		for _, err := range errs {
			t.Error(err)
		}
		ok := len(errs) == 0 && fl.timerWakeups() == wakeups
		for _, p := range paths {
			ok = ok && fl.up.Count(p) == 1
		}
		if ok {
			return attempts
		}
		if time.Now().After(deadline) {
			var counts []int
			for _, p := range paths {
				counts = append(counts, fl.up.Count(p))
			}
			var health []bool
			for _, in := range fl.instances {
				health = append(health, in.Coordinator.RedisHealthy())
			}
			t.Fatalf("coordination across instances not restored within 20s (%d attempts; the last: upstream requests %v, %d timer wakeups, healthy %v, %d downs)",
				attempts+1, counts, fl.timerWakeups()-wakeups, health, fl.redisDowns())
		}
	}
}

// checkCoordinated bursts on 16 cold keys, 3 callers per instance, and
// checks that each cost one upstream request, every follower pushed. The
// claim holds while Redis answers every instance in time: a burst during
// which an operation got no answer within the 200ms timeout (a process
// starved on a busy machine; its flight then coordinates in-process, one
// fetch per instance) proves nothing, and is made again with new keys, at
// most 5 times.
func (fl *fleet) checkCoordinated(t *testing.T, ctx context.Context, prefix string) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		wakeups, failures := fl.timerWakeups(), fl.redisFailures(t)
		paths := keyPaths(fmt.Sprintf("%s%d", prefix, attempt), 16)
		fl.hold(ctx, paths, 3, nil)
		for _, err := range fl.burstWithin(ctx, paths, 3) {
			t.Error(err)
		}
		if fl.redisFailures(t) != failures && attempt < 4 {
			t.Logf("%s: Redis did not answer an instance in time during the burst; again with new keys", prefix)
			fl.waitHealthy(t)
			continue
		}
		for _, p := range paths {
			if got := fl.up.Count(p); got != 1 {
				t.Errorf("%s: upstream requests = %d; want 1", p, got)
			}
		}
		if got := fl.timerWakeups() - wakeups; got != 0 {
			t.Errorf("%d followers woken by the lease timer; want every wakeup pushed", got)
		}
		return
	}
}
