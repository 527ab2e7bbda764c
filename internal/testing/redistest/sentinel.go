package redistest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// SentinelDownAfter is the sentinels' down-after-milliseconds: a
	// master silent for that long is down, and the sentinels fail over.
	SentinelDownAfter = 500 * time.Millisecond
	// sentinelFailoverTimeout is the sentinels' failover-timeout; a failed
	// attempt is retried after twice as long.
	sentinelFailoverTimeout = 2 * time.Second
	// sentinelTimeout bounds how long StartSentinel waits for the sentinels
	// to know every replica and each other, and WaitFailover for a
	// failover.
	sentinelTimeout = 15 * time.Second
)

// Sentinel is a Redis master with replicas, watched by Redis Sentinels;
// every data node and every sentinel is a Server of its own. Its methods
// are safe for concurrent use.
type Sentinel struct {
	name      string
	nodes     []*Server // data nodes: the first master, then its replicas
	sentinels []*Server
}

// StartSentinel starts a master, replicas replicas of it and sentinels
// sentinels (at least 1) monitoring it under the name "mymaster" with a
// quorum of a majority, down-after-milliseconds 500 and failover-timeout
// 2000. It waits (a few seconds: sentinels find each other by a hello
// every 2s, at most 15s) until every replica is in sync and every sentinel
// knows every replica and every other sentinel, so that a failover can
// start at once. opts apply to the data nodes (each started as by Start,
// the replicas with --replicaof); the sentinels are `redis-server
// sentinel.conf --sentinel`, so only redis-server is needed. Everything is
// killed when the test ends.
//
// Like Start, it calls t.Fatalf on failure.
func StartSentinel(t testing.TB, replicas, sentinels int, opts ...Option) *Sentinel {
	t.Helper()
	SkipShort(t)
	if replicas < 0 || sentinels < 1 {
		t.Fatalf("redistest: StartSentinel(%d, %d): need a sentinel and no fewer than 0 replicas", replicas, sentinels)
	}
	s := &Sentinel{name: "mymaster"}
	// No delay before a full sync, so that the replicas are in sync at once.
	opts = append([]Option{WithArgs("--repl-diskless-sync-delay", "0")}, opts...)
	master := Start(t, opts...)
	s.nodes = append(s.nodes, master)
	for range replicas {
		o := append(append([]Option(nil), opts...), WithArgs("--replicaof", "127.0.0.1", strconv.Itoa(master.port)))
		s.nodes = append(s.nodes, Start(t, o...))
	}
	ctx, cancel := context.WithTimeout(context.Background(), sentinelTimeout)
	defer cancel()
	// In sync first: a sentinel learns the replicas from the master's INFO
	// as soon as it connects.
	for i, n := range s.nodes[1:] {
		if err := waitInfo(ctx, n.Addr(), "replication", "master_link_status:up"); err != nil {
			t.Fatalf("redistest: replica %d not in sync: %v", i+1, err)
		}
	}
	conf := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d %[3]d\n"+
		"sentinel down-after-milliseconds %[1]s %[4]d\n"+
		"sentinel failover-timeout %[1]s %[5]d\n",
		s.name, master.port, sentinels/2+1, SentinelDownAfter.Milliseconds(), sentinelFailoverTimeout.Milliseconds())
	for i := range sentinels {
		path := filepath.Join(t.TempDir(), "sentinel.conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatalf("redistest: write sentinel %d configuration: %v", i, err)
		}
		s.sentinels = append(s.sentinels, Start(t, func(c *config) { c.sentinel = path }))
	}
	for i, sn := range s.sentinels {
		if err := s.waitKnown(ctx, sn, replicas, sentinels-1); err != nil {
			t.Fatalf("redistest: sentinel %d: %v", i, err)
		}
	}
	return s
}

// waitInfo polls INFO section on addr until it contains want.
func waitInfo(ctx context.Context, addr, section, want string) error {
	rc := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rc.Close()
	for {
		info, err := rc.Info(ctx, section).Result()
		if err == nil && strings.Contains(info, want+"\r\n") {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("INFO %s has no %q: %q, %v", section, want, info, err)
		}
		time.Sleep(20 * time.Millisecond) // polling replication; redis offers no notification
	}
}

// waitKnown polls SENTINEL MASTER on sn until it knows replicas replicas
// and others other sentinels.
func (s *Sentinel) waitKnown(ctx context.Context, sn *Server, replicas, others int) error {
	sc := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr(), MaxRetries: -1})
	defer sc.Close()
	want := map[string]string{"num-slaves": strconv.Itoa(replicas), "num-other-sentinels": strconv.Itoa(others)}
	for {
		m, err := sc.Master(ctx, s.name).Result()
		ok := err == nil
		for k, v := range want {
			ok = ok && m[k] == v
		}
		if ok {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("SENTINEL MASTER %s = %v, %v; want %v", s.name, m, err, want)
		}
		time.Sleep(20 * time.Millisecond) // polling discovery (hello every 2s); no notification
	}
}

// MasterName returns the name the sentinels monitor the master under.
func (s *Sentinel) MasterName() string { return s.name }

// Addrs returns the sentinels' host:port addresses.
func (s *Sentinel) Addrs() []string {
	addrs := make([]string, len(s.sentinels))
	for i, sn := range s.sentinels {
		addrs[i] = sn.Addr()
	}
	return addrs
}

// Node returns data node i: 0 is the first master, then the replicas.
func (s *Sentinel) Node(i int) *Server { return s.nodes[i] }

// SentinelNode returns sentinel i, for fault injection on it.
func (s *Sentinel) SentinelNode(i int) *Server { return s.sentinels[i] }

// Master returns the data node the first sentinel names as master. It
// calls t.Fatalf if that fails.
func (s *Sentinel) Master(t testing.TB) *Server {
	t.Helper()
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.sentinels[0].Addr(), MaxRetries: -1})
	defer sc.Close()
	addr, err := sc.GetMasterAddrByName(context.Background(), s.name).Result()
	if err != nil || len(addr) != 2 {
		t.Fatalf("redistest: SENTINEL GET-MASTER-ADDR-BY-NAME %s = %v, %v", s.name, addr, err)
	}
	n := s.node(addr[0] + ":" + addr[1])
	if n == nil {
		t.Fatalf("redistest: the sentinels name %v, which is none of the data nodes", addr)
	}
	return n
}

func (s *Sentinel) node(addr string) *Server {
	for _, n := range s.nodes {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}

// WaitFailover waits (at most 15s) until every sentinel names a master
// other than old, after a +switch-master, and that node answers ROLE as a
// master; it returns that node. Typically old was just killed: the
// sentinels need SentinelDownAfter to find it down, then about a second to
// elect a leader and promote a replica. It calls t.Fatalf on timeout, so
// call it from the test goroutine.
func (s *Sentinel) WaitFailover(t testing.TB, old *Server) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), sentinelTimeout)
	defer cancel()
	var addr string
	for i, sn := range s.sentinels {
		got, err := s.waitSwitch(ctx, sn, old.Addr())
		if err != nil {
			t.Fatalf("redistest: sentinel %d: %v", i, err)
		}
		if addr != "" && got != addr {
			t.Fatalf("redistest: sentinels disagree on the new master: %s and %s", addr, got)
		}
		addr = got
	}
	n := s.node(addr)
	if n == nil {
		t.Fatalf("redistest: the sentinels name %s, which is none of the data nodes", addr)
	}
	if err := waitInfo(ctx, addr, "replication", "role:master"); err != nil {
		t.Fatalf("redistest: new master %s: %v", addr, err)
	}
	return n
}

// waitSwitch returns the master sn names once it is not old: it subscribes
// to +switch-master, then asks, then waits for the switch if it has not
// happened, so that no switch is missed.
func (s *Sentinel) waitSwitch(ctx context.Context, sn *Server, old string) (string, error) {
	sc := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr(), MaxRetries: -1})
	defer sc.Close()
	ps := sc.Subscribe(ctx, "+switch-master")
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil { // the confirmation
		return "", fmt.Errorf("SUBSCRIBE +switch-master: %w", err)
	}
	for {
		addr, err := sc.GetMasterAddrByName(ctx, s.name).Result()
		if err != nil || len(addr) != 2 {
			return "", fmt.Errorf("SENTINEL GET-MASTER-ADDR-BY-NAME %s = %v, %v", s.name, addr, err)
		}
		if got := addr[0] + ":" + addr[1]; got != old {
			return got, nil
		}
		// "+switch-master <name> <old ip> <old port> <new ip> <new port>"
		if _, err := ps.ReceiveMessage(ctx); err != nil {
			return "", fmt.Errorf("no failover from %s: %w", old, err)
		}
	}
}

// Client returns a go-redis failover client that finds the master through
// the sentinels, closed when t ends. Each opt may adjust the options
// first.
func (s *Sentinel) Client(t testing.TB, opts ...func(*redis.FailoverOptions)) *redis.Client {
	t.Helper()
	o := &redis.FailoverOptions{MasterName: s.name, SentinelAddrs: s.Addrs()}
	for _, f := range opts {
		f(o)
	}
	rc := redis.NewFailoverClient(o)
	t.Cleanup(func() { _ = rc.Close() })
	return rc
}
