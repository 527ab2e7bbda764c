package server_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/enginetest"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/server"
)

func fastRedis(c *coordinator.Config) {
	c.RedisTimeout = 200 * time.Millisecond
	c.RedisRetryInterval = 100 * time.Millisecond
	c.LockTTL = time.Second
}

func totalFetches(cl *cluster) (n int64, per []int64) {
	for _, in := range cl.instances {
		k := in.Metrics.Fetches()
		per = append(per, k)
		n += k
	}
	return n, per
}

func checkAll(t *testing.T, out []outcome, want []byte) {
	t.Helper()
	for i, o := range out {
		if o.err != nil {
			t.Fatalf("caller %d (instance %d): %v", i, o.instance, o.err)
		}
		if !bytes.Equal(o.doc.Body, want) {
			t.Fatalf("caller %d: body differs", i)
		}
	}
}

func TestRedisKilledMidBurst(t *testing.T) {
	cl := startCluster(t, 3, fastRedis)
	const path = "/burst"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Once the leader is fetching and the others wait on it, kill Redis;
	// answer once the followers of the other instances, cut off, each
	// lead in-process and fetch.
	cl.holdFirst(ctx, path, 300, func() {
		cl.redis.Kill()
		if err := cl.up.WaitCount(ctx, path, len(cl.instances)); err != nil {
			t.Errorf("the followers cut off from Redis did not fetch: %v", err)
		}
	})
	out := cl.burst(t, ctx, 300, func(int) *coorddv1.GetOrFetchRequest {
		return &coorddv1.GetOrFetchRequest{Url: cl.url(path)}
	})
	checkAll(t, out, cl.up.Body(path))
	n, per := totalFetches(cl)
	for i, k := range per {
		if k > 1 {
			t.Fatalf("instance %d fetched %d times; want at most 1 per instance", i, k)
		}
	}
	t.Logf("Redis killed mid-burst: 300/300 callers answered; upstream fetches per instance %v (total %d, upstream saw %d)", per, n, cl.up.Count(path))

	// Health: overall SERVING throughout; the Redis component shows the
	// degradation, and recovers by itself once Redis is back.
	hc := healthClient(t, cl.instances[0])
	if st := healthStatus(t, hc, ""); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("overall health = %v while Redis is down; want SERVING", st)
	}
	if st := healthStatus(t, hc, server.RedisHealthService); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("redis component = %v while Redis is down; want NOT_SERVING", st)
	}
	cl.redis.Restart()
	waitFor(t, 10*time.Second, func() bool {
		for _, in := range cl.instances {
			if !in.Coordinator.RedisHealthy() {
				return false
			}
		}
		return true
	})
	if st := healthStatus(t, hc, server.RedisHealthService); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("redis component = %v after recovery; want SERVING", st)
	}
	// Coordinated again: a new cold key is fetched once across instances.
	const path2 = "/after"
	cl.holdFirst(ctx, path2, 60, nil)
	out = cl.burst(t, ctx, 60, func(int) *coorddv1.GetOrFetchRequest { return &coorddv1.GetOrFetchRequest{Url: cl.url(path2)} })
	checkAll(t, out, cl.up.Body(path2))
	if got := cl.up.Count(path2); got != 1 {
		t.Fatalf("after Redis recovered: upstream requests = %d; want 1", got)
	}
}

func TestLockHolderInstanceCrashes(t *testing.T) {
	cl := startCluster(t, 3, fastRedis)
	const path = "/holder"
	release := make(chan struct{})
	defer close(release)
	cl.up.SetSequence(path, []fakeupstream.Behavior{{Block: release}, {}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Instance 0 leads: its caller arrives first and its fetch hangs.
	leaderErr := make(chan error, 1)
	go func() {
		_, err := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url(path)})
		leaderErr <- err
	}()
	if err := cl.up.WaitCount(ctx, path, 1); err != nil {
		t.Fatal(err)
	}
	// Followers on the other instances wait for it.
	done := make(chan []outcome, 1)
	go func() {
		done <- cl.burst(t, ctx, 100, func(int) *coorddv1.GetOrFetchRequest { return &coorddv1.GetOrFetchRequest{Url: cl.url(path)} })
	}()
	if err := cl.awaitJoined(ctx, path, 1+100); err != nil {
		t.Fatalf("the followers never all joined: %v", err)
	}
	crashed := time.Now()
	cl.instances[0].Crash()
	out := <-done
	took := time.Since(crashed)
	for i, o := range out {
		if o.instance == 0 {
			continue // its server is gone; its callers see the connection fail
		}
		if o.err != nil {
			t.Fatalf("caller %d on instance %d: %v", i, o.instance, o.err)
		}
		if !bytes.Equal(o.doc.Body, cl.up.Body(path)) {
			t.Fatalf("caller %d: body differs", i)
		}
	}
	if err := <-leaderErr; err == nil {
		t.Fatalf("the crashed instance's caller succeeded; want a connection error")
	}
	if got := cl.up.Count(path); got != 2 {
		t.Fatalf("upstream requests = %d; want 2 (the crashed holder's, then one takeover)", got)
	}
	t.Logf("holder crashed: the surviving instances took over and answered their callers %v after the crash (lease 1s)", took)
}

func TestRedisFrozen(t *testing.T) {
	cl := startCluster(t, 2, fastRedis)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Warm one key into L1 first.
	if _, err := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url("/warm")}); err != nil {
		t.Fatal(err)
	}
	cl.redis.Pause()
	defer cl.redis.Resume()
	start := time.Now()
	out := cl.burst(t, ctx, 100, func(i int) *coorddv1.GetOrFetchRequest {
		if i%2 == 0 {
			return &coorddv1.GetOrFetchRequest{Url: cl.url("/warm")}
		}
		return &coorddv1.GetOrFetchRequest{Url: cl.url("/cold")}
	})
	for i, o := range out {
		if o.err != nil {
			t.Fatalf("caller %d: %v", i, o.err)
		}
	}
	_, per := totalFetches(cl)
	for i, k := range per {
		if i == 0 && k > 2 || i > 0 && k > 1 { // instance 0 fetched /warm before the freeze
			t.Fatalf("instance %d fetched %d times; want at most one /cold per instance", i, k)
		}
	}
	t.Logf("Redis frozen (SIGSTOP): 100/100 callers answered in %v with RedisTimeout=200ms", time.Since(start))
}

func TestHealthAndReflection(t *testing.T) {
	cl := startCluster(t, 1, nil)
	in := cl.instances[0]
	hc := healthClient(t, in)
	for _, svc := range []string{"", coorddv1.CoordinatorService_ServiceDesc.ServiceName} {
		if st := healthStatus(t, hc, svc); st != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health(%q) = %v; want SERVING", svc, st)
		}
	}
	cc, err := grpc.NewClient(in.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	rctx, rcancel := context.WithCancel(context.Background())
	defer rcancel()
	rs, err := reflectpb.NewServerReflectionClient(cc).ServerReflectionInfo(rctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Send(&reflectpb.ServerReflectionRequest{MessageRequest: &reflectpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := rs.Recv()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, s := range resp.GetListServicesResponse().GetService() {
		names[s.GetName()] = true
	}
	for _, want := range []string{"coordd.v1.CoordinatorService", "grpc.health.v1.Health"} {
		if !names[want] {
			t.Fatalf("reflection lists %v; want %s", names, want)
		}
	}
	rcancel()
	// Drain: health goes NOT_SERVING, an in-flight stream still finishes.
	release := make(chan struct{})
	cl.up.Set("/slow", fakeupstream.Behavior{Block: release})
	got := make(chan error, 1)
	go func() {
		_, err := fleettest.Get(context.Background(), cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url("/slow")})
		got <- err
	}()
	if err := cl.up.WaitCount(context.Background(), "/slow", 1); err != nil {
		t.Fatal(err)
	}
	drained := make(chan struct{})
	go func() { in.Stop(); close(drained) }()
	waitFor(t, 5*time.Second, func() bool {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{})
		return err != nil || r.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING
	})
	close(release)
	if err := <-got; err != nil {
		t.Fatalf("in-flight stream during drain: %v", err)
	}
	<-drained
}

func healthClient(t *testing.T, in *fleettest.Instance) healthpb.HealthClient {
	t.Helper()
	cc, err := grpc.NewClient(in.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return healthpb.NewHealthClient(cc)
}

func healthStatus(t *testing.T, hc healthpb.HealthClient, svc string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
	if err != nil {
		t.Fatalf("health check %q: %v", svc, err)
	}
	return r.GetStatus()
}

// waitFor waits until cond holds, failing the test after limit.
func waitFor(t *testing.T, limit time.Duration, cond func() bool) {
	t.Helper()
	enginetest.WaitFor(t, limit, "the condition", cond)
}

// awaitSubscribers waits until each of chs, plain channels or shard
// channels (shard) of rdb's server, has n subscribers, or ctx ends: the
// instances subscribed again after their subscriptions were cut.
func awaitSubscribers(ctx context.Context, rdb *redis.Client, chs []string, shard bool, n int) error {
	return enginetest.Poll(ctx, func() bool {
		count := rdb.PubSubNumSub
		if shard {
			count = rdb.PubSubShardNumSub
		}
		subs, err := count(ctx, chs...).Result()
		if err != nil {
			return false
		}
		for _, ch := range chs {
			if subs[ch] != int64(n) {
				return false
			}
		}
		return true
	})
}

// TestStartsWithRedisDown: an instance whose Redis is down at start serves
// in-process, and joins the cluster by itself once Redis answers.
func TestStartsWithRedisDown(t *testing.T) {
	cl := startCluster(t, 1, fastRedis)
	cl.redis.Kill()
	// The running instance notices (its subscription breaks) before Redis
	// returns, so that it is not still degraded during the burst below.
	waitFor(t, 10*time.Second, func() bool { return !cl.instances[0].Coordinator.RedisHealthy() })
	cfg := coordinator.Config{Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: cl.up.URL()}}}
	fastRedis(&cfg)
	in := fleettest.Start(t, fleettest.Options{RedisURL: cl.redis.URL(), Config: cfg})
	c := in.Dial(t)
	ctx := context.Background()
	if in.Coordinator.RedisHealthy() {
		t.Fatal("RedisHealthy with Redis down")
	}
	if _, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: cl.url("/early")}); err != nil {
		t.Fatalf("with Redis down at start: %v", err)
	}
	cl.redis.Restart()
	waitFor(t, 10*time.Second, func() bool { return in.Coordinator.RedisHealthy() && cl.instances[0].Coordinator.RedisHealthy() })
	// Now coordinated with the other instance.
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cl.instances = append(cl.instances, in)
	cl.clients = append(cl.clients, c)
	cl.holdFirst(cctx, "/late", 40, nil)
	out := cl.burst(t, cctx, 40, func(int) *coorddv1.GetOrFetchRequest { return &coorddv1.GetOrFetchRequest{Url: cl.url("/late")} })
	checkAll(t, out, cl.up.Body("/late"))
	if got := cl.up.Count("/late"); got != 1 {
		t.Fatalf("upstream requests = %d; want 1 once Redis is back", got)
	}
}

// TestLeaderStoppedHandsOff: an instance stopped (SIGTERM) while it leads a
// fetch releases its lock and tells the followers on other instances, who
// take over at once instead of waiting for the lease to run out.
func TestLeaderStoppedHandsOff(t *testing.T) {
	cl := startCluster(t, 2, nil) // a follower not told would find the lease lapsed: a timer wakeup
	release := make(chan struct{})
	defer close(release)
	cl.up.SetSequence("/deploy", []fakeupstream.Behavior{{Block: release}, {}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go func() { _, _ = fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url("/deploy")}) }()
	if err := cl.up.WaitCount(ctx, "/deploy", 1); err != nil {
		t.Fatal(err)
	}
	got := make(chan outcome, 1)
	go func() {
		d, err := fleettest.Get(ctx, cl.clients[1], &coorddv1.GetOrFetchRequest{Url: cl.url("/deploy")})
		got <- outcome{doc: d, err: err}
	}()
	if err := cl.awaitJoined(ctx, "/deploy", 2); err != nil { // the follower waits on instance 0
		t.Fatal(err)
	}
	cl.instances[0].Coordinator.Close()
	o := <-got
	if o.err != nil || !bytes.Equal(o.doc.Body, cl.up.Body("/deploy")) {
		t.Fatalf("follower: %v", o.err)
	}
	if n := cl.instances[1].Metrics.TimerWakeups(); n != 0 {
		t.Fatalf("the follower waited for the lease (%d timer wakeups); want it told at once", n)
	}
	if got := cl.up.Count("/deploy"); got != 2 {
		t.Fatalf("upstream requests = %d; want 2", got)
	}
}

// TestSubscriptionCut: cutting only the pub/sub connections (a proxy
// dropping them, CLIENT KILL) while followers wait loses no wakeup and
// degrades nothing: still one fetch, every follower pushed.
func TestSubscriptionCut(t *testing.T) {
	cl := startCluster(t, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rdb := cl.redis.Client(t)
	cl.holdFirst(ctx, "/cut", 150, func() {
		chs, err := rdb.PubSubChannels(ctx, "*").Result()
		if err != nil || len(chs) == 0 {
			t.Errorf("PUBSUB CHANNELS = %v, %v; want the instances' channel", chs, err)
		}
		if err := rdb.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
			t.Errorf("CLIENT KILL: %v", err)
		}
		if err := awaitSubscribers(ctx, rdb, chs, false, len(cl.instances)); err != nil {
			t.Errorf("the instances never subscribed again: %v", err)
		}
	})
	out := cl.burst(t, ctx, 150, func(int) *coorddv1.GetOrFetchRequest { return &coorddv1.GetOrFetchRequest{Url: cl.url("/cut")} })
	checkAll(t, out, cl.up.Body("/cut"))
	if got := cl.up.Count("/cut"); got != 1 {
		t.Fatalf("upstream requests = %d; want 1", got)
	}
	for i, in := range cl.instances {
		if !in.Coordinator.RedisHealthy() {
			t.Fatalf("instance %d degraded by a cut subscription", i)
		}
	}
	cl.checkPushOnly(t)
}
