package store

import (
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestMode names each kind of client coordd builds (cmd/coordd's
// redisClient). Nothing connects: go-redis dials lazily.
func TestMode(t *testing.T) {
	for _, tt := range []struct {
		name     string
		rdb      redis.UniversalClient
		sentinel bool // Config.Sentinel
		want     string
	}{
		{"redis", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), false, "redis"},
		{"cluster", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}}), false, "cluster"},
		{"sentinel", redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{"127.0.0.1:1"}}), true, "sentinel"},
		// A host may be named anything, go-redis's placeholder for a
		// failover client's address too: the name is not the mode.
		{"plain client at a host named FailoverClient", redis.NewClient(&redis.Options{Addr: "FailoverClient"}), false, "redis"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			defer tt.rdb.Close()
			if got := (&Redis{rdb: tt.rdb, sentinel: tt.sentinel}).Mode(); got != tt.want {
				t.Errorf("Mode() = %q; want %q", got, tt.want)
			}
		})
	}
}
