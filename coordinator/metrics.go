package coordinator

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/coordd/coordd/internal/logctx"
	"github.com/coordd/coordd/internal/observe"
)

// Metrics observes a Coordinator, for monitoring (see
// observe.Metrics for each event): the events are pushed to it as they
// happen; states (L1, Redis health, breakers) are read when wanted with
// L1Stats, RedisHealthy and Breakers. Its methods are called on the
// request path, some while a lock is held: they must be fast, must not
// block and must not call back into the Coordinator. An implementation
// must be safe for concurrent use.
type Metrics = observe.Metrics

// NopMetrics is a Metrics that does nothing: the default.
type NopMetrics = observe.Nop

// observeGet reports a Get of t that started at start and returned res,
// err.
func (c *Coordinator) observeGet(t Target, start time.Time, res *Result, err error) {
	c.stats.served(t.tenant, c.cfg.Now(), res, err)
	switch {
	case errors.Is(err, context.Canceled):
		c.m.Request("canceled")
	case err != nil:
		c.m.Request("error")
	case res.Stale:
		c.m.Request("stale")
	default:
		c.m.Request(res.Source.String())
		if d := res.Doc; res.Source != SourceL1 && !d.FetchedAt.Before(start) {
			c.m.FollowerLag(max(c.cfg.Now().Sub(d.FetchedAt), 0))
		}
	}
}

// flightLog returns the logger of a flight of t started by a call whose
// context is ctx: the flight's lines carry that call's log attributes
// (its request id; see logctx) and t's key. Flights outlive their callers
// and run under the Coordinator's context, so they log with a logger of
// their own rather than with a caller's context.
func (c *Coordinator) flightLog(ctx context.Context, t Target) *slog.Logger {
	args := logctx.Args(ctx)
	if !logctx.Has(ctx, "key") {
		args = append(args, "key", t.Key)
	}
	return c.log.With(args...)
}

// L1Stats describes the in-memory cache.
type L1Stats struct {
	Entries int // documents held
	// Bytes is the memory allocated for them, up to MaxBytes: the L1
	// reserves it ahead of use, so it says little of the documents.
	Bytes    int64
	MaxBytes int64 // Config.L1MaxBytes
	// DocumentBytes is the size of the documents held (their encodings).
	DocumentBytes int64
	// Evicted counts documents dropped to make room; Expired, those
	// dropped because they outlived the longest lifetime configured.
	Evicted, Expired int64
}

// L1Stats returns the in-memory cache's figures.
func (c *Coordinator) L1Stats() L1Stats {
	s := c.l1.Stats()
	return L1Stats{Entries: s.Entries, Bytes: s.Bytes, MaxBytes: c.cfg.L1MaxBytes, DocumentBytes: s.DocumentBytes, Evicted: s.Evicted, Expired: s.Expired}
}

// RedisConfigured reports whether the Coordinator runs with Redis, rather
// than in single-node mode.
func (c *Coordinator) RedisConfigured() bool {
	_, ok := c.co.(shared)
	return ok
}

// Upstreams returns the names of the configured upstreams.
func (c *Coordinator) Upstreams() []string {
	names := make([]string, len(c.cfg.Upstreams))
	for i, u := range c.cfg.Upstreams {
		names[i] = u.Name
	}
	return names
}

// BreakerStatus is the state of one upstream's circuit breaker.
type BreakerStatus struct {
	Upstream string
	// Scope is "cluster" (the breaker every instance shares through
	// Redis) or "instance" (this instance's own, which guards the
	// upstream in single-node mode and while Redis is down).
	Scope string
	// State is "closed", "half-open" or "open". An open breaker whose
	// time is up stays "open" until an attempt turns it half-open.
	State string
}

// Breakers returns the state of every upstream's breakers: the instance's
// own, and, unless Redis is down or does not answer within ctx and the
// Redis timeout, the cluster's.
func (c *Coordinator) Breakers(ctx context.Context) []BreakerStatus {
	var out []BreakerStatus
	for _, up := range c.cfg.Upstreams {
		shared, local := c.clients[up.Name].Breakers(ctx)
		if shared != "" {
			out = append(out, BreakerStatus{Upstream: up.Name, Scope: "cluster", State: shared})
		}
		out = append(out, BreakerStatus{Upstream: up.Name, Scope: "instance", State: local})
	}
	return out
}
