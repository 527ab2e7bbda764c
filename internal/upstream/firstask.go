package upstream

import "context"

// FirstAsk is a fetch's first question to the shared guard, asked ahead
// of the fetch, so that the store can ask it in the round trip that takes
// the fetch's fill lock, and only if that round trip takes it
// (store.Redis.ClaimAdmitting): the lock's holder calls the upstream a
// round trip sooner, and an instance that follows books nothing. The
// fetch (FetchRequest.First) takes the answer as its first attempt's
// admission; without one (Redis Cluster, where the guard's keys are in
// another slot; no reply), it asks then, as it would have. A FirstAsk
// that no fetch takes is dropped (Drop). Prepared, it holds its credential
// scope's one direct ask of this instance (fairScheduler.tryAsk), as the
// fetch's own ask would. It is not safe for concurrent use: the flight
// that prepares it claims, then fetches or drops.
type FirstAsk struct {
	Upstream string      // whose guard
	Admit    SharedAdmit // the question

	p           *Client
	scope       string
	lowPriority bool
	answer      *SharedAdmission
	taken       bool // by a fetch, or dropped
}

// PrepareAsk returns the first ask of a fetch of fr, or nil when it has
// none to ask ahead: no shared guard (single-node mode), or this instance
// already asks, or queues, for fr's credential scope (the fetch then
// queues with them, as it would have).
func (p *Client) PrepareAsk(ctx context.Context, fr FetchRequest) *FirstAsk {
	if p.shared == nil || !p.fair.tryAsk(fr.QuotaScope) {
		return nil
	}
	return &FirstAsk{Upstream: p.up.Name, Admit: p.shared.ask(p.bound(ctx, fr), p.quotaAsk(fr)),
		p: p, scope: fr.QuotaScope, lowPriority: fr.LowPriority}
}

// Answered gives the shared guard's answer to a.Admit.
func (a *FirstAsk) Answered(res SharedAdmission) { a.answer = &res }

// Drop ends a if no fetch took it: its scope's ask ends, and a slot its
// answer booked is given back as one that no request used. a may be nil.
func (a *FirstAsk) Drop(ctx context.Context) {
	if a == nil || a.taken {
		return
	}
	a.taken = true
	if a.answer != nil {
		if ad := a.p.shared.answer(*a.answer); ad.verdict == verdictAdmitted && !ad.again() {
			a.p.record(ctx, ad, outcomeNone, 0, quotaNote{})
		}
	}
	a.p.fair.asked(a.scope)
}

// fits reports whether a was asked for a fetch like fr: the fetch's
// priority may have changed since (a fresh copy that a caller's max_age
// refused, found by the claim, makes it a low-priority refresh).
func (a *FirstAsk) fits(fr FetchRequest) bool {
	return a.scope == fr.QuotaScope && a.lowPriority == fr.LowPriority
}

// take takes a for the first attempt: the admission its answer gives,
// and whether one came (else the attempt asks now, still holding the
// scope's ask).
func (a *FirstAsk) take() (admission, bool) {
	a.taken = true
	if a.answer == nil {
		return admission{}, false
	}
	return a.p.shared.answer(*a.answer), true
}
