package main

import (
	"strings"
	"testing"
	"time"

	"github.com/coordd/coordd/coordinator"
)

func TestProtectionConfig(t *testing.T) {
	const yml = `
upstreams:
  - name: mdn
    base_url: https://developer.mozilla.org
    rate_limit: 10
    burst: 2
    max_wait: 3s
    degraded_rate_limit: 4
    retry_after_cap: 30s
    min_ttl: 2m
    max_ttl: 6h
    retry:
      max_attempts: 4
      base_delay: 50ms
      max_delay: 2s
      budget_ratio: 0.1
      budget_min_per_sec: -1
    breaker:
      failure_threshold: 7
      failure_rate: 0.6
      min_requests: 30
      window: 1m
      open_for: 15s
      half_open_probes: 2
      close_after: 3
  - name: other
    base_url: https://example.com
`
	fc, err := readConfig(strings.NewReader(yml))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := fc.coordinatorConfig()
	if err != nil {
		t.Fatal(err)
	}
	got := cfg.Upstreams[0].Protection
	want := coordinator.Protection{
		RateLimit: 10, Burst: 2, MaxWait: 3 * time.Second, DegradedRateLimit: 4,
		RetryAfterCap: 30 * time.Second, MinTTL: 2 * time.Minute, MaxTTL: 6 * time.Hour,
		Retry: coordinator.RetryPolicy{
			MaxAttempts: 4, BaseDelay: 50 * time.Millisecond, MaxDelay: 2 * time.Second,
			BudgetRatio: 0.1, BudgetMinPerSec: -1,
		},
		Breaker: coordinator.BreakerPolicy{
			FailureThreshold: 7, FailureRate: 0.6, MinRequests: 30, Window: time.Minute,
			OpenFor: 15 * time.Second, HalfOpenProbes: 2, CloseAfter: 3,
		},
	}
	if got != want {
		t.Errorf("protection:\ngot  %+v\nwant %+v", got, want)
	}
	if got := cfg.Upstreams[1].Protection; got != (coordinator.Protection{}) {
		t.Errorf("absent fields: got %+v; want the zero value (defaults)", got)
	}
	// The coordinator accepts it.
	c, err := coordinator.New(cfg, coordinator.Options{})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	c.Close()
}

func TestProtectionConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name, fields, want string
	}{
		{"unknown field", "    rate_limt: 5\n", "rate_limt"},
		{"unknown nested field", "    retry:\n      attempts: 5\n", "attempts"},
		{"bad duration", "    max_wait: soon\n", `line 4: upstreams[0].max_wait: "soon" is not a duration`},
		{"bad burst", "    burst: -1\n", "upstreams[0] (mdn).burst"},
		{"bad attempts", "    retry:\n      max_attempts: 50\n", "upstreams[0] (mdn).retry.max_attempts"},
		{"bad rate", "    breaker:\n      failure_rate: 1.5\n", "upstreams[0] (mdn).breaker.failure_rate"},
		{"bad ttl bounds", "    min_ttl: 2h\n    max_ttl: 1h\n", "upstreams[0] (mdn).max_ttl"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			yml := "upstreams:\n  - name: mdn\n    base_url: https://developer.mozilla.org\n" + tc.fields
			fc, err := readConfig(strings.NewReader(yml))
			if err == nil {
				var cfg coordinator.Config
				if cfg, err = fc.coordinatorConfig(); err == nil {
					var c *coordinator.Coordinator
					if c, err = coordinator.New(cfg, coordinator.Options{}); err == nil {
						c.Close()
					}
				}
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v; want an error naming %q", err, tc.want)
			}
		})
	}
}
