package store

import (
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestMode names each kind of client coordd builds (cmd/coordd's
// redisClient). Nothing connects: go-redis dials lazily.
func TestMode(t *testing.T) {
	for _, tt := range []struct {
		name string
		rdb  redis.UniversalClient
		want string
	}{
		{"redis", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), "redis"},
		{"cluster", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}}), "cluster"},
		{"sentinel", redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{"127.0.0.1:1"}}), "sentinel"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			defer tt.rdb.Close()
			if got := (&Redis{rdb: tt.rdb}).Mode(); got != tt.want {
				t.Errorf("Mode() = %q; want %q", got, tt.want)
			}
		})
	}
}
