package upstream

import "time"

// The rate limit is GCRA (the generic cell rate algorithm) with
// reservations: an attempt over the limit is given the start time of the
// next free slot and waits for it, so waiters are served in the order they
// asked, each at most MaxWait, and none polls. The shared limiter is the
// Lua in the store package (store/guard.go). It is hand-rolled rather
// than go-redis/redis_rate: redis_rate only answers "allowed, or retry after d" without reserving,
// so waiters would poll Redis and race for each freed slot (unfair, and a
// herd on Redis), and it could not also hold slots back until a shared
// Retry-After ends, nor check the breaker, in the same atomic script. The
// in-process limiter below is the same algorithm, for the same reason
// instead of golang.org/x/time/rate, whose reservations cannot be made to
// start after a backoff without bunching the waiters at its end.

// gcra is the in-process rate limiter of one upstream, with the backoff the
// upstream asked for as a floor under every slot. It is not safe for
// concurrent use.
type gcra struct {
	interval time.Duration // between slots; 0: no limit
	tau      time.Duration // how far ahead of the schedule a slot may be: (burst-1)·interval

	tat     time.Time // theoretical arrival time of the next request
	backoff time.Time // no slot before then
}

// newGCRA returns a limiter of rate requests per second, burst back to
// back; rate <= 0: no limit (the backoff still holds).
func newGCRA(rate, burst int) *gcra {
	g := &gcra{}
	if rate > 0 {
		g.interval = slotInterval(rate)
		g.tau = time.Duration(burst-1) * g.interval
	}
	return g
}

// reserve books the next slot, starting no earlier than floor (a learned
// quota's pacing; zero: none), if it starts within maxWait of now. wait is
// how long until it starts (also when refused); backoff is how much of it
// is the upstream's backoff.
func (g *gcra) reserve(now, floor time.Time, maxWait time.Duration) (wait, backoff time.Duration, ok bool) {
	at := now
	if floor.After(at) {
		at = floor
	}
	if g.backoff.After(at) {
		at = g.backoff
	}
	if g.interval > 0 {
		if t := g.tat.Add(-g.tau); t.After(at) {
			at = t
		}
	}
	wait, backoff = at.Sub(now), max(g.backoff.Sub(now), 0)
	if wait > maxWait {
		return wait, backoff, false
	}
	if g.interval > 0 {
		if at.After(g.tat) {
			g.tat = at
		}
		g.tat = g.tat.Add(g.interval)
	}
	return wait, backoff, true
}

// hold is reserve for a slot a learned quota paces (admission.rateLater()):
// it starts no earlier than floor and the backoff, and books nothing; the
// slot books the rate limit when it starts.
func (g *gcra) hold(now, floor time.Time, maxWait time.Duration) (wait, backoff time.Duration, ok bool) {
	at := floor
	if g.backoff.After(at) {
		at = g.backoff
	}
	wait, backoff = max(at.Sub(now), 0), max(g.backoff.Sub(now), 0)
	return wait, backoff, wait <= maxWait
}

// backOff holds every slot until d from now, unless a later backoff holds.
func (g *gcra) backOff(now time.Time, d time.Duration) {
	if t := now.Add(d); t.After(g.backoff) {
		g.backoff = t
	}
}

// slotMargin widens the second that rate slots are spread over, so that
// jitter between a slot's start and the request's arrival upstream (a
// goroutine scheduled late, a new connection) does not put rate+1 arrivals
// in one second of the upstream's clock.
const slotMargin = 25 * time.Millisecond

// slotInterval is the time between slots at rate per second: (1s +
// slotMargin)/rate, rounded up to the microsecond.
func slotInterval(rate int) time.Duration {
	us := (int64((time.Second+slotMargin)/time.Microsecond) + int64(rate) - 1) / int64(rate)
	return time.Duration(us) * time.Microsecond
}
