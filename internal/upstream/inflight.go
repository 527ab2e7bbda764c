package upstream

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/coordd/coordd/internal/guardwire"
)

// Slots in flight (Protection.MaxInFlight): each attempt, once admitted by
// the guard, holds one of MaxInFlight slots of its credential scope
// (FetchRequest.QuotaScope) until its answer is read, so that no more than
// MaxInFlight requests of one scope are in progress at the upstream at
// once. The slots are shared by every instance through SharedSlots while
// Redis answers; in single-node mode, and while Redis is down, each
// instance keeps its own (localSlots), MaxInFlight of them.

// SharedSlots is the part of Shared that keeps the slots in flight of
// every instance (the store package's *store.Redis satisfies it).
// AcquireSlot waits up to a.MaxWait for a slot, woken by a release on any
// instance, and fails fast while Redis is down, when the caller falls back
// to its own slots; ReleaseSlot gives a slot back even once ctx has ended.
type SharedSlots interface {
	AcquireSlot(ctx context.Context, upstream, scope string, a SharedAcquire) (SharedSlot, error)
	ReleaseSlot(ctx context.Context, upstream, scope string, r SharedRelease) error
	// SlotsInFlight reads the live slots of each scope, for a status page.
	SlotsInFlight(ctx context.Context, upstream string, now time.Time) (SharedInFlight, error)
}

// The messages of SharedSlots (package guardwire).
type (
	// SharedAcquire asks for a slot in flight.
	SharedAcquire = guardwire.Acquire
	// SharedSlot is the answer: a slot held, or how long until one frees.
	SharedSlot = guardwire.Slot
	// SharedRelease gives a slot back.
	SharedRelease = guardwire.Release
	// SharedInFlight is the slots held, per credential scope.
	SharedInFlight = guardwire.InFlight
)

// inFlight keeps one upstream's slots in flight. It is safe for concurrent
// use.
type inFlight struct {
	name   string
	max    int
	lease  time.Duration    // Timeout + 1s, as a probe's: a dead holder's slot frees then
	shared SharedSlots      // nil in single-node mode
	clock  func() time.Time // of the shared slots; nil: Redis's
	local  *localSlots      // single-node mode, and while Redis is down
}

// newInFlight returns up's slots in flight; nil without MaxInFlight.
func newInFlight(up *Config, shared Shared, now func() time.Time) *inFlight {
	if up.Protection.MaxInFlight <= 0 {
		return nil
	}
	f := &inFlight{name: up.Name, max: up.Protection.MaxInFlight, lease: probeLease(up)}
	if shared != nil { // no typed nil in f.shared
		f.shared = shared
	}
	f.local = &localSlots{max: f.max, lease: f.lease, now: now, scopes: make(map[string]*localScope)}
	return f
}

// heldSlot is a slot in flight held by one attempt; release gives it
// back. The zero heldSlot holds nothing.
type heldSlot struct {
	f     *inFlight
	scope string
	token string // the shared slot's; "" for a local one
	local *localScope
	id    uint64 // the local slot's
	// waited: the attempt waited for the slot (others held every one)
	waited bool
}

// release gives the slot back, at once, even if ctx has ended (a holder
// cut off frees its slot); idempotent only in its effect on the slots.
func (h heldSlot) release(ctx context.Context) {
	switch {
	case h.f == nil:
	case h.token != "":
		// An error leaves the slot to its lease; the store logs and counts it.
		_ = h.f.shared.ReleaseSlot(ctx, h.f.name, h.scope, SharedRelease{Token: h.token, Max: h.f.max})
	default:
		h.f.local.release(h.scope, h.local, h.id)
	}
}

// takeSlot holds a slot in flight for an attempt that a admitted, waiting
// within the fetch's bound for one to free; p.slots nil takes nothing.
// When no slot frees in time it fails like the rate limit, with
// ErrRateLimited and the wait until the earliest slot frees; when ctx
// ends, with ErrUnavailable. Either way the admission is recorded as
// unused.
func (p *Client) takeSlot(ctx context.Context, fr FetchRequest, a admission, report func(Event)) (heldSlot, error) {
	f := p.slots
	if f == nil {
		return heldSlot{}, nil
	}
	bound := p.bound(ctx, fr)
	start, told := time.Now(), false
	waiting := func(held int, wait time.Duration) {
		if told {
			return
		}
		told = true
		report(Event{Stage: StageRateLimited, Wait: wait, Detail: fmt.Sprintf("waiting for one of %d slots in flight", f.max)})
	}
	h, wait, err := f.acquire(ctx, fr.QuotaScope, bound, waiting)
	if told {
		p.m.RateLimitWait(p.up.Name, time.Since(start))
	}
	if err == nil && h.f != nil {
		h.waited = told
		return h, nil
	}
	p.record(ctx, a, outcomeNone, 0, quotaNote{})
	if err != nil {
		return h, fmt.Errorf("%w: %s: %v", ErrUnavailable, p.up.Name, err)
	}
	p.m.RateLimitRefused(p.up.Name)
	report(Event{Stage: StageRateLimited, Wait: wait, Detail: fmt.Sprintf("none of %d slots in flight freed within the wait bound", f.max)})
	return h, WithRetryAfter(fmt.Errorf("%w: %s: all %d slots in flight taken past the %v this fetch may wait",
		ErrRateLimited, p.up.Name, f.max, bound.Round(time.Millisecond)), wait)
}

// acquire takes a slot of scope within bound: a shared one while Redis
// answers, else a local one for what is left of bound. It returns the
// slot, or no slot and how long until the earliest one frees, or ctx's
// error. waiting is called before a wait; it must bear being called twice.
func (f *inFlight) acquire(ctx context.Context, scope string, bound time.Duration, waiting func(int, time.Duration)) (heldSlot, time.Duration, error) {
	if f.shared != nil {
		start := time.Now()
		s, err := f.shared.AcquireSlot(ctx, f.name, scope, SharedAcquire{
			Now: f.clock, Max: f.max, Lease: f.lease, MaxWait: bound, Waiting: waiting,
		})
		switch {
		case ctx.Err() != nil:
			return heldSlot{}, 0, ctx.Err()
		case err == nil && s.Token != "":
			return heldSlot{f: f, scope: scope, token: s.Token}, 0, nil
		case err == nil:
			return heldSlot{}, s.Wait, nil
		}
		// Redis is down or failing: this instance's own slots, meanwhile.
		bound = max(bound-time.Since(start), 0)
	}
	return f.local.acquire(ctx, f, scope, bound, waiting)
}

// counts returns the slots held, in every scope and in the busiest one,
// and how many scopes hold one: the shared ones (ok false when there are
// none or they could not be read within ctx), and this instance's own.
func (f *inFlight) counts(ctx context.Context) (shared InFlightCount, ok bool, local InFlightCount) {
	if f.shared != nil {
		var now time.Time
		if f.clock != nil {
			now = f.clock()
		}
		if in, err := f.shared.SlotsInFlight(ctx, f.name, now); err == nil {
			shared, ok = countOf(in), true
		}
	}
	return shared, ok, countOf(f.local.held())
}

// status fills in s's MaxInFlight and InFlight, by s.Scope's count; f may
// be nil.
func (f *inFlight) status(ctx context.Context, s *Status) {
	if f == nil {
		return
	}
	s.MaxInFlight = f.max
	shared, ok, local := f.counts(ctx)
	s.InFlight = local
	if ok && s.Scope == "cluster" {
		s.InFlight = shared
	}
}

// InFlightCount is what the slots in flight of one upstream hold.
type InFlightCount struct {
	Held    int // in every credential scope together
	Busiest int // in the scope that holds most: what MaxInFlight caps
	Scopes  int // credential scopes holding one
}

func countOf(in map[string]int) InFlightCount {
	var c InFlightCount
	for _, n := range in {
		if n > 0 {
			c.Held += n
			c.Busiest = max(c.Busiest, n)
			c.Scopes++
		}
	}
	return c
}

// InFlight returns the requests in flight to the upstream: every
// instance's, as the shared slots count them (-1 in single-node mode, or
// when they could not be read within ctx), and this instance's own slots'
// (single-node mode, Redis down), each summed over credential scopes.
// Without MaxInFlight nothing is counted: 0, or -1 for shared as above.
func (p *Client) InFlight(ctx context.Context) (shared, local int) {
	shared = -1
	if p.slots == nil {
		if p.shared != nil {
			shared = 0
		}
		return shared, 0
	}
	s, ok, l := p.slots.counts(ctx)
	if ok {
		shared = s.Held
	}
	return shared, l.Held
}

// localSlots are one upstream's slots in flight kept in-process, per
// credential scope. Hand-rolled rather than x/sync/semaphore: a scope's
// entry must go once idle (callers' credentials come and go), a status
// page reads the count, and a slot whose holder never gave it back (a
// panic) frees at its lease end, as a shared one does. It is safe for
// concurrent use.
type localSlots struct {
	max   int
	lease time.Duration
	now   func() time.Time

	mu     sync.Mutex // protects scopes, and each localScope
	scopes map[string]*localScope
	next   uint64 // the last slot id given
}

// localScope is one scope's slots: each held slot's lease end, by id.
type localScope struct {
	ends    map[uint64]time.Time
	waiting int           // callers waiting for a slot
	freed   chan struct{} // closed, and replaced, when a slot is released while some wait
}

// acquire takes a slot of scope within bound, for f.
func (l *localSlots) acquire(ctx context.Context, f *inFlight, scope string, bound time.Duration, waiting func(int, time.Duration)) (heldSlot, time.Duration, error) {
	var deadline <-chan time.Time
	if bound > 0 {
		t := time.NewTimer(bound)
		defer t.Stop()
		deadline = t.C
	}
	l.mu.Lock()
	sc := l.scopes[scope]
	if sc == nil {
		sc = &localScope{ends: make(map[uint64]time.Time), freed: make(chan struct{})}
		l.scopes[scope] = sc
	}
	sc.waiting++ // keeps sc in scopes while this call runs
	defer func() {
		l.mu.Lock()
		sc.waiting--
		l.drop(scope, sc)
		l.mu.Unlock()
	}()
	for { // l.mu is held at the top of each round
		now := l.now()
		first := time.Duration(-1) // until the earliest lease ends
		for id, end := range sc.ends {
			switch left := end.Sub(now); {
			case left <= 0:
				delete(sc.ends, id) // its holder never gave it back
			case first < 0 || left < first:
				first = left
			}
		}
		if len(sc.ends) < l.max {
			l.next++
			id := l.next
			sc.ends[id] = now.Add(l.lease)
			l.mu.Unlock()
			return heldSlot{f: f, scope: scope, local: sc, id: id}, 0, nil
		}
		held, freed := len(sc.ends), sc.freed
		l.mu.Unlock()
		if deadline == nil {
			return heldSlot{}, first, nil
		}
		waiting(held, first)
		ends := time.NewTimer(first) // the backstop for a slot never given back
		select {
		case <-freed:
		case <-ends.C:
		case <-deadline:
			ends.Stop()
			return heldSlot{}, first, nil
		case <-ctx.Done():
			ends.Stop()
			return heldSlot{}, 0, ctx.Err()
		}
		ends.Stop()
		l.mu.Lock()
	}
}

// release gives back the slot id of scope, held in sc, and wakes the
// waiters.
func (l *localSlots) release(scope string, sc *localScope, id uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := sc.ends[id]; !ok {
		return // its lease ended, and another took its place
	}
	delete(sc.ends, id)
	if sc.waiting > 0 {
		close(sc.freed)
		sc.freed = make(chan struct{})
	}
	l.drop(scope, sc)
}

// drop forgets sc, scope's entry, when idle. l.mu is held.
func (l *localSlots) drop(scope string, sc *localScope) {
	if len(sc.ends) == 0 && sc.waiting == 0 && l.scopes[scope] == sc {
		delete(l.scopes, scope)
	}
}

// held counts the live slots of each scope.
func (l *localSlots) held() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	in := make(map[string]int, len(l.scopes))
	for scope, sc := range l.scopes {
		for _, end := range sc.ends {
			if end.After(now) {
				in[scope]++
			}
		}
	}
	return in
}
