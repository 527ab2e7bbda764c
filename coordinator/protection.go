package coordinator

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// Protection configures how coordd protects one upstream from the load of
// every instance together: the rate limit, the shared Retry-After backoff,
// retries with a budget, the circuit breaker, and the bounds put on the
// upstream's own Cache-Control. Zero fields take the defaults written beside
// them. The rate limit, the backoff and the breaker live in Redis and are
// shared by every instance; with Redis down, or without Redis, each instance
// applies the same limits in-process.
type Protection struct {
	// RateLimit is the most requests per second sent to the upstream by all
	// instances together, retries and redirects followed included: no
	// one-second window sees more than RateLimit+Burst-1 requests. Requests
	// over it wait their turn, in order. Default: 20. Negative: no limit.
	RateLimit int
	// Burst is how many requests may go out back to back after a quiet
	// spell. Default: 1 (paced evenly, never bunched).
	Burst int
	// MaxWait bounds how long one fetch waits for a rate-limit slot or for
	// the end of a Retry-After backoff. A fetch is also bounded by the
	// latest deadline among the callers waiting for it. A fetch that cannot
	// get a slot in time fails with ErrRateLimited (or serves the stale
	// copy). Default: 10s.
	MaxWait time.Duration
	// DegradedRateLimit is the per-instance rate limit while Redis is down
	// (each instance then counts only its own requests). Set it to
	// RateLimit divided by the number of instances to keep the cluster
	// within RateLimit even then. Default: RateLimit. Negative: no limit.
	// In single-node mode (no Redis) RateLimit applies.
	DegradedRateLimit int
	// RetryAfterCap caps the backoff an upstream can ask for with
	// Retry-After (in seconds or as an HTTP date, on a 429 or 503). Every
	// instance backs off the upstream until then. Default: 60s.
	RetryAfterCap time.Duration
	// Retry configures retries of failed attempts.
	Retry RetryPolicy
	// Breaker configures the circuit breaker.
	Breaker BreakerPolicy
	// MinTTL and MaxTTL bound a positive fresh lifetime that the
	// upstream's Cache-Control (s-maxage, max-age) sets; a zero one
	// (max-age=0, no-cache) stays zero; without one, the upstream's TTL
	// applies. no-store and private answers are delivered but not cached.
	// Defaults: 1m and 24h.
	MinTTL, MaxTTL time.Duration
}

// RetryPolicy configures retries. Only retryable outcomes are retried:
// connection errors, timeouts, 429 and 5xx other than 501. Never a 4xx
// otherwise, never once the fetch's context has ended.
type RetryPolicy struct {
	// MaxAttempts bounds the attempts per fetch, the first included; a
	// redirect followed starts its own count. Default: 3. 1: no retries.
	MaxAttempts int
	// BaseDelay and MaxDelay shape the backoff: before retry n the fetch
	// sleeps a uniformly random time in [0, min(MaxDelay, BaseDelay·2^(n-1))]
	// ("full jitter"), or until the upstream's Retry-After if later.
	// Defaults: 100ms and 5s.
	BaseDelay, MaxDelay time.Duration
	// BudgetRatio bounds retries to this share of the requests that this
	// instance started in the last 10 seconds, so that retries cannot
	// multiply the load on a struggling upstream. Default: 0.2. Negative:
	// only BudgetMinPerSec.
	BudgetRatio float64
	// BudgetMinPerSec is a floor of retries per second allowed whatever the
	// ratio, so that a quiet instance can still retry. Default: 1.
	// Negative: none.
	BudgetMinPerSec float64
}

// BreakerPolicy configures the circuit breaker, one per upstream, shared
// by every instance. Closed, it lets requests through and counts failed
// attempts (the retryable outcomes). It opens after FailureThreshold
// consecutive failures, or when at least MinRequests attempts in the last
// Window failed at FailureRate or more. Open, it fails every fetch at once
// (stale copy, else ErrBreakerOpen) for OpenFor, then turns half-open: it
// admits HalfOpenProbes attempts at a time, closes after CloseAfter
// successes in a row and opens again on a failure.
type BreakerPolicy struct {
	// FailureThreshold is the consecutive failures that open the breaker.
	// Default: 5. Negative: never on this count.
	FailureThreshold int
	// FailureRate is the share of failed attempts in Window that opens the
	// breaker, at most 1. Default: 0.5. Negative: never on the rate.
	FailureRate float64
	// MinRequests is the attempts in Window below which FailureRate is not
	// judged. Default: 20.
	MinRequests int
	// Window is the span over which FailureRate is measured. Default: 30s.
	Window time.Duration
	// OpenFor is how long the breaker stays open before it probes.
	// Default: 10s.
	OpenFor time.Duration
	// HalfOpenProbes is the attempts admitted at a time while half-open;
	// every other fetch fails at once meanwhile. Default: 1.
	HalfOpenProbes int
	// CloseAfter is the successful probes in a row that close the breaker.
	// Default: 2.
	CloseAfter int
}

func (p *Protection) setDefaults() {
	setDefault(&p.RateLimit, 20)
	setDefault(&p.Burst, 1)
	setDefault(&p.MaxWait, 10*time.Second)
	setDefault(&p.DegradedRateLimit, p.RateLimit)
	setDefault(&p.RetryAfterCap, time.Minute)
	setDefault(&p.MinTTL, time.Minute)
	setDefault(&p.MaxTTL, 24*time.Hour)
	r := &p.Retry
	setDefault(&r.MaxAttempts, 3)
	setDefault(&r.BaseDelay, 100*time.Millisecond)
	setDefault(&r.MaxDelay, 5*time.Second)
	setDefault(&r.BudgetRatio, 0.2)
	setDefault(&r.BudgetMinPerSec, 1)
	b := &p.Breaker
	setDefault(&b.FailureThreshold, 5)
	setDefault(&b.FailureRate, 0.5)
	setDefault(&b.MinRequests, 20)
	setDefault(&b.Window, 30*time.Second)
	setDefault(&b.OpenFor, 10*time.Second)
	setDefault(&b.HalfOpenProbes, 1)
	setDefault(&b.CloseAfter, 2)
}

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

func (p *Protection) validate(field string) error {
	bad := func(name, format string, args ...any) error {
		return fmt.Errorf("%s.%s: "+format, append([]any{field, name}, args...)...)
	}
	r, b := &p.Retry, &p.Breaker
	switch {
	case p.Burst < 1:
		return bad("burst", "%d must be at least 1", p.Burst)
	case p.MaxWait < 0:
		return bad("max_wait", "must not be negative")
	case p.RetryAfterCap < 0:
		return bad("retry_after_cap", "must not be negative")
	case p.MinTTL < 0:
		return bad("min_ttl", "must not be negative")
	case p.MaxTTL < p.MinTTL:
		return bad("max_ttl", "%v is below min_ttl %v", p.MaxTTL, p.MinTTL)
	case r.MaxAttempts < 1 || r.MaxAttempts > 10:
		return bad("retry.max_attempts", "%d must be between 1 and 10", r.MaxAttempts)
	case r.BaseDelay < 0:
		return bad("retry.base_delay", "must not be negative")
	case r.MaxDelay < r.BaseDelay:
		return bad("retry.max_delay", "%v is below base_delay %v", r.MaxDelay, r.BaseDelay)
	case math.IsNaN(r.BudgetRatio) || r.BudgetRatio > 10:
		return bad("retry.budget_ratio", "%v must be at most 10", r.BudgetRatio)
	case math.IsNaN(r.BudgetMinPerSec) || r.BudgetMinPerSec > 1000:
		return bad("retry.budget_min_per_sec", "%v must be at most 1000", r.BudgetMinPerSec)
	case math.IsNaN(b.FailureRate) || b.FailureRate > 1:
		return bad("breaker.failure_rate", "%v must be at most 1", b.FailureRate)
	case b.MinRequests < 1:
		return bad("breaker.min_requests", "%d must be at least 1", b.MinRequests)
	case b.Window < 100*time.Millisecond:
		return bad("breaker.window", "%v is below the 100ms minimum", b.Window)
	case b.OpenFor < 0:
		return bad("breaker.open_for", "must not be negative")
	case b.HalfOpenProbes < 1 || b.HalfOpenProbes > 100:
		return bad("breaker.half_open_probes", "%d must be between 1 and 100", b.HalfOpenProbes)
	case b.CloseAfter < 1:
		return bad("breaker.close_after", "%d must be at least 1", b.CloseAfter)
	}
	return nil
}

// protect wraps the plain HTTP fetch of up with its protection: the guard
// (breaker, backoff, rate limit) shared through Redis while Redis is up,
// the in-process one otherwise, and retries under a budget.
func (c *Coordinator) protect(up *Upstream, next Fetcher) Fetcher {
	log := c.log.With("upstream", up.Name)
	p := &protected{
		up:     up,
		next:   next,
		now:    c.cfg.Now,
		log:    log,
		budget: newRetryBudget(up.Protection.Retry),
		local:  newLocalGuard(up, c.rl != nil, c.cfg.Now, log, c.m),
		m:      c.m,
		bg:     &c.wg,
	}
	if c.rl != nil {
		p.shared = newRedisGuard(c.rl, up, nil, log, c.m)
	}
	return p
}

// protected is the Fetcher that protects one upstream. Every attempt, the
// first and each retry, is admitted by a guard, which may make it wait for
// a rate-limit slot or fail it at once (breaker open, slot too far), and
// its outcome is recorded there. It is safe for concurrent use.
type protected struct {
	up     *Upstream
	next   Fetcher
	now    func() time.Time
	log    *slog.Logger
	budget *retryBudget
	shared *redisGuard // nil in single-node mode
	local  *localGuard // single-node mode, and while Redis is down
	m      Metrics
	// bg tracks outcomes recorded after the answer is handed back; the
	// Coordinator's Close waits for them. Nil: record before returning.
	bg *sync.WaitGroup
}

// MaxRedirects is the most redirects one fetch follows. Each redirect
// followed is an upstream request of its own: admitted by the guard (rate
// limit, breaker, Retry-After backoff), recorded there, counted by the
// retry budget and retried like any other. The redirect past the limit is
// delivered as the answer.
const MaxRedirects = 5

// Fetch fetches through the protection, following redirects within the
// upstream (at most MaxRedirects). It returns the last attempt's answer or
// error, or, when no attempt was allowed, an error wrapping ErrBreakerOpen
// (breaker open) or ErrRateLimited (no slot within the wait bound); that
// holds for each redirect hop as for the first request. A retry that is
// refused (budget spent, breaker open, slot or Retry-After past the wait
// bound) leaves the last answer standing. A redirect is followed only to
// the canonical form of its target, which is what is sent, byte for byte;
// a redirect leaving the upstream, one whose target canonicalURL refuses,
// and the one past MaxRedirects are delivered as they are.
func (p *protected) Fetch(ctx context.Context, fr FetchRequest, report func(Progress)) (*Response, error) {
	if report == nil {
		report = func(Progress) {}
	}
	for hop := 0; ; hop++ {
		resp, err := p.fetchOne(ctx, fr, report)
		if err != nil || hop == MaxRedirects {
			return resp, err
		}
		next, ok := p.redirect(fr.URL, resp)
		if !ok {
			return resp, nil
		}
		p.log.Debug("following redirect", "from", fr.URL, "to", next, "hop", hop+1)
		// Conditional headers go along, as net/http would send them: a
		// cached copy of a redirected url carries its target's validators.
		fr.URL = next
	}
}

// isRedirect reports whether resp is a redirect that Fetch may follow.
func isRedirect(resp *Response) bool {
	switch resp.StatusCode {
	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther,
		http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
		return true
	}
	return false
}

// redirect returns the canonical url resp redirects to, and false when
// resp is no redirect to follow: not a redirect, no usable Location, a
// target that canonicalURL refuses or that leaves the upstream.
func (p *protected) redirect(from string, resp *Response) (string, bool) {
	switch resp.StatusCode {
	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther,
		http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
	default:
		return "", false
	}
	loc := resp.Header.Get("Location")
	base, err := url.Parse(from)
	if loc == "" || err != nil {
		return "", false
	}
	ref, err := base.Parse(loc)
	if err != nil {
		return "", false
	}
	u, err := canonicalURL(ref.String())
	if err != nil || !within(p.up, u) {
		p.log.Debug("not following redirect", "from", from, "location", loc, "err", err)
		return "", false
	}
	return u.String(), true
}

// fetchOne fetches one url: the first attempt and its retries.
func (p *protected) fetchOne(ctx context.Context, fr FetchRequest, report func(Progress)) (*Response, error) {
	rp := &p.up.Protection.Retry
	p.budget.request(p.now())
	var (
		resp *Response
		err  error
	)
	for attempt := 1; ; attempt++ {
		a, aerr := p.admit(ctx, report)
		if aerr != nil {
			if attempt > 1 {
				return resp, err // a retry refused: the last answer stands
			}
			return nil, aerr
		}
		resp, err = p.next.Fetch(ctx, fr, report)
		p.m.UpstreamRequest(p.up.Name, statusOf(resp))
		o, why := classify(ctx, resp, err)
		backoff := p.retryAfter(resp)
		if o == outcomeSuccess && a.shared && a.probe == 0 && p.bg != nil && !isRedirect(resp) {
			// The answer goes to the callers now; its outcome reaches the
			// shared breaker a Redis round trip later. Not for a half-open
			// probe, whose slot the next probe waits for, nor a redirect,
			// whose next hop is admitted by the state this records.
			p.bg.Go(func() { p.record(context.WithoutCancel(ctx), a, o, backoff) })
			return resp, err
		}
		p.record(ctx, a, o, backoff)
		if o != outcomeFailure || attempt >= rp.MaxAttempts || ctx.Err() != nil {
			return resp, err
		}
		delay := max(backoffDelay(rp, attempt), backoff)
		if delay > p.bound(ctx) {
			p.log.Debug("not retrying: the backoff ends past the wait bound", "url", fr.URL, "delay", delay)
			return resp, err
		}
		if !p.budget.tryRetry(p.now()) {
			p.log.Debug("not retrying: retry budget exhausted", "url", fr.URL)
			return resp, err
		}
		p.m.Retry(p.up.Name)
		report(Progress{
			Stage:   StageRetrying,
			Attempt: attempt + 1,
			Wait:    delay,
			Detail:  fmt.Sprintf("retry %d of %d after %s", attempt, rp.MaxAttempts-1, why),
		})
		if !sleep(ctx, delay) {
			return resp, err
		}
	}
}

// admit gets an attempt admitted, waiting for its slot. It reports what it
// waits for.
func (p *protected) admit(ctx context.Context, report func(Progress)) (admission, error) {
	bound := p.bound(ctx)
	a := p.ask(ctx, bound)
	switch a.verdict {
	case verdictOpen:
		p.m.BreakerRejected(p.up.Name)
		report(Progress{Stage: StageBreakerOpen, Wait: a.wait, Detail: "circuit breaker open: not calling " + p.up.Name})
		return a, withRetryAfter(fmt.Errorf("%w: %s", ErrBreakerOpen, p.up.Name), a.wait)
	case verdictOverLimit:
		p.m.RateLimitRefused(p.up.Name)
		report(Progress{Stage: StageRateLimited, Wait: a.wait, Detail: "next slot is past the wait bound"})
		return a, withRetryAfter(fmt.Errorf("%w: %s: next slot in %v, past the %v this fetch may wait",
			ErrRateLimited, p.up.Name, a.wait.Round(time.Millisecond), bound.Round(time.Millisecond)), a.wait)
	}
	if a.wait > 0 {
		p.m.RateLimitWait(p.up.Name, a.wait)
		detail := "waiting for a rate-limit slot"
		if a.backoff >= a.wait {
			detail = p.up.Name + " asked to back off (Retry-After)"
		}
		report(Progress{Stage: StageRateLimited, Wait: a.wait, Detail: detail})
		if !sleep(ctx, a.wait) {
			p.record(ctx, a, outcomeNone, 0)
			return a, fmt.Errorf("%w: %s: %v", ErrUnavailable, p.up.Name, ctx.Err())
		}
	}
	return a, nil
}

// ask asks the shared guard, or the local one while Redis is down or
// failing.
func (p *protected) ask(ctx context.Context, bound time.Duration) admission {
	if p.shared != nil && p.shared.healthy() {
		if a, err := p.shared.admit(ctx, bound); err == nil {
			return a
		}
	}
	return p.local.admit(bound)
}

// record reports an attempt's outcome to the guard that admitted it. A
// backoff the upstream asked for is also kept locally, so that it outlives
// a Redis failure.
func (p *protected) record(ctx context.Context, a admission, o outcome, backoff time.Duration) {
	if a.shared {
		p.shared.record(context.WithoutCancel(ctx), a, o, backoff)
		if backoff > 0 {
			p.local.backOff(backoff)
		}
		return
	}
	p.local.record(a, o, backoff)
}

// bound is how long this fetch may still wait: MaxWait, or less when every
// caller waiting for it has a deadline, or its context has one.
func (p *protected) bound(ctx context.Context) time.Duration {
	b := p.up.Protection.MaxWait
	// Deadlines are wall-clock times, whatever clock the guard keeps.
	if dl, ok := ctx.Deadline(); ok {
		b = min(b, time.Until(dl))
	}
	if dl, ok := callerDeadline(ctx); ok {
		b = min(b, time.Until(dl))
	}
	if lowPriority(ctx) {
		// At most the next slot: never queue behind others, so that cold
		// misses wait for one such fetch at most.
		b = 0
		if rl := p.up.Protection.RateLimit; rl > 0 {
			b = min(p.up.Protection.MaxWait, slotInterval(rl))
		}
	}
	return max(b, 0)
}

type lowPriorityKey struct{}

// withLowPriority marks a fetch that only refreshes a copy that is still
// fresh (a caller's max_age refused it): it takes a rate-limit slot only
// if the next one is free, so that such callers cannot starve cold misses
// and background revalidations.
func withLowPriority(ctx context.Context) context.Context {
	return context.WithValue(ctx, lowPriorityKey{}, true)
}

func lowPriority(ctx context.Context) bool {
	v, _ := ctx.Value(lowPriorityKey{}).(bool)
	return v
}

// tooManyBackoff is the backoff after a 429 without a Retry-After.
const tooManyBackoff = time.Second

// retryAfter is the backoff resp asks for: its Retry-After on a 429 or 503,
// capped; tooManyBackoff for a bare 429; else 0.
func (p *protected) retryAfter(resp *Response) time.Duration {
	if resp == nil || (resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable) {
		return 0
	}
	d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), p.now())
	if !ok && resp.StatusCode == http.StatusTooManyRequests {
		d = tooManyBackoff
	}
	return min(d, p.up.Protection.RetryAfterCap)
}

// sleep waits d, and reports false if ctx ends first.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// callerDeadlines tracks the latest deadline among the callers waiting on
// a flight. The flight's fetch runs under the coordinator's context, which
// has no deadline; this bound lets it give up on a rate-limit slot that no
// caller would live to see. It is safe for concurrent use.
type callerDeadlines struct {
	mu     sync.Mutex // protects the fields below
	latest time.Time
	open   bool // some caller waits without a deadline
}

// add counts in a caller whose context is ctx.
func (d *callerDeadlines) add(ctx context.Context) {
	dl, ok := ctx.Deadline()
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case !ok:
		d.open = true
	case dl.After(d.latest):
		d.latest = dl
	}
}

// deadline returns the latest deadline, and false when some caller has
// none, or none was added.
func (d *callerDeadlines) deadline() (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.open || d.latest.IsZero() {
		return time.Time{}, false
	}
	return d.latest, true
}

type callerDeadlinesKey struct{}

// withCallerDeadlines returns ctx carrying d, for the flight's fetch.
func withCallerDeadlines(ctx context.Context, d *callerDeadlines) context.Context {
	return context.WithValue(ctx, callerDeadlinesKey{}, d)
}

// callerDeadline returns the latest deadline of the callers of the flight
// whose context ctx is.
func callerDeadline(ctx context.Context) (time.Time, bool) {
	d, _ := ctx.Value(callerDeadlinesKey{}).(*callerDeadlines)
	if d == nil {
		return time.Time{}, false
	}
	return d.deadline()
}
