package upstream

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Options are the optional dependencies of NewClient.
type Options struct {
	// Transport performs the default Fetcher's requests. Default:
	// http.DefaultTransport.
	Transport http.RoundTripper
	// Shared is the guard state every instance shares. Nil: single-node
	// mode, where the in-process guard applies RateLimit.
	Shared Shared
	// Now is the clock of the in-process guard and the retry budget.
	// Default: time.Now.
	Now func() time.Time
	// Logger receives the client's logs. Default: slog.Default().
	Logger *slog.Logger
	// Metrics observes the client. Default: none.
	Metrics Metrics
	// Background, when set, tracks outcomes recorded after the answer is
	// handed back, so that the owner can wait for them on close. Nil:
	// outcomes are recorded before Fetch returns.
	Background *sync.WaitGroup
	// Context is the owner's: the Client's own background work (the fair
	// queues' bookings and slot timers) runs under it. Close ends that
	// work and waits for it. Default: context.Background().
	Context context.Context
}

// NewClient returns the Fetcher that protects up, which must have been
// defaulted and validated: the guard (breaker, backoff, rate limit)
// shared through o.Shared while it answers, the in-process one otherwise,
// and retries under a budget.
func NewClient(up *Config, o Options) *Client {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	tr := o.Transport
	if tr == nil {
		tr = http.DefaultTransport
	}
	next := newHTTPFetcher(up, tr)
	p := &Client{
		up:     up,
		next:   next,
		now:    o.Now,
		log:    o.Logger,
		budget: newRetryBudget(up.Protection.Retry),
		local:  newLocalGuard(up, o.Shared != nil, o.Now, o.Logger, o.Metrics),
		m:      orNop(o.Metrics),
		bg:     o.Background,
		parts:  newPartitions(up.BaseURL),
		gauges: newQuotaGauges(),
		slots:  newInFlight(up, o.Shared, o.Now),
	}
	if o.Shared != nil {
		p.shared = newSharedGuard(o.Shared, up, nil, o.Logger, o.Metrics)
	}
	ctx := o.Context
	if ctx == nil {
		ctx = context.Background()
	}
	p.fair = newFairScheduler(ctx, p)
	return p
}

// Close ends the Client's own background work and waits for it: once it
// returns, no goroutine of the Client runs and none calls the shared
// store; attempts still queued for a slot fail with ErrUnavailable. The
// Client is not to be used after it.
func (p *Client) Close() { p.fair.close() }

// Client is the Fetcher that protects one upstream. Every attempt, the
// first and each retry, is admitted by a guard, which may make it wait for
// a rate-limit slot or fail it at once (breaker open, slot too far), and
// its outcome is recorded there. It is safe for concurrent use.
type Client struct {
	up     *Config
	next   Fetcher
	now    func() time.Time
	log    *slog.Logger
	budget *retryBudget
	shared *sharedGuard   // nil in single-node mode
	local  *localGuard    // single-node mode, and while the shared store is down
	fair   *fairScheduler // hands contended slots out in fair order (fair.go)
	m      Metrics
	// bg tracks outcomes recorded after the answer is handed back; the
	// owner's Close waits for them. Nil: record before returning.
	bg     *sync.WaitGroup
	parts  *partitions  // which quota partition each route is counted in
	gauges *quotaGauges // the quotas last announced, for the metrics
	slots  *inFlight    // the requests in flight (inflight.go); nil without max_in_flight
	// quotaWarned is when an ignored quota answer was last logged (Unix
	// ns; 0 never).
	quotaWarned atomic.Int64
}

// Breakers returns the state of the client's breakers: the shared one's
// ("" when there is none, or it could not be read within ctx), and the
// in-process one's. States are "closed", "half-open" or "open".
func (p *Client) Breakers(ctx context.Context) (shared, local string) {
	if p.shared != nil {
		shared, _ = p.shared.state(ctx)
	}
	return shared, p.local.state()
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
// a redirect leaving the upstream, one whose target CanonicalURL refuses,
// and the one past MaxRedirects are delivered as they are.
func (p *Client) Fetch(ctx context.Context, fr FetchRequest, report func(Event)) (*Response, error) {
	if report == nil {
		report = func(Event) {}
	}
	report = tracedReport(ctx, report)
	if fr.First != nil && !fr.First.fits(fr) {
		fr.First.Drop(ctx)
	}
	for hop := 0; ; hop++ {
		resp, err := p.fetchOne(ctx, fr, hop, report)
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
// target that CanonicalURL refuses or that leaves the upstream.
func (p *Client) redirect(from string, resp *Response) (string, bool) {
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
	u, err := CanonicalURL(ref.String())
	if err != nil || !Contains(p.up, u) {
		p.log.Debug("not following redirect", "from", from, "location", loc, "err", err)
		return "", false
	}
	return u.String(), true
}

// fetchOne fetches one url, redirect hop hop of the fetch: the first
// attempt and its retries.
func (p *Client) fetchOne(ctx context.Context, fr FetchRequest, hop int, report func(Event)) (*Response, error) {
	rp := &p.up.Protection.Retry
	p.budget.request(p.now())
	var (
		resp *Response
		err  error
	)
	for attempt := 1; ; attempt++ {
		a, aerr := p.admit(ctx, fr, report)
		var slot heldSlot // of the requests in flight: taken once admitted, given back once answered
		for again := 0; aerr == nil; again++ {
			slot, aerr = p.takeSlot(ctx, fr, a, report)
			if aerr != nil || again == 2 {
				break
			}
			qa := p.quotaAsk(fr)
			if unknownThen := a.unknown && (slot.waited || p.local.knows(qa.key)); !unknownThen && !a.late() {
				break
			}
			// Admitted before any answer had announced the quota, then
			// held up by the slots in flight while answers came back, or
			// an answer this instance read announced it meanwhile; or
			// held up past the quota window's slots, where the upstream
			// may count the request in the next window: ask the quota
			// again (a slot booked late goes unused). Go at once if it
			// allows; else give the slot in flight back while paced.
			qa.asks = askQuota
			b := p.ask(ctx, p.bound(ctx, fr), qa)
			if b.verdict == verdictAdmitted && !b.again() && b.wait == 0 {
				a, a.started = b, time.Now()
				break
			}
			slot.release(ctx)
			if b.verdict != verdictAdmitted || b.again() {
				a, aerr = p.admitAs(ctx, fr, qa, report) // refused, or waits for the next window
				continue
			}
			report(Event{Stage: StageRateLimited, Wait: b.wait, Detail: "pacing by the quota " + p.up.Name + " announced"})
			if !sleep(ctx, b.wait) {
				p.record(ctx, b, outcomeNone, 0, quotaNote{})
				aerr = fmt.Errorf("%w: %s: %v", ErrUnavailable, p.up.Name, ctx.Err())
				break
			}
			a, a.started = b, time.Now()
		}
		if aerr != nil {
			if attempt > 1 {
				return resp, err // a retry refused: the last answer stands
			}
			return nil, aerr
		}
		actx, at := p.startAttempt(ctx, fr, attempt, hop)
		resp, err = p.next.Fetch(actx, fr, report)
		at.end(resp, err)
		p.m.UpstreamRequest(p.up.Name, statusOf(resp))
		o, why := classify(ctx, resp, err)
		backoff := p.sharedBackoff(fr, resp)
		note := p.quotaNote(fr, resp)
		note.unbooked = a.unknown
		if o == outcomeSuccess && a.shared && a.probe == 0 && p.bg != nil && !isRedirect(resp) {
			// The answer goes to the callers now; its outcome reaches the
			// shared breaker a Redis round trip later. Not for a half-open
			// probe, whose slot the next probe waits for, nor a redirect,
			// whose next hop is admitted by the state this records. The
			// slot in flight is given back once the quota the answer
			// announced is recorded, so that the attempt it wakes is
			// paced by it.
			p.bg.Go(func() {
				p.record(context.WithoutCancel(ctx), a, o, backoff, note)
				slot.release(context.WithoutCancel(ctx))
			})
			return resp, err
		}
		p.record(ctx, a, o, backoff, note)
		slot.release(ctx)
		if !retryable(o, resp) || attempt >= rp.MaxAttempts || ctx.Err() != nil {
			return resp, err
		}
		// The caller waits its own wait (a credential's spent quota holds
		// back only its fetches: Backoff, not sharedBackoff).
		delay := max(backoffDelay(rp, attempt), p.Backoff(resp))
		if delay > p.bound(ctx, fr) {
			p.log.Debug("not retrying: the backoff ends past the wait bound", "url", fr.URL, "delay", delay)
			return resp, err
		}
		if !p.budget.tryRetry(p.now()) {
			p.log.Debug("not retrying: retry budget exhausted", "url", fr.URL)
			return resp, err
		}
		p.m.Retry(p.up.Name)
		report(Event{
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
// waits for. While nobody of fr's QuotaScope queues, the guard is asked
// directly, and a slot that starts at once is taken; a wait (contention)
// queues the attempt instead, its slot the queue's, and the queue hands
// slots out in fair order as they start (fair.go). A slot booked by the
// rate limit alone, before any answer had announced the quota the attempt
// spends, is checked against the quota again when it starts (that ask
// books no second rate-limit slot): a burst of cold fetches books its
// slots at once, before the first answer is back, and must not all go
// out at the rate limit when the quota says slower. A quota whose window
// is spent books nothing: the attempt waits for the next window and asks
// again. A slot the quota paces books the rate limit, which the
// upstream's other credentials share, only when it starts
// (admission.rateLater()).
func (p *Client) admit(ctx context.Context, fr FetchRequest, report func(Event)) (admission, error) {
	return p.admitAs(ctx, fr, p.quotaAsk(fr), report)
}

// admitAs is admit, asking first for qa.
func (p *Client) admitAs(ctx context.Context, fr FetchRequest, qa quotaAsk, report func(Event)) (admission, error) {
	var paced *admission // the quota's slot, started, while the rate limit is asked (rateLater)
	for {
		bound := p.bound(ctx, fr)
		var (
			a      admission
			err    error
			queued bool
		)
		first := qa.asks == askBoth                          // asked for the rate limit and the quota: the queue's
		ahead := first && fr.First != nil && !fr.First.taken // asked ahead, holding the scope's ask (PrepareAsk)
		if first && !ahead && !p.fair.tryAsk(fr.QuotaScope) {
			a, err = p.fair.wait(ctx, fr, qa, bound, nil, report)
			queued = true
		} else {
			answered := false
			if ahead {
				a, answered = fr.First.take()
			}
			if !answered {
				a = p.ask(ctx, bound, qa)
			}
			if a.verdict == verdictAdmitted && a.wait > 0 && !a.again() && first {
				a, err = p.fair.wait(ctx, fr, qa, bound, &a, report) // ends the ask
				queued = true
			} else if first {
				p.fair.asked(fr.QuotaScope)
			}
		}
		if err != nil {
			return a, err
		}
		switch a.verdict {
		case verdictOpen:
			p.m.BreakerRejected(p.up.Name)
			report(Event{Stage: StageBreakerOpen, Wait: a.wait, Detail: "circuit breaker open: not calling " + p.up.Name})
			return a, WithRetryAfter(fmt.Errorf("%w: %s", ErrBreakerOpen, p.up.Name), a.wait)
		case verdictOverLimit:
			p.m.RateLimitRefused(p.up.Name)
			report(Event{Stage: StageRateLimited, Wait: a.wait, Detail: "next slot is past the wait bound"})
			return a, WithRetryAfter(fmt.Errorf("%w: %s: next slot in %v, past the %v this fetch may wait",
				ErrRateLimited, p.up.Name, a.wait.Round(time.Millisecond), bound.Round(time.Millisecond)), a.wait)
		}
		if a.wait > 0 && !queued {
			p.m.RateLimitWait(p.up.Name, a.wait)
			detail := "waiting for a rate-limit slot"
			switch {
			case a.again():
				detail = "the quota " + p.up.Name + " announced is spent until its reset"
			case a.backoff >= a.wait:
				detail = p.up.Name + " asked to back off (Retry-After)"
			case a.paced >= a.wait:
				detail = "pacing by the quota " + p.up.Name + " announced"
			}
			report(Event{Stage: StageRateLimited, Wait: a.wait, Detail: detail})
			if !sleep(ctx, a.wait) {
				if !a.again() { // nothing to give back otherwise
					p.record(ctx, a, outcomeNone, 0, quotaNote{})
				}
				return a, fmt.Errorf("%w: %s: %v", ErrUnavailable, p.up.Name, ctx.Err())
			}
		}
		if a.again() {
			qa = p.quotaAsk(fr)
			continue
		}
		if a.rateLater() {
			a.started = time.Now()
			paced, qa = &a, quotaAsk{asks: askRate}
			continue
		}
		if paced != nil { // how late the attempt may go is the quota slot's
			a.slack, a.started, a.paced = paced.slack, paced.started, paced.paced
			return a, nil
		}
		if !a.unknown || a.wait == 0 || a.probe > 0 || qa.asks == askQuota {
			a.started = time.Now()
			return a, nil
		}
		qa = p.quotaAsk(fr) // its partition may be known by now
		qa.asks = askQuota
	}
}

// ask asks the shared guard, or the local one while Redis is down or
// failing.
func (p *Client) ask(ctx context.Context, bound time.Duration, qa quotaAsk) admission {
	if p.shared != nil { // fails fast while the store is down
		if a, err := p.shared.admit(ctx, bound, qa); err == nil {
			return a
		}
	}
	return p.local.admit(bound, qa)
}

// record reports an attempt's outcome, and the quota its answer
// announced, to the guard that admitted it. A backoff the upstream asked
// for and the quota are also kept locally, so that they outlive a Redis
// failure.
func (p *Client) record(ctx context.Context, a admission, o outcome, backoff time.Duration, n quotaNote) {
	if a.shared {
		p.shared.record(context.WithoutCancel(ctx), a, o, backoff, n)
		if backoff > 0 {
			p.local.backOff(backoff)
		}
		p.local.learn(n)
		return
	}
	p.local.record(a, o, backoff, n)
}

// quotaAsk is the learned quota fr spends: its credential scope's, in
// the partition its route was last answered under.
func (p *Client) quotaAsk(fr FetchRequest) quotaAsk {
	if !p.up.Protection.LearnsQuota() {
		return quotaAsk{}
	}
	route := p.parts.route(fr.URL)
	part := p.parts.of(fr.QuotaScope, route)
	return quotaAsk{key: quotaKey(fr.QuotaScope, part), scope: fr.QuotaScope, partition: part, route: route,
		background: fr.Background != nil && fr.Background()}
}

// quotaNote is what resp, answering fr, announced of its quota; its
// partition is remembered for fr's route, and its figures for the
// metrics.
func (p *Client) quotaNote(fr FetchRequest, resp *Response) quotaNote {
	if resp == nil || !p.up.Protection.LearnsQuota() {
		return quotaNote{}
	}
	now := p.now()
	q, ok, garbage := readQuota(resp.Header, now)
	if garbage != "" {
		p.ignoredQuota(garbage, now)
	}
	if !ok {
		return quotaNote{}
	}
	route := p.parts.route(fr.URL)
	p.parts.learn(fr.QuotaScope, route, q.Partition)
	label := fr.QuotaLabel
	if label == "" {
		label = "no credential"
	}
	n := quotaNote{key: quotaKey(fr.QuotaScope, q.Partition), scope: fr.QuotaScope, route: route, label: label, q: q}
	rem, limit, reset := p.gauges.set(n.key, q, now)
	p.m.UpstreamQuota(p.up.Name, p.gauges.label(q.Partition), rem, limit, reset)
	return n
}

// ignoredQuotaLogEvery is how often an upstream's ignored quota answers
// are logged at most: they are counted each time.
const ignoredQuotaLogEvery = time.Minute

// ignoredQuota counts an answer whose quota headers were garbage (why,
// from readQuota: the family, then numbers only), and logs it at most
// once per upstream and ignoredQuotaLogEvery.
func (p *Client) ignoredQuota(why string, now time.Time) {
	family, _, _ := strings.Cut(why, ":")
	p.m.UpstreamQuotaIgnored(p.up.Name, family)
	last := p.quotaWarned.Load()
	if last != 0 && now.Sub(time.Unix(0, last)) < ignoredQuotaLogEvery {
		return
	}
	if p.quotaWarned.CompareAndSwap(last, now.UnixNano()) {
		p.log.Warn("ignoring the quota an upstream announced: its headers are inconsistent, so nothing of them is learned (counted in coordd_upstream_quota_ignored_total; logged once a minute)",
			"upstream", p.up.Name, "header", why)
	}
}

// bound is how long this fetch may still wait: MaxWait, or less when every
// caller waiting for it has a deadline (fr.Deadline), or its context has
// one.
func (p *Client) bound(ctx context.Context, fr FetchRequest) time.Duration {
	b := p.up.Protection.MaxWait
	// Deadlines are wall-clock times, whatever clock the guard keeps.
	if dl, ok := ctx.Deadline(); ok {
		b = min(b, time.Until(dl))
	}
	if fr.Deadline != nil {
		if dl, ok := fr.Deadline(); ok {
			b = min(b, time.Until(dl))
		}
	}
	if fr.LowPriority {
		// At most the next slot: never queue behind others, so that cold
		// misses wait for one such fetch at most.
		b = 0
		if rate := p.up.Protection.RateLimit; rate > 0 {
			b = min(p.up.Protection.MaxWait, slotInterval(rate))
		}
	}
	return max(b, 0)
}

// tooManyBackoff is the backoff after a 429 without a Retry-After.
const tooManyBackoff = time.Second

// sharedBackoff is the backoff every instance holds the whole upstream
// for after resp, answering fr: Backoff, except that a spent quota (a
// rate-limited 403, or no request left) of a fetch that carried a
// credential is that credential's alone, and holds nobody else back. Its
// callers still get its wait (Backoff). A 429's or 503's Retry-After is
// the upstream's, whoever asked.
func (p *Client) sharedBackoff(fr FetchRequest, resp *Response) time.Duration {
	if fr.Scoped && resp != nil && resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable {
		return 0
	}
	return p.Backoff(resp)
}

// Backoff is how long every instance holds its requests to the upstream
// after resp: its Retry-After on a 429, a 503 or a rate-limited 403 (see
// RateLimited), capped at RetryAfterCap; else, for a rate-limited answer
// or any answer whose quota has no request left, until the quota's reset
// (within a day: see parseQuota); tooManyBackoff for a rate limit that
// says nothing more; else 0.
func (p *Client) Backoff(resp *Response) time.Duration {
	if resp == nil {
		return 0
	}
	now := p.now()
	limited := RateLimited(resp)
	if limited || resp.StatusCode == http.StatusServiceUnavailable {
		if d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), now); ok {
			return min(d, p.up.Protection.RetryAfterCap)
		}
	}
	if q, ok := parseQuota(resp.Header, now); ok && q.Remaining == 0 && q.Reset > 0 {
		return q.Reset
	}
	if limited {
		return tooManyBackoff
	}
	return 0
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
