package upstream

import (
	"time"

	"github.com/coordd/coordd/internal/guardwire"
)

// The circuit breaker is hand-rolled rather than taken from gobreaker/v2:
// its state must be shared by every instance, and gobreaker's distributed
// breaker takes a Redis lock and several round trips per call, keeps no
// lease on a half-open probe (a probing instance that dies leaves the
// breaker half-open for good), and ties the number of probes to the
// successes that close it. Here the state machine below runs in-process
// (single-node mode, Redis down), and admitScript and recordScript in
// the store package (store/guard.go) run the same machine atomically in
// Redis, one round trip each.

// breakerState is a circuit breaker's state.
type breakerState int

// Breaker states.
const (
	breakerClosed   breakerState = iota // requests flow; failures are counted
	breakerOpen                         // every request fails at once
	breakerHalfOpen                     // a few probes test the upstream
)

func (s breakerState) String() string {
	switch s {
	case breakerClosed:
		return "closed"
	case breakerOpen:
		return "open"
	case breakerHalfOpen:
		return "half-open"
	}
	return "unknown"
}

// breakerBuckets is how many buckets the failure-rate window is cut in.
const breakerBuckets = guardwire.BreakerBuckets

// breaker is the in-process circuit breaker of one upstream. Each result
// carries the generation in which its attempt was admitted; a result from
// an earlier generation (an earlier state) is ignored. A half-open probe
// holds a slot under a lease, so a lost result cannot wedge the breaker.
// It is not safe for concurrent use.
type breaker struct {
	p     BreakerPolicy
	lease time.Duration // of a half-open probe slot

	state   breakerState
	gen     int64
	until   time.Time   // open: when it turns half-open
	consec  int         // closed: consecutive failures
	succ    int         // half-open: successful probes in a row
	probes  []time.Time // half-open: lease end of each probe slot; zero: free
	buckets [breakerBuckets]breakerBucket
}

type breakerBucket struct {
	idx      int64 // window-slice number the counts belong to
	requests int
	failures int
}

func newBreaker(p BreakerPolicy, lease time.Duration) *breaker {
	return &breaker{p: p, lease: lease, probes: make([]time.Time, p.HalfOpenProbes)}
}

// check says whether an attempt may go at now and, half-open, which probe
// slot it would hold (1-based; 0 when closed). open is how long the
// breaker stays open, when known. changed is true when check turned the
// breaker half-open.
func (b *breaker) check(now time.Time) (ok bool, slot int, open time.Duration, changed bool) {
	if b.state == breakerOpen {
		if now.Before(b.until) {
			return false, 0, b.until.Sub(now), false
		}
		b.state, b.succ, changed = breakerHalfOpen, 0, true
		b.gen++
		clear(b.probes)
	}
	if b.state == breakerHalfOpen {
		for i, end := range b.probes {
			if !now.Before(end) {
				return true, i + 1, 0, changed
			}
		}
		return false, 0, 0, changed
	}
	return true, 0, 0, changed
}

// take holds probe slot (from check) for an attempt that starts at start.
func (b *breaker) take(slot int, start time.Time) {
	if slot > 0 {
		b.probes[slot-1] = start.Add(b.lease)
	}
}

// record counts the outcome of an attempt admitted in generation gen, and
// reports whether the state changed.
func (b *breaker) record(now time.Time, gen int64, slot int, o outcome) (changed bool) {
	if gen != b.gen {
		return false
	}
	switch b.state {
	case breakerHalfOpen:
		if slot > 0 {
			b.probes[slot-1] = time.Time{}
		}
		switch o {
		case outcomeSuccess:
			if b.succ++; b.succ >= b.p.CloseAfter {
				b.reset(breakerClosed, time.Time{})
				return true
			}
		case outcomeFailure:
			b.reset(breakerOpen, now.Add(b.p.OpenFor))
			return true
		}
	case breakerClosed:
		if o == outcomeNone {
			return false
		}
		width := max(b.p.Window/breakerBuckets, time.Millisecond)
		idx := now.UnixNano() / int64(width)
		k := &b.buckets[uint64(idx)%breakerBuckets]
		if k.idx != idx {
			*k = breakerBucket{idx: idx}
		}
		k.requests++
		if o == outcomeFailure {
			k.failures++
			b.consec++
		} else {
			b.consec = 0
		}
		var requests, failures int
		for _, k := range b.buckets {
			if k.idx > idx-breakerBuckets && k.idx <= idx {
				requests += k.requests
				failures += k.failures
			}
		}
		if b.p.FailureThreshold > 0 && b.consec >= b.p.FailureThreshold ||
			b.p.FailureRate > 0 && requests >= b.p.MinRequests && float64(failures) >= b.p.FailureRate*float64(requests) {
			b.reset(breakerOpen, now.Add(b.p.OpenFor))
			return true
		}
	}
	return false
}

// reset enters state to in a new generation, with every count cleared.
func (b *breaker) reset(to breakerState, until time.Time) {
	b.state, b.until, b.consec, b.succ = to, until, 0, 0
	b.gen++
	clear(b.probes)
	clear(b.buckets[:])
}
