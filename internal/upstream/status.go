package upstream

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/coordd/coordd/internal/guardwire"
)

// Status is the state of the guard that protects one upstream, as a
// status page shows it.
type Status struct {
	// Scope is "cluster" (the guard every instance shares through Redis)
	// or "instance" (this instance's own: single-node mode, or Redis down
	// or not answering).
	Scope string
	// Breaker is "closed", "half-open" or "open".
	Breaker string
	// NextProbe is, while the breaker is open, how long until it turns
	// half-open and lets a probe through; else 0.
	NextProbe time.Duration
	// RateLimit and Burst are the configured limit in force for Scope
	// (requests per second, 0: none) and its burst.
	RateLimit, Burst int
	// FreeSlots is how many requests could start now without waiting, up
	// to Burst (0 while a backoff holds); -1 without a rate limit and
	// without a backoff.
	FreeSlots int
	// NextSlot is how long until the next request may start: 0 when one
	// may start now.
	NextSlot time.Duration
	// Backoff is how long the backoff the upstream asked for
	// (Retry-After) still holds; 0: none.
	Backoff time.Duration
	// MaxInFlight is the most requests in flight per credential scope (0:
	// no cap); InFlight counts the slots held by Scope's count: every
	// instance's ("cluster"), or this instance's own ("instance").
	MaxInFlight int
	InFlight    InFlightCount
	// RetriesLeft is how many retries this instance's retry budget allows
	// now; Requests and Retries are what it counted over its window
	// (RetryBudgetWindow). The budget is always the instance's own.
	RetriesLeft, Requests, Retries int
	// Quotas are the quotas learned from the upstream's answers (see
	// Protection.LearnQuota), by credential scope and partition: never a
	// credential, only whose it is (QuotaStatus.Label).
	Quotas []QuotaStatus
}

// QuotaStatus is one learned quota as a status page shows it: its
// partition, limit, what remains after the slots booked, the time to its
// reset (0: unknown), the header it came from and whose credential it
// counts ("upstream", "tenant NAME", "caller", "no credential").
type QuotaStatus = guardwire.QuotaState

// RetryBudgetWindow is the span over which a retry budget counts.
const RetryBudgetWindow = budgetWindow * time.Second

// ClearQuotas forgets the quotas learned of the upstream and the backoff
// a spent one may have set (a Retry-After's too): in the store every
// instance shares, then in this instance's own guard and its metrics'
// memory. It is the operator's way to end a quota that is spent for hours
// without a restart; the next answers teach the quota again. While the
// shared store is down it clears this instance alone and says so: another
// instance's own guard keeps what it learned until its reset.
func (p *Client) ClearQuotas(ctx context.Context) error {
	var err error
	if p.shared != nil {
		if err = p.shared.s.ClearQuotas(ctx, p.up.Name); err != nil {
			err = fmt.Errorf("%s: the quotas every instance shares are not cleared, this instance's are: %w", p.up.Name, err)
		}
	}
	p.local.clearQuotas()
	p.gauges.clear()
	return err
}

// Status returns the state of the guard in force: the shared one, read
// within ctx and the Redis timeout, while the shared store is up and
// answers; the in-process one otherwise. It changes nothing.
func (p *Client) Status(ctx context.Context) Status {
	s, ok := p.sharedStatus(ctx)
	if !ok {
		s = p.local.status()
		s.RateLimit, s.Burst = max(p.up.Protection.RateLimit, 0), p.up.Protection.Burst
		if p.shared != nil { // the local guard of an instance with Redis applies the degraded limit
			s.RateLimit = max(p.up.Protection.DegradedRateLimit, 0)
		}
		if s.RateLimit == 0 {
			s.Burst = 0
		}
	}
	s.RetriesLeft, s.Requests, s.Retries = p.budget.status(p.now())
	p.slots.status(ctx, &s)
	return s
}

func (p *Client) sharedStatus(ctx context.Context) (Status, bool) {
	if p.shared == nil {
		return Status{}, false
	}
	g, err := p.shared.s.GuardState(ctx, p.up.Name, p.shared.clock())
	if err != nil {
		return Status{}, false
	}
	pr := &p.up.Protection
	s := Status{Scope: "cluster", Breaker: luaStateName(g.Breaker), NextProbe: g.Until}
	if pr.RateLimit > 0 {
		s.RateLimit, s.Burst = pr.RateLimit, pr.Burst
	}
	s.slots(p.shared.interval, p.shared.tau, g.TAT, g.Backoff)
	s.Quotas = g.Quotas
	return s, true
}

// status reads the in-process guard.
func (g *localGuard) status() Status {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	s := Status{Scope: "instance", Breaker: g.br.state.String()}
	if g.br.state == breakerOpen {
		s.NextProbe = max(g.br.until.Sub(now), 0)
	}
	s.slots(g.limit.interval, g.limit.tau, g.limit.tat.Sub(now), max(g.limit.backoff.Sub(now), 0))
	for k, w := range g.quotas {
		w.roll(now)
		q := QuotaStatus{Key: k, Label: w.label, Partition: w.partition, Source: w.source, Limit: w.limit, Age: now.Sub(w.seen)}
		if w.known {
			q.Remaining, q.Reset = w.rem, max(w.reset.Sub(now), 0)
		}
		s.Quotas = append(s.Quotas, q)
	}
	slices.SortFunc(s.Quotas, func(a, b QuotaStatus) int { return strings.Compare(a.Key, b.Key) })
	if len(s.Quotas) > maxStatusQuotas {
		s.Quotas = s.Quotas[:maxStatusQuotas]
	}
	return s
}

// maxStatusQuotas bounds the quotas a status shows.
const maxStatusQuotas = 100

// slots fills in FreeSlots, NextSlot and Backoff from a GCRA's interval,
// tau and theoretical arrival time (from now), and the backoff left, as
// reserve would book them.
func (s *Status) slots(interval, tau, tat, backoff time.Duration) {
	s.Backoff = backoff
	next := backoff
	if interval > 0 {
		next = max(next, tat-tau)
	}
	s.NextSlot = max(next, 0)
	switch {
	case backoff > 0:
		s.FreeSlots = 0
	case interval <= 0:
		s.FreeSlots = -1
	default:
		burst := int(tau/interval) + 1
		free := (tau - tat) / interval // whole intervals of headroom left
		if tau-tat < 0 {
			free = -1 // floor, not truncation toward zero
		}
		s.FreeSlots = min(max(int(free)+1, 0), burst)
	}
}

// status returns the retries allowed now, and the requests and retries
// counted over the window.
func (b *retryBudget) status(now time.Time) (left, requests, retries int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	sec := now.Unix()
	for _, k := range b.buckets {
		if k.sec > sec-budgetWindow && k.sec <= sec {
			requests += k.requests
			retries += k.retries
		}
	}
	allowed := b.ratio*float64(requests) + b.minPerSec*budgetWindow
	return max(int(allowed)-retries, 0), requests, retries
}
