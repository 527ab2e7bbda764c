package upstream

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/coordd/coordd/internal/guardwire"
)

// A guard admits attempts to one upstream and learns from their outcomes:
// the circuit breaker, the backoff the upstream asked for, and the rate
// limit, checked together and in that order. sharedGuard shares them
// between every instance; localGuard keeps them in-process.

// verdict is a guard's answer to an attempt.
type verdict int

const (
	verdictAdmitted  verdict = iota // go, after admission.wait
	verdictOpen                     // the breaker is open (or its probe slots are taken): fail at once
	verdictOverLimit                // the slot starts past the wait bound: nothing was booked
)

// admission is a guard's answer, carried back to it with the outcome.
type admission struct {
	verdict verdict
	wait    time.Duration // until the slot starts; open: until half-open, when known
	backoff time.Duration // how much of wait is the upstream's backoff
	gen     int64         // the breaker generation the attempt belongs to
	probe   int           // half-open probe slot held, 1-based; 0: none
	shared  bool          // admitted by the sharedGuard
}

// probeLease bounds how long a half-open probe holds its slot after its
// start, so that a probe whose result is lost (its instance died) cannot
// keep the breaker half-open for good.
func probeLease(up *Config) time.Duration { return up.Timeout + time.Second }

// logTransition logs a breaker state change of upstream, and counts it
// in m.
func logTransition(log *slog.Logger, m Metrics, upstream, scope, from, to string) {
	m.BreakerTransition(upstream, scope, from, to)
	lvl := slog.LevelInfo
	if to == breakerOpen.String() {
		lvl = slog.LevelWarn
	}
	log.Log(context.Background(), lvl, "circuit breaker "+to, "from", from, "scope", scope)
}

// localGuard is the in-process guard: in single-node mode, and in every
// instance while Redis is down, when each one limits only its own
// requests. It is safe for concurrent use.
type localGuard struct {
	now  func() time.Time
	log  *slog.Logger
	m    Metrics
	name string // the upstream's

	mu    sync.Mutex // protects br and limit
	br    *breaker
	limit *gcra // the rate limit, with the upstream's backoff
}

// newLocalGuard returns up's in-process guard; degraded selects the rate
// limit for a Redis that is down over the one for single-node mode. m
// (nil: none) counts its breaker's transitions.
func newLocalGuard(up *Config, degraded bool, now func() time.Time, log *slog.Logger, m Metrics) *localGuard {
	p := &up.Protection
	rate := p.RateLimit
	if degraded {
		rate = p.DegradedRateLimit
	}
	return &localGuard{now: now, log: log, m: orNop(m), name: up.Name, br: newBreaker(p.Breaker, probeLease(up)), limit: newGCRA(rate, p.Burst)}
}

func (g *localGuard) admit(maxWait time.Duration) admission {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	ok, slot, open, changed := g.br.check(now)
	if changed {
		logTransition(g.log, g.m, g.name, "instance", breakerOpen.String(), breakerHalfOpen.String())
	}
	if !ok {
		return admission{verdict: verdictOpen, wait: open, gen: g.br.gen}
	}
	wait, backoff, ok := g.limit.reserve(now, maxWait)
	if !ok {
		return admission{verdict: verdictOverLimit, wait: wait, backoff: backoff, gen: g.br.gen}
	}
	g.br.take(slot, now.Add(wait))
	return admission{verdict: verdictAdmitted, wait: wait, backoff: backoff, gen: g.br.gen, probe: slot}
}

func (g *localGuard) record(a admission, o outcome, backoff time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	if backoff > 0 {
		g.limit.backOff(now, backoff)
	}
	from := g.br.state
	if g.br.record(now, a.gen, a.probe, o) {
		logTransition(g.log, g.m, g.name, "instance", from.String(), g.br.state.String())
	}
}

// state is the breaker's state.
func (g *localGuard) state() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.br.state.String()
}

// backOff holds every slot until d from now.
func (g *localGuard) backOff(d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.limit.backOff(g.now(), d)
}

// Shared is where the guards of every instance meet (the store package's
// *store.Redis satisfies it). Admit and Record are one round trip each and
// fail fast while Redis is down, when the caller falls back to its
// localGuard; the breaker's state machine runs there as admitScript and
// recordScript, the same machine as breaker's.
type Shared interface {
	Admit(ctx context.Context, upstream string, a SharedAdmit) (SharedAdmission, error)
	Record(ctx context.Context, upstream string, r SharedRecord) (from, to string, err error)
	BreakerState(ctx context.Context, upstream string) (string, error)
	// GuardState reads the guard for a status page, changing nothing.
	GuardState(ctx context.Context, upstream string, now time.Time) (SharedState, error)
	SharedSlots // the slots in flight (inflight.go)
}

// The messages of Shared, defined beside the store's scripts that answer
// them (package guardwire), so that neither package imports the other.
type (
	// SharedAdmit asks the shared guard to admit an attempt.
	SharedAdmit = guardwire.Admit
	// SharedAdmission is the shared guard's answer.
	SharedAdmission = guardwire.Admission
	// SharedRecord tells the shared guard an attempt's outcome.
	SharedRecord = guardwire.Record
	// SharedState is the shared guard as a status page shows it.
	SharedState = guardwire.GuardState
)

// sharedGuard is the guard shared by every instance through a Shared
// store. It is safe for concurrent use.
type sharedGuard struct {
	s   Shared
	p   *Protection
	now func() time.Time // nil: Redis's clock
	log *slog.Logger
	m   Metrics
	up  string // the upstream's name

	interval, tau time.Duration // of the rate limit; 0: no limit
	ttl           time.Duration // of the guard's state
	lease         time.Duration // of a half-open probe slot
}

func newSharedGuard(s Shared, up *Config, now func() time.Time, log *slog.Logger, m Metrics) *sharedGuard {
	p := &up.Protection
	g := &sharedGuard{s: s, p: p, now: now, log: log, m: orNop(m), up: up.Name}
	if p.RateLimit > 0 {
		iv := slotInterval(p.RateLimit)
		g.interval, g.tau = iv, time.Duration(p.Burst-1)*iv
	}
	g.ttl = max(time.Hour, 2*(p.Breaker.OpenFor+p.Breaker.Window+p.RetryAfterCap+p.MaxWait))
	g.lease = probeLease(up)
	return g
}

// clock is the time passed to the scripts: zero for Redis's clock.
func (g *sharedGuard) clock() time.Time {
	if g.now == nil {
		return time.Time{}
	}
	return g.now()
}

func (g *sharedGuard) admit(ctx context.Context, maxWait time.Duration) (admission, error) {
	res, err := g.s.Admit(ctx, g.up, SharedAdmit{
		Now: g.clock(), Interval: g.interval, Tau: g.tau, MaxWait: maxWait,
		Probes: g.p.Breaker.HalfOpenProbes, Lease: g.lease, TTL: g.ttl,
	})
	if err != nil {
		return admission{}, err
	}
	a := admission{wait: res.Wait, gen: res.Gen, probe: res.Probe, backoff: res.Backoff, shared: true}
	switch res.Verdict {
	case "open":
		a.verdict = verdictOpen
	case "limited":
		a.verdict = verdictOverLimit
	}
	if res.Changed == "half" {
		logTransition(g.log, g.m, g.up, "cluster", breakerOpen.String(), breakerHalfOpen.String())
	}
	return a, nil
}

func (g *sharedGuard) record(ctx context.Context, a admission, o outcome, backoff time.Duration) {
	b := &g.p.Breaker
	from, to, err := g.s.Record(ctx, g.up, SharedRecord{
		Now: g.clock(), Outcome: [...]string{outcomeSuccess: "s", outcomeFailure: "f", outcomeNone: "n"}[o],
		Gen: a.gen, Probe: a.probe, Backoff: backoff,
		FailureThreshold: b.FailureThreshold, FailureRate: b.FailureRate, MinRequests: b.MinRequests,
		Window: b.Window, OpenFor: b.OpenFor, CloseAfter: b.CloseAfter, Probes: b.HalfOpenProbes, TTL: g.ttl,
	})
	if err != nil {
		return // Redis is marked down; the local guard takes over
	}
	if to != "" {
		logTransition(g.log, g.m, g.up, "cluster", luaStateName(from), luaStateName(to))
	}
}

// state reads the shared breaker's state.
func (g *sharedGuard) state(ctx context.Context) (string, error) {
	s, err := g.s.BreakerState(ctx, g.up)
	if err != nil {
		return "", err
	}
	return luaStateName(s), nil
}

func luaStateName(s string) string {
	if s == "half" {
		return breakerHalfOpen.String()
	}
	return s
}
