package redistest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterTimeout bounds how long StartCluster and WaitOK wait for
// cluster_state:ok. A new master refuses to turn ok for its first 2s
// (Redis's CLUSTER_WRITABLE_DELAY), so formation takes a little over 2s.
const clusterTimeout = 10 * time.Second

// Cluster is a Redis Cluster of masters without replicas, each node a
// Server of its own. Its methods are safe for concurrent use.
type Cluster struct {
	nodes []*Server
}

// StartCluster starts a Redis Cluster of n masters (n >= 1) and no replicas,
// with the 16384 slots split evenly in node order, and waits (about 2s,
// at most 10s)
// until every node reports cluster_state:ok and knows all the others. Each
// node is a Server started as by Start (opts apply to every node) plus
// --cluster-enabled yes, its bus on a second free port, and
// --cluster-node-timeout 5000. All nodes are killed when the test ends.
//
// The cluster is formed directly with CLUSTER ADDSLOTSRANGE, SET-CONFIG-EPOCH
// and MEET (every node meets every other, so no peer waits for gossip), so
// only redis-server is needed, not redis-cli. Fault methods on Node(i) work as for a single server;
// a node's cluster configuration (nodes.conf) survives Kill and Restart,
// so a restarted node rejoins with its slots but no keys.
//
// Like Start, it calls t.Fatalf on failure.
func StartCluster(t testing.TB, n int, opts ...Option) *Cluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("redistest: StartCluster(%d): need at least one node", n)
	}
	opts = append([]Option{func(c *config) { c.cluster = true }}, opts...)
	c := &Cluster{nodes: make([]*Server, n)}
	for i := range c.nodes {
		c.nodes[i] = Start(t, opts...)
	}
	if err := c.form(); err != nil {
		var b strings.Builder
		for i, s := range c.nodes {
			fmt.Fprintf(&b, "--- node %d (%s):\n%s\n", i, s.Addr(), s.out.tail(outputTail))
		}
		t.Fatalf("redistest: form cluster: %v\n%s", err, b.String())
	}
	return c
}

// form assigns slots, epochs and meets the nodes, then waits for agreement.
func (c *Cluster) form() error {
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	clients := c.clients()
	defer closeAll(clients)
	const slots = 16384
	n := len(c.nodes)
	for i, rc := range clients {
		lo, hi := i*slots/n, (i+1)*slots/n-1
		if err := rc.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			return fmt.Errorf("node %d: CLUSTER ADDSLOTSRANGE %d %d: %w", i, lo, hi, err)
		}
		if err := rc.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return fmt.Errorf("node %d: CLUSTER SET-CONFIG-EPOCH: %w", i, err)
		}
	}
	// Every node meets every other, so none has to learn a peer by gossip,
	// which runs only about once a second.
	for i, rc := range clients {
		for j, s := range c.nodes {
			if j == i {
				continue
			}
			if err := rc.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", s.port, s.arg("--cluster-port")).Err(); err != nil {
				return fmt.Errorf("node %d: CLUSTER MEET node %d: %w", i, j, err)
			}
		}
	}
	return c.waitOK(ctx, clients)
}

// waitOK polls CLUSTER INFO on every node until each reports
// cluster_state:ok and knows all the nodes.
func (c *Cluster) waitOK(ctx context.Context, clients []*redis.Client) error {
	want := "cluster_known_nodes:" + strconv.Itoa(len(c.nodes)) + "\r\n"
	for i, rc := range clients {
		for {
			info, err := rc.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok\r\n") && strings.Contains(info, want) {
				break
			}
			if ctx.Err() != nil {
				return fmt.Errorf("node %d not ok within %v: CLUSTER INFO = %q, %v", i, clusterTimeout, info, err)
			}
			time.Sleep(20 * time.Millisecond) // polling gossip; redis offers no notification
		}
	}
	return nil
}

// WaitOK waits (at most 10s) until every node reports cluster_state:ok and
// knows all the others, as after a node's Restart. Every node must be
// running. It calls t.Fatalf on timeout, so call it from the test goroutine.
func (c *Cluster) WaitOK(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	clients := c.clients()
	defer closeAll(clients)
	if err := c.waitOK(ctx, clients); err != nil {
		t.Fatalf("redistest: %v", err)
	}
}

// clients returns one plain client per node; the caller closes them.
func (c *Cluster) clients() []*redis.Client {
	clients := make([]*redis.Client, len(c.nodes))
	for i, s := range c.nodes {
		clients[i] = redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	}
	return clients
}

func closeAll(clients []*redis.Client) {
	for _, rc := range clients {
		_ = rc.Close()
	}
}

// Addrs returns the nodes' host:port addresses, in node order.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		addrs[i] = s.Addr()
	}
	return addrs
}

// Node returns the i-th node, for fault injection on it.
func (c *Cluster) Node(i int) *Server {
	return c.nodes[i]
}

// Len returns the number of nodes.
func (c *Cluster) Len() int {
	return len(c.nodes)
}

// Client returns a go-redis cluster client seeded with every node's
// address, closed when t ends. Each opt may adjust the options first.
func (c *Cluster) Client(t testing.TB, opts ...func(*redis.ClusterOptions)) *redis.ClusterClient {
	t.Helper()
	o := &redis.ClusterOptions{Addrs: c.Addrs()}
	for _, f := range opts {
		f(o)
	}
	rc := redis.NewClusterClient(o)
	t.Cleanup(func() { _ = rc.Close() })
	return rc
}
