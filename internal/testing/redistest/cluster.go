package redistest

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// clusterTimeout bounds how long StartCluster and WaitOK wait for
	// cluster_state:ok. A new master refuses to turn ok for its first 2s
	// (Redis's CLUSTER_WRITABLE_DELAY), so formation takes a little over 2s.
	clusterTimeout = 10 * time.Second
	// FailoverNodeTimeout is the --cluster-node-timeout of
	// StartClusterWithReplicas: a killed master is failed, and its replica
	// promoted, about 2-3s after it dies.
	FailoverNodeTimeout = time.Second
	// failoverTimeout bounds how long WaitFailover waits.
	failoverTimeout = 15 * time.Second
)

// Cluster is a Redis Cluster of masters, with or without replicas, each
// node a Server of its own. Its methods are safe for concurrent use.
type Cluster struct {
	nodes   []*Server // the masters in slot order, then the replicas
	of      []int     // per node: the index of the master it was made a replica of; -1 for a master
	masters int       // how many nodes were made masters

	mu    sync.Mutex // protects ids and owner
	ids   []string   // per node: its node ID, fixed (nodes.conf keeps it across Restart)
	owner []int      // per slot: the index of the node serving it, as last set by form, MoveSlot or WaitFailover
}

// clusterSlots is the number of slots in Redis Cluster.
const clusterSlots = 16384

// StartCluster starts a Redis Cluster of n masters (n >= 1) and no replicas,
// with the 16384 slots split evenly in node order, and waits (about 2s,
// at most 10s)
// until every node reports cluster_state:ok and knows all the others. Each
// node is a Server started as by Start (opts apply to every node) plus
// --cluster-enabled yes, its bus on a second free port, and
// --cluster-node-timeout 5000 (see WithClusterNodeTimeout). All nodes are
// killed when the test ends.
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
	SkipShort(t)
	if n < 1 {
		t.Fatalf("redistest: StartCluster(%d): need at least one node", n)
	}
	return startCluster(t, n, 0, opts)
}

// StartClusterWithReplicas starts a Redis Cluster as StartCluster does,
// of masters masters, each with replicasPerMaster replicas attached with
// CLUSTER REPLICATE, and waits (about 2-3s, at most 10s) until, besides
// cluster_state:ok everywhere, every replica is in sync (master_link_status:up)
// and every node knows which master each replica follows, so that a
// master's failover can start at once. Node(i) for i < masters is master
// i; Node(masters + i*replicasPerMaster + j) is replica j of master i.
// A replica is promoted only with the votes of a majority of the masters:
// for a cluster to survive a master's death, start at least 3.
//
// The nodes run with --cluster-node-timeout of FailoverNodeTimeout (1s;
// WithClusterNodeTimeout in opts overrides it), so that a killed master is
// replaced by a replica within about 3s (see WaitFailover), and with
// --repl-diskless-sync-delay 0, so that the replicas sync at once.
//
// Like Start, it calls t.Fatalf on failure.
func StartClusterWithReplicas(t testing.TB, masters, replicasPerMaster int, opts ...Option) *Cluster {
	t.Helper()
	SkipShort(t)
	if masters < 1 || replicasPerMaster < 0 {
		t.Fatalf("redistest: StartClusterWithReplicas(%d, %d): need a master and no fewer than 0 replicas", masters, replicasPerMaster)
	}
	opts = append([]Option{WithClusterNodeTimeout(FailoverNodeTimeout), WithArgs("--repl-diskless-sync-delay", "0")}, opts...)
	return startCluster(t, masters, replicasPerMaster, opts)
}

func startCluster(t testing.TB, masters, replicasPerMaster int, opts []Option) *Cluster {
	t.Helper()
	opts = append([]Option{func(c *config) { c.cluster = true }}, opts...)
	n := masters * (1 + replicasPerMaster)
	c := &Cluster{nodes: make([]*Server, n), of: make([]int, n), masters: masters}
	for i := range c.nodes {
		c.nodes[i] = Start(t, opts...)
		c.of[i] = -1
		if i >= masters {
			c.of[i] = (i - masters) / replicasPerMaster
		}
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

// form assigns slots, epochs and meets the nodes, attaches the replicas,
// then waits for agreement.
func (c *Cluster) form() error {
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	clients := c.clients()
	defer closeAll(clients)
	m := c.masters
	ids := make([]string, len(c.nodes))
	owner := make([]int, clusterSlots)
	for i, rc := range clients {
		var err error
		if ids[i], err = rc.ClusterMyID(ctx).Result(); err != nil {
			return fmt.Errorf("node %d: CLUSTER MYID: %w", i, err)
		}
		if i >= m {
			continue
		}
		lo, hi := i*clusterSlots/m, (i+1)*clusterSlots/m-1
		if err := rc.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			return fmt.Errorf("node %d: CLUSTER ADDSLOTSRANGE %d %d: %w", i, lo, hi, err)
		}
		if err := rc.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return fmt.Errorf("node %d: CLUSTER SET-CONFIG-EPOCH: %w", i, err)
		}
		for s := lo; s <= hi; s++ {
			owner[s] = i
		}
	}
	c.mu.Lock()
	c.ids, c.owner = ids, owner
	c.mu.Unlock()
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
	// A replica can follow its master only once the handshake MEET started
	// is over: until then it knows the master by a temporary ID.
	for i := m; i < len(c.nodes); i++ {
		for {
			err := clients[i].ClusterReplicate(ctx, ids[c.of[i]]).Err()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return fmt.Errorf("node %d: CLUSTER REPLICATE node %d: %w", i, c.of[i], err)
			}
			time.Sleep(20 * time.Millisecond) // polling the handshake; redis offers no notification
		}
	}
	if err := c.waitOK(ctx, clients); err != nil {
		return err
	}
	return c.waitReplicas(ctx, clients)
}

// waitReplicas waits until every replica is in sync with its master and
// every node's CLUSTER NODES names each replica's master: a master votes
// for a replica's promotion only if it knows whose replica it is.
func (c *Cluster) waitReplicas(ctx context.Context, clients []*redis.Client) error {
	for i := c.masters; i < len(c.nodes); i++ {
		if err := waitInfo(ctx, c.nodes[i].Addr(), "replication", "master_link_status:up"); err != nil {
			return fmt.Errorf("replica node %d: %w", i, err)
		}
	}
	for i, rc := range clients {
		for {
			view, err := rc.ClusterNodes(ctx).Result()
			missing := ""
			if err == nil {
				missing = c.missingReplica(view)
			}
			if err == nil && missing == "" {
				break
			}
			if ctx.Err() != nil {
				return fmt.Errorf("node %d does not know %s within %v: %v", i, missing, clusterTimeout, err)
			}
			time.Sleep(20 * time.Millisecond) // polling gossip; redis offers no notification
		}
	}
	return nil
}

// missingReplica returns the first replica that a CLUSTER NODES view does
// not show as its master's, described for a message; "" if none.
func (c *Cluster) missingReplica(view string) string {
	masterOf := make(map[string]string) // replica ID -> master ID
	for _, line := range strings.Split(view, "\n") {
		// <id> <ip:port@cport> <flags> <master> ...
		f := strings.Fields(line)
		if len(f) >= 4 && slices.Contains(strings.Split(f[2], ","), "slave") {
			masterOf[f[0]] = f[3]
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := c.masters; i < len(c.nodes); i++ {
		if masterOf[c.ids[i]] != c.ids[c.of[i]] {
			return fmt.Sprintf("node %d as node %d's replica", i, c.of[i])
		}
	}
	return ""
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

// running returns the indexes of the nodes that are running.
func (c *Cluster) running() []int {
	var indexes []int
	for i, s := range c.nodes {
		if s.Running() {
			indexes = append(indexes, i)
		}
	}
	return indexes
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

// MasterOf returns the node serving key's slot (KeySlot) as master, as
// the first running node that answers CLUSTER SHARDS sees it: a killed
// master not yet failed over is still named. Call WaitFailover first to
// ask after a failover. key may be any string, a channel name too. It
// calls t.Fatalf if no running node answers or the one that does names a
// node not of this cluster, so call it from the test goroutine.
func (c *Cluster) MasterOf(t testing.TB, key string) *Server {
	t.Helper()
	slot := c.KeySlot(t, key)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	clients := c.clients()
	defer closeAll(clients)
	var err error
	for _, i := range c.running() {
		var addr string
		if addr, err = slotMaster(ctx, clients[i], slot); err != nil {
			continue
		}
		if j := c.index(addr); j >= 0 {
			return c.nodes[j]
		}
		t.Fatalf("redistest: node %d names %s as master of %q, which is none of the nodes", i, addr, key)
	}
	t.Fatalf("redistest: no running node tells the master of %q: %v", key, err)
	return nil
}

// slotMaster returns the address of slot's master in rc's CLUSTER SHARDS.
func slotMaster(ctx context.Context, rc *redis.Client, slot int) (string, error) {
	shards, err := rc.ClusterShards(ctx).Result()
	if err != nil {
		return "", err
	}
	for _, sh := range shards {
		if !slices.ContainsFunc(sh.Slots, func(r redis.SlotRange) bool { return r.Start <= int64(slot) && int64(slot) <= r.End }) {
			continue
		}
		for _, n := range sh.Nodes {
			if n.Role == "master" {
				return net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10)), nil
			}
		}
	}
	return "", fmt.Errorf("slot %d is served by no node", slot)
}

// isMaster reports whether rc's node answers INFO replication as a master.
func isMaster(ctx context.Context, rc *redis.Client) bool {
	info, err := rc.Info(ctx, "replication").Result()
	return err == nil && strings.Contains(info, "role:master\r\n")
}

// index returns the index of the node at addr, or -1.
func (c *Cluster) index(addr string) int {
	for i, s := range c.nodes {
		if s.Addr() == addr {
			return i
		}
	}
	return -1
}

// WaitFailover waits (at most 15s) until the slots old served as master
// are served by another node, which answers INFO replication as a master, and every
// running node other than old reports cluster_state:ok and names that node
// as their master in CLUSTER SHARDS; it returns that node. Typically old
// was just killed: with FailoverNodeTimeout the masters fail it after
// about 1.5-2s and its replica is promoted about a second later. It calls
// t.Fatalf on timeout, or if old served no slots when the Cluster last
// looked (at formation, the last MoveSlot or WaitFailover), so call it from
// the test goroutine.
//
// A go-redis ClusterClient (Client) learns of the new master only when a
// command is redirected (MOVED) or every ClusterStateReloadInterval (a
// minute): until then its commands for those slots fail against the dead
// node. ReloadState makes it ask now.
func (c *Cluster) WaitFailover(t testing.TB, old *Server) *Server {
	t.Helper()
	o := c.index(old.Addr())
	c.mu.Lock()
	slot := slices.Index(c.owner, o)
	c.mu.Unlock()
	if o < 0 || slot < 0 {
		t.Fatalf("redistest: WaitFailover: %s serves no slots", old.Addr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), failoverTimeout)
	defer cancel()
	clients := c.clients()
	defer closeAll(clients)
	var last error // the last reason before the deadline, not the deadline itself
	for {
		nu, err := c.failedOver(ctx, clients, o, slot)
		if err == nil {
			c.mu.Lock()
			for s, i := range c.owner {
				if i == o {
					c.owner[s] = nu
				}
			}
			c.mu.Unlock()
			return c.nodes[nu]
		}
		if ctx.Err() != nil {
			if last == nil {
				last = err
			}
			t.Fatalf("redistest: no failover of node %d (%s) within %v: %v", o, old.Addr(), failoverTimeout, last)
		}
		last = err
		time.Sleep(20 * time.Millisecond) // polling gossip and the election; redis offers no notification
	}
}

// failedOver returns the index of the node every running node other than
// node o names as slot's master, if that is not o, the cluster is ok
// everywhere and the node says it is a master.
func (c *Cluster) failedOver(ctx context.Context, clients []*redis.Client, o, slot int) (int, error) {
	nu := -1
	for _, i := range c.running() {
		if i == o {
			continue
		}
		info, err := clients[i].ClusterInfo(ctx).Result()
		if err != nil || !strings.Contains(info, "cluster_state:ok\r\n") {
			return -1, fmt.Errorf("node %d: CLUSTER INFO = %q, %v", i, info, err)
		}
		addr, err := slotMaster(ctx, clients[i], slot)
		if err != nil {
			return -1, fmt.Errorf("node %d: %w", i, err)
		}
		j := c.index(addr)
		switch {
		case j == o:
			return -1, fmt.Errorf("node %d still names node %d master of slot %d", i, o, slot)
		case j < 0:
			return -1, fmt.Errorf("node %d names %s master of slot %d, which is none of the nodes", i, addr, slot)
		case nu >= 0 && j != nu:
			return -1, fmt.Errorf("nodes disagree on the master of slot %d: node %d and node %d", slot, nu, j)
		}
		nu = j
	}
	if nu < 0 {
		return -1, fmt.Errorf("no running node but node %d", o)
	}
	if !isMaster(ctx, clients[nu]) {
		return -1, fmt.Errorf("new master node %d does not answer INFO replication as a master", nu)
	}
	return nu, nil
}

// MoveSlot moves slot, which must hold no key, from its master to the
// master to, as a resharding does but without MIGRATE: CLUSTER SETSLOT
// IMPORTING on to, MIGRATING on the old master, then NODE on both and on
// every other running master. It waits (at most 10s) until every running
// node's CLUSTER SHARDS names to as the slot's master. A client subscribed
// to a shard channel of the slot on the old master is dropped
// (sunsubscribe). It calls t.Fatalf on failure, so call it from the test
// goroutine.
func (c *Cluster) MoveSlot(t testing.TB, slot int, to *Server) {
	t.Helper()
	ti := c.index(to.Addr())
	if slot < 0 || slot >= clusterSlots || ti < 0 {
		t.Fatalf("redistest: MoveSlot(%d, %s): no such slot or node", slot, to.Addr())
	}
	c.mu.Lock()
	from, ids := c.owner[slot], c.ids
	c.mu.Unlock()
	if from == ti {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	clients := c.clients()
	defer closeAll(clients)
	type step struct {
		node int
		args []any
	}
	steps := []step{
		{ti, []any{"CLUSTER", "SETSLOT", slot, "IMPORTING", ids[from]}},
		{from, []any{"CLUSTER", "SETSLOT", slot, "MIGRATING", ids[ti]}},
		{ti, []any{"CLUSTER", "SETSLOT", slot, "NODE", ids[ti]}},
		{from, []any{"CLUSTER", "SETSLOT", slot, "NODE", ids[ti]}},
	}
	running := c.running()
	for _, i := range running {
		// Replicas refuse SETSLOT; they learn the move from their masters.
		if i == ti || i == from || !isMaster(ctx, clients[i]) {
			continue
		}
		steps = append(steps, step{i, []any{"CLUSTER", "SETSLOT", slot, "NODE", ids[ti]}})
	}
	for _, st := range steps {
		if err := clients[st.node].Do(ctx, st.args...).Err(); err != nil {
			t.Fatalf("redistest: node %d: %v: %v", st.node, st.args, err)
		}
	}
	for _, i := range running {
		for {
			addr, err := slotMaster(ctx, clients[i], slot)
			if err == nil && addr == to.Addr() {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("redistest: node %d does not name node %d master of slot %d within %v: %q, %v", i, ti, slot, clusterTimeout, addr, err)
			}
			time.Sleep(20 * time.Millisecond) // polling gossip; redis offers no notification
		}
	}
	c.mu.Lock()
	c.owner[slot] = ti
	c.mu.Unlock()
}

// KeySlot returns key's slot (CLUSTER KEYSLOT on a running node); key may
// be any string, a channel name too. It calls t.Fatalf if no running node
// answers.
func (c *Cluster) KeySlot(t testing.TB, key string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	clients := c.clients()
	defer closeAll(clients)
	var err error
	for _, i := range c.running() {
		var slot int64
		if slot, err = clients[i].ClusterKeySlot(ctx, key).Result(); err == nil {
			return int(slot)
		}
	}
	t.Fatalf("redistest: no running node answers CLUSTER KEYSLOT %q: %v", key, err)
	return 0
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

// Node returns the i-th node, for fault injection on it: with
// replicas, the masters come first (see StartClusterWithReplicas).
func (c *Cluster) Node(i int) *Server {
	return c.nodes[i]
}

// Len returns the number of nodes.
func (c *Cluster) Len() int {
	return len(c.nodes)
}

// Client returns a go-redis cluster client seeded with every node's
// address, closed when t ends. Each opt may adjust the options first.
// After a failover, see WaitFailover.
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
