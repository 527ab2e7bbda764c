package redistest_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/coordd/coordd/internal/testing/redistest"
)

func TestStartCluster(t *testing.T) {
	t.Parallel()
	begin := time.Now()
	c := redistest.StartCluster(t, 3)
	t.Logf("cluster of 3 up in %v", time.Since(begin))
	if got := len(c.Addrs()); got != 3 {
		t.Fatalf("len(Addrs()) = %d; want 3", got)
	}

	ctx := context.Background()
	rc := c.Client(t)
	for i := range 50 {
		k := fmt.Sprintf("key-%d", i)
		if err := rc.Set(ctx, k, i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
	}
	// Keys spread over all three masters.
	for i := range c.Len() {
		n, err := c.Node(i).Client(t).DBSize(ctx).Result()
		if err != nil || n == 0 {
			t.Errorf("node %d DBSIZE = %d, %v; want > 0", i, n, err)
		}
	}

	// A killed node takes its slots down; restarted, it rejoins empty.
	n0 := c.Node(0)
	n0.Kill()
	n0.Restart()
	c.WaitOK(t)
	direct := n0.Client(t)
	if n, err := direct.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("restarted node DBSIZE = %d, %v; want 0", n, err)
	}
}

func TestStartClusterSingleNode(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 1)
	rc := c.Client(t, func(o *redis.ClusterOptions) { o.MaxRedirects = 1 })
	if err := rc.Set(context.Background(), "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
}

func TestStartClusterRestartKeepsSlots(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	ctx := context.Background()
	ranges := func(shards []redis.ClusterShard) (n int) {
		for _, sh := range shards {
			n += len(sh.Slots)
		}
		return n
	}
	before, err := c.Node(1).Client(t).ClusterShards(ctx).Result()
	if err != nil {
		t.Fatalf("CLUSTER SHARDS: %v", err)
	}
	c.Node(1).Restart()
	c.WaitOK(t)
	after, err := c.Node(1).Client(t).ClusterShards(ctx).Result()
	if err != nil {
		t.Fatalf("CLUSTER SHARDS after Restart: %v", err)
	}
	if ranges(after) != ranges(before) {
		t.Fatalf("CLUSTER SHARDS after Restart has %d slot ranges; want %d", ranges(after), ranges(before))
	}
	if err := c.Client(t).Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET after Restart: %v", err)
	}
}

// TestStartClusterWithReplicasFailover: killed, the master of a key's slot
// is replaced by its replica, which kept the key, and a cluster client
// writes again once it has reloaded its map of the slots.
func TestStartClusterWithReplicasFailover(t *testing.T) {
	t.Parallel()
	begin := time.Now()
	c := redistest.StartClusterWithReplicas(t, 3, 1)
	t.Logf("3 masters with a replica each up in %v", time.Since(begin))
	if got := c.Len(); got != 6 {
		t.Fatalf("Len() = %d; want 6", got)
	}
	ctx := context.Background()
	for i := range 3 {
		role, err := c.Node(3+i).Client(t).Info(ctx, "replication").Result()
		if err != nil || !strings.Contains(role, "role:slave\r\n") || !strings.Contains(role, "master_port:"+strconv.Itoa(port(t, c.Node(i)))+"\r\n") {
			t.Fatalf("node %d: INFO replication = %q, %v; want master node %d's replica", 3+i, role, err, i)
		}
	}

	rc := c.Client(t, func(o *redis.ClusterOptions) { o.DialTimeout = 300 * time.Millisecond })
	const key = "k" // slot 7629: node 1's
	old := c.MasterOf(t, key)
	if old != c.Node(1) {
		t.Fatalf("MasterOf(%q) = %s; want node 1 (%s)", key, old.Addr(), c.Node(1).Addr())
	}
	if err := rc.Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	// Replicated before the kill, so that the promoted replica has it.
	if n, err := old.Client(t).Wait(ctx, 1, time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v", n, err)
	}

	begin = time.Now()
	old.Kill()
	nu := c.WaitFailover(t, old)
	t.Logf("failover in %v", time.Since(begin))
	if nu != c.Node(4) {
		t.Fatalf("new master %s; want node 1's replica, node 4 (%s)", nu.Addr(), c.Node(4).Addr())
	}
	if got := c.MasterOf(t, key); got != nu {
		t.Fatalf("MasterOf(%q) = %s after failover; want %s", key, got.Addr(), nu.Addr())
	}
	// The client still routes the slot to the dead node: no MOVED reply
	// tells it otherwise. It must reload its map of the slots.
	if err := rc.Get(ctx, key).Err(); err == nil {
		t.Fatalf("GET through the cluster client before ReloadState succeeded; want it sent to the dead node")
	}
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		rc.ReloadState(ctx)
		var got string
		if got, err = rc.Get(ctx, key).Result(); err == nil && got != "v" {
			err = errors.New("GET k = " + got)
		}
		if err == nil {
			err = rc.Set(ctx, key, "w", 0).Err()
		}
		if err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("GET and SET through the cluster client after failover: %v", err)
	}
	if got, err := nu.Client(t).Get(ctx, key).Result(); err != nil || got != "w" {
		t.Fatalf("GET on the new master = %q, %v; want w", got, err)
	}
}

// TestClusterMoveSlot: a slot moves to another master, the replicas
// agreeing (they refuse SETSLOT themselves), and a cluster client follows
// the MOVED reply there; then the new owner's failover takes the slot to
// its replica.
func TestClusterMoveSlot(t *testing.T) {
	t.Parallel()
	c := redistest.StartClusterWithReplicas(t, 3, 1)
	const key = "k"
	if got, want := c.KeySlot(t, key), 7629; got != want {
		t.Fatalf("KeySlot(%q) = %d; want %d", key, got, want)
	}
	if got := c.MasterOf(t, key); got != c.Node(1) {
		t.Fatalf("MasterOf(%q) = %s; want node 1 (%s)", key, got.Addr(), c.Node(1).Addr())
	}
	ctx := context.Background()
	rc := c.Client(t)
	if err := rc.Ping(ctx).Err(); err != nil { // loads the map of the slots
		t.Fatalf("PING: %v", err)
	}
	to := c.Node(2)
	c.MoveSlot(t, 7629, to)
	if got := c.MasterOf(t, key); got != to {
		t.Fatalf("MasterOf(%q) after MoveSlot = %s; want node 2 (%s)", key, got.Addr(), to.Addr())
	}
	if err := rc.Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatalf("SET after MoveSlot: %v", err)
	}
	if n, err := to.Client(t).Exists(ctx, key).Result(); err != nil || n != 1 {
		t.Fatalf("EXISTS on node 2 = %d, %v; want the key written there", n, err)
	}

	to.Kill()
	nu := c.WaitFailover(t, to)
	if nu != c.Node(5) {
		t.Fatalf("new master %s; want node 2's replica, node 5 (%s)", nu.Addr(), c.Node(5).Addr())
	}
	if got := c.MasterOf(t, key); got != nu {
		t.Fatalf("MasterOf(%q) after failover = %s; want %s", key, got.Addr(), nu.Addr())
	}
}

func port(t *testing.T, s *redistest.Server) int {
	t.Helper()
	_, p, _ := net.SplitHostPort(s.Addr())
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("port of %s: %v", s.Addr(), err)
	}
	return n
}
