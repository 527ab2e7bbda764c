package redistest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/coordd/coordd/internal/testing/redistest"
)

// TestStartSentinelFailover: the failover client writes to the master;
// killed, the master is replaced by its replica, which kept the key, and
// the same client writes to it.
func TestStartSentinelFailover(t *testing.T) {
	t.Parallel()
	begin := time.Now()
	s := redistest.StartSentinel(t, 1, 3)
	t.Logf("master, replica and 3 sentinels up in %v", time.Since(begin))
	old := s.Master(t)
	if old != s.Node(0) {
		t.Fatalf("Master() = %s; want node 0 (%s)", old.Addr(), s.Node(0).Addr())
	}
	ctx := context.Background()
	rc := s.Client(t, func(o *redis.FailoverOptions) { o.DialTimeout = 300 * time.Millisecond })
	if err := rc.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if err := rc.Wait(ctx, 1, time.Second).Err(); err != nil {
		t.Fatalf("WAIT: %v", err)
	}

	begin = time.Now()
	old.Kill()
	nu := s.WaitFailover(t, old)
	t.Logf("failover in %v", time.Since(begin))
	if nu != s.Node(1) {
		t.Fatalf("new master %s; want the replica %s", nu.Addr(), s.Node(1).Addr())
	}
	if got := s.Master(t); got != nu {
		t.Fatalf("Master() = %s after failover; want %s", got.Addr(), nu.Addr())
	}
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var got string
		if got, err = rc.Get(ctx, "k").Result(); err == nil && got != "v" {
			err = errors.New("GET k = " + got)
		}
		if err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("GET through the failover client after failover: %v", err)
	}
}

func TestStartSentinelSingle(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinel(t, 0, 1)
	if got := len(s.Addrs()); got != 1 {
		t.Fatalf("len(Addrs()) = %d; want 1", got)
	}
	if err := s.Client(t).Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addrs()[0]})
	defer sc.Close()
	m, err := sc.Master(context.Background(), s.MasterName()).Result()
	if err != nil {
		t.Fatalf("SENTINEL MASTER: %v", err)
	}
	for k, want := range map[string]string{"down-after-milliseconds": "500", "failover-timeout": "2000", "quorum": "1", "num-slaves": "0"} {
		if m[k] != want {
			t.Errorf("SENTINEL MASTER %s = %q; want %q", k, m[k], want)
		}
	}
}
