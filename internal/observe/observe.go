// Package observe is what coordd's engine reports as it works, shared by
// the coordinator and the packages it composes (store, upstream) so that
// each is defined once: the Metrics observer and its no-op, and the Stage
// of a call's progress.
package observe

import "time"

// Metrics observes the engine (coordinator.Metrics), for monitoring: the
// events below are pushed to it as they happen. Its methods
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
	// UpstreamQuota sets what remains of an upstream's announced quota,
	// its limit and the latest of their resets, in a partition ("" the
	// default), summed over the credentials whose answers this instance
	// saw: never one credential's. Called for each answer that announces
	// one.
	UpstreamQuota(upstream, partition string, remaining, limit int64, reset time.Time)
	// UpstreamQuotaIgnored counts an answer whose quota headers were
	// garbage (a remaining over its limit, no limit, a reset past a day),
	// ignored whole; header is the family: "RateLimit" or "X-RateLimit".
	UpstreamQuotaIgnored(upstream, header string)
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

// Nop is a Metrics that does nothing: the default.
type Nop struct{}

func (Nop) Request(string)                                        {}
func (Nop) Follower(string)                                       {}
func (Nop) FollowerLag(time.Duration)                             {}
func (Nop) Fetch(string)                                          {}
func (Nop) UpstreamRequest(string, int)                           {}
func (Nop) Retry(string)                                          {}
func (Nop) BreakerTransition(_, _, _, _ string)                   {}
func (Nop) BreakerRejected(string)                                {}
func (Nop) RateLimitWait(string, time.Duration)                   {}
func (Nop) RateLimitRefused(string)                               {}
func (Nop) UpstreamQuota(string, string, int64, int64, time.Time) {}

// UpstreamQuotaIgnored implements Metrics.
func (Nop) UpstreamQuotaIgnored(string, string) {}
func (Nop) Lock(string)                         {}
func (Nop) LockExtension(string)                {}
func (Nop) TimerWakeup()                        {}
func (Nop) RedisError(string)                   {}
func (Nop) RedisHealth(bool)                    {}
func (Nop) Flights(int)                         {}

// OrNop returns m, or Nop if m is nil.
func OrNop(m Metrics) Metrics {
	if m == nil {
		return Nop{}
	}
	return m
}

// Stage is what a call (coordinator.Stage), or the fetch it waits for,
// is waiting for.
type Stage int

// Stages.
const (
	StageJoined        Stage = iota + 1 // joined this instance's flight
	StageFetching                       // holds the lock, fetching upstream
	StageWaitingLeader                  // another instance holds the lock
	StageRateLimited                    // waiting for a rate-limit slot
	StageRetrying                       // a retry is scheduled
	StageBreakerOpen                    // the upstream's breaker is open
	StageServingStale                   // a stale copy is served
	StageDegraded                       // Redis is unavailable
)

func (s Stage) String() string {
	switch s {
	case StageJoined:
		return "joined"
	case StageFetching:
		return "fetching"
	case StageWaitingLeader:
		return "waiting_leader"
	case StageRateLimited:
		return "rate_limited"
	case StageRetrying:
		return "retrying"
	case StageBreakerOpen:
		return "breaker_open"
	case StageServingStale:
		return "serving_stale"
	case StageDegraded:
		return "degraded"
	}
	return ""
}
