package main

import (
	"time"

	"github.com/coordd/coordd/coordinator"
)

// protectionConfig holds an upstream's protection fields, inline in its
// YAML entry. Zero or absent fields take coordinator.Protection's defaults;
// docs/configuration.md ("Upstream protection") documents each one.
type protectionConfig struct {
	RateLimit         int           `yaml:"rate_limit"`
	Burst             int           `yaml:"burst"`
	MaxWait           time.Duration `yaml:"max_wait"`
	DegradedRateLimit int           `yaml:"degraded_rate_limit"`
	RetryAfterCap     time.Duration `yaml:"retry_after_cap"`
	MinTTL            time.Duration `yaml:"min_ttl"`
	MaxTTL            time.Duration `yaml:"max_ttl"`
	Retry             retryConfig   `yaml:"retry"`
	Breaker           breakerConfig `yaml:"breaker"`
}

type retryConfig struct {
	MaxAttempts     int           `yaml:"max_attempts"`
	BaseDelay       time.Duration `yaml:"base_delay"`
	MaxDelay        time.Duration `yaml:"max_delay"`
	BudgetRatio     float64       `yaml:"budget_ratio"`
	BudgetMinPerSec float64       `yaml:"budget_min_per_sec"`
}

type breakerConfig struct {
	FailureThreshold int           `yaml:"failure_threshold"`
	FailureRate      float64       `yaml:"failure_rate"`
	MinRequests      int           `yaml:"min_requests"`
	Window           time.Duration `yaml:"window"`
	OpenFor          time.Duration `yaml:"open_for"`
	HalfOpenProbes   int           `yaml:"half_open_probes"`
	CloseAfter       int           `yaml:"close_after"`
}

// protection translates the fields; coordinator.New validates them, naming
// the bad field.
func (p protectionConfig) protection() (coordinator.Protection, error) {
	return coordinator.Protection{
		RateLimit:         p.RateLimit,
		Burst:             p.Burst,
		MaxWait:           p.MaxWait,
		DegradedRateLimit: p.DegradedRateLimit,
		RetryAfterCap:     p.RetryAfterCap,
		MinTTL:            p.MinTTL,
		MaxTTL:            p.MaxTTL,
		Retry: coordinator.RetryPolicy{
			MaxAttempts:     p.Retry.MaxAttempts,
			BaseDelay:       p.Retry.BaseDelay,
			MaxDelay:        p.Retry.MaxDelay,
			BudgetRatio:     p.Retry.BudgetRatio,
			BudgetMinPerSec: p.Retry.BudgetMinPerSec,
		},
		Breaker: coordinator.BreakerPolicy{
			FailureThreshold: p.Breaker.FailureThreshold,
			FailureRate:      p.Breaker.FailureRate,
			MinRequests:      p.Breaker.MinRequests,
			Window:           p.Breaker.Window,
			OpenFor:          p.Breaker.OpenFor,
			HalfOpenProbes:   p.Breaker.HalfOpenProbes,
			CloseAfter:       p.Breaker.CloseAfter,
		},
	}, nil
}
