package redistest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/coordd/coordd/internal/redistest"
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
	before, err := c.Node(1).Client(t).ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatalf("CLUSTER SLOTS: %v", err)
	}
	c.Node(1).Restart()
	c.WaitOK(t)
	after, err := c.Node(1).Client(t).ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatalf("CLUSTER SLOTS after Restart: %v", err)
	}
	if len(after) != len(before) {
		t.Fatalf("CLUSTER SLOTS after Restart has %d ranges; want %d", len(after), len(before))
	}
	if err := c.Client(t).Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET after Restart: %v", err)
	}
}
