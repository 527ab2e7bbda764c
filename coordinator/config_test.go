package coordinator_test

import (
	"strings"
	"testing"
	"time"

	"github.com/coordd/coordd/coordinator"
)

// TestConfigReportsEveryError: New's error names every bad field, not
// only the first: each bad upstream, and each bad field of the rest.
func TestConfigReportsEveryError(t *testing.T) {
	cfg := coordinator.Config{
		Upstreams: []coordinator.Upstream{
			{Name: "a", BaseURL: "ftp://a"},
			{Name: "b", BaseURL: "http://b", TTL: -time.Second},
			{Name: "a", BaseURL: "http://c"},
		},
		L1MaxBytes: 10,
		LockTTL:    time.Millisecond,
		KeyPrefix:  "{x}",
	}
	_, err := coordinator.New(cfg, coordinator.Options{})
	if err == nil {
		t.Fatal("New: no error")
	}
	for _, field := range []string{"upstreams[0] (a).base_url", "upstreams[1] (b).ttl", "upstreams[2].name", "l1_max_bytes", "lock_ttl", "key_prefix"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("New error %q; want it to name %s", err, field)
		}
	}
	if _, rerr := cfg.Resolved(); rerr == nil || rerr.Error() != err.Error() {
		t.Errorf("Resolved error = %v; want New's, %v", rerr, err)
	}
}

// TestConfigResolved: Resolved fills in every default, as New does, and
// leaves the caller's configuration as it was.
func TestConfigResolved(t *testing.T) {
	cfg := coordinator.Config{Upstreams: []coordinator.Upstream{{Name: "a", BaseURL: "http://a", TTL: time.Minute}}}
	got, err := cfg.Resolved()
	if err != nil {
		t.Fatal(err)
	}
	u := got.Upstreams[0]
	if got.LockTTL != 2*time.Second || got.RedisTimeout != 500*time.Millisecond || got.KeyPrefix != "coordd:" ||
		u.TTL != time.Minute || u.StaleTTL != 24*time.Hour || u.Protection.RateLimit != 20 || u.Protection.Retry.MaxAttempts != 3 {
		t.Errorf("Resolved() = %+v; want the defaults filled in", got)
	}
	if cfg.LockTTL != 0 || cfg.Upstreams[0].StaleTTL != 0 {
		t.Errorf("Resolved changed its receiver: %+v", cfg)
	}
	if none, err := (coordinator.Config{}).Resolved(); err != nil || len(none.Upstreams) != 1 || none.Upstreams[0].Name != coordinator.DefaultUpstream().Name {
		t.Errorf("zero Config: Resolved() = %+v, %v; want the default upstream", none.Upstreams, err)
	}
}
