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
	paced   time.Duration // how much of wait a learned quota's pacing asks
	// unknown: the attempt names a quota no answer has announced yet, so
	// its slot was booked by the rate limit alone (Client.admit asks the
	// quota again when the slot starts).
	unknown bool
	// then is what the attempt does once its wait is over (see afterWait).
	then afterWait
	// slack: how late the slot may start and still be among its quota
	// window's slots (-1: no quota paces it); started: when it did start,
	// by the local clock (Client.admitAs).
	slack   time.Duration
	started time.Time
}

// afterWait is what an admitted attempt does when its wait is over, one
// of three.
type afterWait uint8

const (
	// thenSend: its slot starts; the request goes out.
	thenSend afterWait = iota
	// thenAskAgain: the quota's window is spent; nothing was booked, and
	// the attempt asks again (askBoth) when the next window begins.
	thenAskAgain
	// thenAskRate: the learned quota paces the slot (paced > 0), and the
	// rate limit, which every credential of the upstream shares, was not
	// booked for it; Client.admitAs asks it alone (askRate) when the slot
	// starts. Booked now, at the paced start, it would hold every other
	// credential's requests until then.
	thenAskRate
)

// again reports whether the attempt asks again (thenAskAgain).
func (a admission) again() bool { return a.then == thenAskAgain }

// rateLater reports whether the rate limit is asked when the slot starts
// (thenAskRate).
func (a admission) rateLater() bool { return a.then == thenAskRate }

// late reports whether the attempt a admitted is about to go out past its
// quota window's slots (delayed by slots in flight, or a busy machine),
// where the upstream may count it in the next window.
func (a admission) late() bool { return a.slack >= 0 && time.Since(a.started) > a.slack }

// quotaAsk says which learned quota an attempt spends.
type quotaAsk struct {
	key        string // quotaKey(scope, partition); "": none (quotas not learned)
	scope      string // FetchRequest.QuotaScope
	partition  string // the partition this instance knows route to be counted in
	route      string // the url's first path segment (the shared guard maps it)
	background bool   // FetchRequest.Background: never the reserve of a window
	asks       asking // what of the guard is asked: both, the quota alone, the rate limit alone
}

// asking is what one ask of the guard books, one of three: an attempt's
// first ask books both the rate limit and its quota; an ask again, once
// the slot has started, books one of them alone.
type asking uint8

const (
	// askBoth: the rate limit and the quota (an attempt's first ask).
	askBoth asking = iota
	// askQuota: the quota alone, not the rate limit: a slot already
	// started whose quota was unknown, or spent, asks again.
	askQuota
	// askRate: the rate limit alone: a slot the quota paced starts
	// (admission.rateLater()); its quotaAsk names no quota (key "").
	askRate
)

// quotaNote is what an answer announced of the quota it was counted in.
type quotaNote struct {
	key   string // quotaKey of the answer's partition; "": nothing to learn
	scope string // FetchRequest.QuotaScope
	route string // the url's first path segment, now known to count in q.Partition
	label string // whose credential (FetchRequest.QuotaLabel)
	q     Quota
	// unbooked: the request was admitted before the quota was known
	// (admission.unknown), so no slot was booked for it; the guard counted
	// it in flight (unbookedCount), and its answer ends that, charging it
	// to its window once. An attempt asked again (askQuota) while the
	// quota was still unknown is counted again, until its lease ends:
	// pacing is then slower for that long, never faster.
	unbooked bool
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

	burst int

	mu     sync.Mutex // protects br, limit and quotas
	br     *breaker
	limit  *gcra // the rate limit, with the upstream's backoff
	quotas map[string]*quotaWindow
	unb    map[string]*unbookedCount // by credential scope
	lease  time.Duration             // how long an attempt may be in flight
}

// clearQuotas forgets every quota learned, and the backoff (a spent
// quota's, or a Retry-After's) that holds the upstream (Client.ClearQuotas).
func (g *localGuard) clearQuotas() {
	g.mu.Lock()
	defer g.mu.Unlock()
	clear(g.quotas)
	clear(g.unb)
	g.limit.backoff = time.Time{}
}

// maxQuotas bounds the quotas a guard learns (one per credential scope
// and partition): past it, windows that ended are dropped, and then new
// ones are not learned.
const maxQuotas = 4096

// newLocalGuard returns up's in-process guard; degraded selects the rate
// limit for a Redis that is down over the one for single-node mode. m
// (nil: none) counts its breaker's transitions.
func newLocalGuard(up *Config, degraded bool, now func() time.Time, log *slog.Logger, m Metrics) *localGuard {
	p := &up.Protection
	rate := p.RateLimit
	if degraded {
		rate = p.DegradedRateLimit
	}
	return &localGuard{now: now, log: log, m: orNop(m), name: up.Name, burst: p.Burst,
		br: newBreaker(p.Breaker, probeLease(up)), limit: newGCRA(rate, p.Burst), quotas: map[string]*quotaWindow{},
		unb: map[string]*unbookedCount{}, lease: probeLease(up)}
}

func (g *localGuard) admit(maxWait time.Duration, qa quotaAsk) admission {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	ok, slot, open, changed := g.br.check(now)
	if changed {
		logTransition(g.log, g.m, g.name, "instance", breakerOpen.String(), breakerHalfOpen.String())
	}
	if !ok {
		return admission{verdict: verdictOpen, wait: open, gen: g.br.gen, slack: -1}
	}
	var floor time.Time
	w := g.quotas[qa.key]
	if w != nil {
		var again, held bool
		floor, again, held = w.earliest(now, g.burst, qa.background)
		if d := floor.Sub(now); held || (again && d > maxWait) {
			return admission{verdict: verdictOverLimit, wait: d, gen: g.br.gen, paced: d, slack: -1}
		} else if again {
			return admission{verdict: verdictAdmitted, wait: d, gen: g.br.gen, paced: d, then: thenAskAgain, slack: -1}
		}
	}
	paced := max(floor.Sub(now), 0)
	wait, backoff, ok := paced, time.Duration(0), paced <= maxWait
	rateLater := qa.asks != askQuota && paced > 0 && slot == 0 && g.limit.interval > 0
	switch {
	case rateLater:
		wait, backoff, ok = g.limit.hold(now, floor, maxWait)
	case qa.asks != askQuota:
		wait, backoff, ok = g.limit.reserve(now, floor, maxWait)
	}
	if !ok {
		return admission{verdict: verdictOverLimit, wait: wait, backoff: backoff, gen: g.br.gen, paced: paced, slack: -1}
	}
	slack := time.Duration(-1) // no slot of a known window booked (as admitScript says it)
	if w != nil {
		w.book(now.Add(wait))
		if l := w.last().Sub(now.Add(wait)); w.known && l >= 0 {
			slack = l // else a roomy window's margin: not late whenever it starts
		}
	}
	g.br.take(slot, now.Add(wait))
	unknown := qa.key != "" && (w == nil || !w.known)
	if unknown {
		u := g.unb[qa.scope]
		if u == nil || now.After(u.until) {
			u = &unbookedCount{}
			g.unb[qa.scope] = u
		}
		u.n++
		u.until = now.Add(wait + g.lease)
	}
	then := thenSend
	if rateLater {
		then = thenAskRate
	}
	return admission{verdict: verdictAdmitted, wait: wait, backoff: backoff, gen: g.br.gen, probe: slot, paced: paced, unknown: unknown, slack: slack, then: then}
}

func (g *localGuard) record(a admission, o outcome, backoff time.Duration, n quotaNote) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	if backoff > 0 {
		g.limit.backOff(now, backoff)
	}
	g.learnLocked(now, n)
	from := g.br.state
	if g.br.record(now, a.gen, a.probe, o) {
		logTransition(g.log, g.m, g.name, "instance", from.String(), g.br.state.String())
	}
}

// learn takes in what an answer announced of its quota.
func (g *localGuard) learn(n quotaNote) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.learnLocked(g.now(), n)
}

func (g *localGuard) learnLocked(now time.Time, n quotaNote) {
	if n.key == "" {
		return
	}
	w := g.quotas[n.key]
	if w == nil {
		if len(g.quotas) >= maxQuotas {
			for k, w := range g.quotas {
				if now.Sub(w.seen) > max(2*w.win, time.Hour) {
					delete(g.quotas, k)
				}
			}
			if len(g.quotas) >= maxQuotas {
				return
			}
		}
		w = &quotaWindow{}
		g.quotas[n.key] = w
	}
	var c unbookedCount
	u := g.unb[n.scope]
	if u != nil && !now.After(u.until) {
		c = *u
	}
	unbooked := n.unbooked && c.n > 0
	if unbooked {
		c.n--
	}
	w.learn(now, n.q, &c, unbooked)
	switch {
	case u == nil:
	case c.n == 0:
		delete(g.unb, n.scope)
	default:
		*u = c
	}
	w.label = n.label
}

// knows reports whether the guard has learned the quota key names ("":
// none). Every answer an instance reads is learned here too, also while
// Redis is up.
func (g *localGuard) knows(key string) bool {
	if key == "" {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	w := g.quotas[key]
	return w != nil && w.known
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
	// ClearQuotas forgets the quotas learned of upstream and its
	// backoff, for every instance (Client.ClearQuotas).
	ClearQuotas(ctx context.Context, upstream string) error
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

func (g *sharedGuard) admit(ctx context.Context, maxWait time.Duration, qa quotaAsk) (admission, error) {
	res, err := g.s.Admit(ctx, g.up, g.ask(maxWait, qa))
	if err != nil {
		return admission{}, err
	}
	return g.answer(res), nil
}

// ask is the shared guard's question for an attempt that may wait up to
// maxWait and spends qa.
func (g *sharedGuard) ask(maxWait time.Duration, qa quotaAsk) SharedAdmit {
	interval, tau := g.interval, g.tau
	if qa.asks == askQuota {
		interval, tau = 0, 0
	}
	return SharedAdmit{
		Now: g.clock(), Interval: interval, Tau: tau, MaxWait: maxWait,
		Probes: g.p.Breaker.HalfOpenProbes, Lease: g.lease, TTL: g.ttl,
		Quota: qa.key != "", Scope: qa.scope, Partition: qa.partition, Route: qa.route, Burst: g.p.Burst, Background: qa.background,
	}
}

// answer is the admission the shared guard's reply res gives.
func (g *sharedGuard) answer(res SharedAdmission) admission {
	a := admission{wait: res.Wait, gen: res.Gen, probe: res.Probe, backoff: res.Backoff, shared: true, paced: res.Paced, unknown: res.Unknown, slack: res.Slack}
	if res.RateLater {
		a.then = thenAskRate
	}
	switch res.Verdict {
	case "again":
		a.then = thenAskAgain
	case "open":
		a.verdict = verdictOpen
	case "limited":
		a.verdict = verdictOverLimit
	}
	if res.Changed == "half" {
		logTransition(g.log, g.m, g.up, "cluster", breakerOpen.String(), breakerHalfOpen.String())
	}
	return a
}

func (g *sharedGuard) record(ctx context.Context, a admission, o outcome, backoff time.Duration, n quotaNote) {
	b := &g.p.Breaker
	r := SharedRecord{
		Now: g.clock(), Outcome: [...]string{outcomeSuccess: "s", outcomeFailure: "f", outcomeNone: "n"}[o],
		Gen: a.gen, Probe: a.probe, Backoff: backoff,
		FailureThreshold: b.FailureThreshold, FailureRate: b.FailureRate, MinRequests: b.MinRequests,
		Window: b.Window, OpenFor: b.OpenFor, CloseAfter: b.CloseAfter, Probes: b.HalfOpenProbes, TTL: g.ttl,
	}
	if n.key != "" {
		r.Quota = &guardwire.QuotaNote{Scope: n.scope, Route: n.route, Remaining: n.q.Remaining, Limit: n.q.Limit, Reset: n.q.Reset,
			Partition: n.q.Partition, Source: n.q.Source, Label: n.label, Unbooked: n.unbooked}
	}
	from, to, err := g.s.Record(ctx, g.up, r)
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
