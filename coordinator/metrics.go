package coordinator

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/coordd/coordd/internal/logctx"
)

// Metrics observes a Coordinator, for monitoring: the events below are
// pushed to it as they happen; states (L1, Redis health, breakers) are
// read when wanted with L1Stats, RedisHealthy and Breakers. Its methods
// are called on the request path, some while a lock is held: they must be
// fast, must not block and must not call back into the Coordinator. An
// implementation must be safe for concurrent use. Every label value comes
// from a small fixed set written beside each method, or is an upstream's
// configured name.
type Metrics interface {
	// Request counts a Get that returned, by where its answer came from:
	// "l1", "l2", "upstream", "stale" (a stale copy, from either tier),
	// "canceled" (the caller canceled or went away first: no error of
	// coordd's) or "error".
	Request(source string)
	// Follower counts a wait for a fetch that someone else started, by
	// scope: "local", a call that joined this instance's flight of its
	// key; "remote", a flight of this instance that waits for the instance
	// holding the key's fill lock.
	Follower(scope string)
	// FollowerLag observes, for a Get that returns a document fetched
	// while it waited, the time from the upstream's answer (the
	// Document's FetchedAt, by the clock of the instance that fetched it)
	// to Get's return, which the caller's metadata follows at once.
	FollowerLag(d time.Duration)
	// Fetch counts an upstream fetch this instance started, as a flight's
	// leader; its HTTP attempts are counted by UpstreamRequest.
	Fetch(upstream string)
	// UpstreamRequest counts one HTTP attempt to upstream (retries
	// included) by the status code answered; 0 when none was (network
	// error, timeout, body too large).
	UpstreamRequest(upstream string, status int)
	// Retry counts a retry about to be attempted.
	Retry(upstream string)
	// BreakerTransition counts a breaker state change that this instance
	// made. scope is "cluster" (the breaker shared through Redis) or
	// "instance" (this instance's own, in single-node mode and while Redis
	// is down); from and to are "closed", "half-open" or "open".
	BreakerTransition(upstream, scope, from, to string)
	// BreakerRejected counts a fetch failed at once by an open breaker.
	BreakerRejected(upstream string)
	// RateLimitWait observes a wait for a rate-limit slot, or for the end
	// of the backoff an upstream asked for (Retry-After).
	RateLimitWait(upstream string, d time.Duration)
	// RateLimitRefused counts a fetch refused because its slot started
	// past the time it could wait.
	RateLimitRefused(upstream string)
	// Lock counts an attempt at a key's fill lock by outcome: "acquired",
	// "contended" (another instance holds it) or "unavailable" (Redis is
	// down or did not answer).
	Lock(outcome string)
	// LockExtension counts a lease extension by the watchdog of a held
	// fill lock, by result: "ok", "lost" (the lock was no longer ours) or
	// "error".
	LockExtension(result string)
	// TimerWakeup counts a follower woken by the end of the holder's lease
	// instead of by a push, after which it may take the lock over. It
	// stays 0 unless a lock holder died or a push was lost.
	TimerWakeup()
	// RedisError counts a failed Redis operation by kind: "reply" (Redis
	// answered with an error: OOM, READONLY…) or "unavailable" (no answer
	// in time, or a network error: Redis becomes suspect).
	RedisError(kind string)
	// RedisHealth counts a change of Redis's health: found down (false)
	// or back (true).
	RedisHealth(up bool)
	// Flights observes a change in the number of flights this instance
	// runs: +1 when one starts, -1 when it ends or an Invalidate detaches
	// it (it then runs on unseen, and takes no new callers).
	Flights(delta int)
}

// NopMetrics is a Metrics that does nothing: the default.
type NopMetrics struct{}

func (NopMetrics) Request(string)                      {}
func (NopMetrics) Follower(string)                     {}
func (NopMetrics) FollowerLag(time.Duration)           {}
func (NopMetrics) Fetch(string)                        {}
func (NopMetrics) UpstreamRequest(string, int)         {}
func (NopMetrics) Retry(string)                        {}
func (NopMetrics) BreakerTransition(_, _, _, _ string) {}
func (NopMetrics) BreakerRejected(string)              {}
func (NopMetrics) RateLimitWait(string, time.Duration) {}
func (NopMetrics) RateLimitRefused(string)             {}
func (NopMetrics) Lock(string)                         {}
func (NopMetrics) LockExtension(string)                {}
func (NopMetrics) TimerWakeup()                        {}
func (NopMetrics) RedisError(string)                   {}
func (NopMetrics) RedisHealth(bool)                    {}
func (NopMetrics) Flights(int)                         {}

// orNop returns m, or NopMetrics if m is nil.
func orNop(m Metrics) Metrics {
	if m == nil {
		return NopMetrics{}
	}
	return m
}

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
	Entries  int   // documents held
	Bytes    int64 // memory allocated for them, up to MaxBytes
	MaxBytes int64 // Config.L1MaxBytes
	// Evicted counts documents dropped to make room; Expired, those
	// dropped because they outlived the longest lifetime configured.
	Evicted, Expired int64
}

// L1Stats returns the in-memory cache's figures.
func (c *Coordinator) L1Stats() L1Stats {
	s := c.l1.Stats()
	return L1Stats{Entries: s.Entries, Bytes: s.Bytes, MaxBytes: c.cfg.L1MaxBytes, Evicted: s.Evicted, Expired: s.Expired}
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
