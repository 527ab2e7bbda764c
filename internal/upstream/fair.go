package upstream

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Fair shares: when fetches wait for one upstream's slots, the slots go
// to tenants in weighted fair order, and within that order a fetch a
// caller waits for goes before background work.
//
// The guard's rate limit books slots FIFO, each as far ahead as its wait
// bound allows, so a tenant that queues a thousand cold fetches would book
// every slot within MaxWait. Instead, once the guard answers with a wait
// (contention), an instance queues its attempts locally, one fairQueue per
// (Client, QuotaScope), and books guard slots for the queue as a whole,
// only fairAhead of them ahead: the rate is kept, and the queue's order,
// not the order of asking, decides who gets each slot, when it starts.
//
// The order is self-clocked fair queuing (Golestani's SCFQ), the virtual
// finish time per tenant: each backlogged tenant's next slot carries the
// tag max(V, its last tag) + 1/weight, the smallest tag goes first (ties:
// the tenant backlogged first), and V is the tag last served. A tenant
// that goes idle keeps no credit, since its next tag starts from V, so a
// share nobody uses is lent to whoever waits. Waiters a caller waits for
// (interactive) are served before background ones (FetchRequest.Background,
// asked when a slot is handed out, so that a caller joining promotes the
// fetch), across tenants: background work only takes slots no caller
// waits for. It is hand-rolled: x/time/rate and the Kubernetes
// fairqueuing package neither book a shared limiter's slots nor hand a
// slot, when it starts, to a waiter chosen then.
//
// This is per instance. Across instances the shared GCRA interleaves the
// bookings of every instance FIFO; since each books only fairAhead slots
// ahead, an instance gets about its share of the slots while it has
// waiters, and its slots go in fair order among its own waiters.

// fairAhead is how many guard slots a queue keeps booked ahead of their
// start: enough that the rate is kept despite a Redis round trip between
// bookings, few enough that the order of the queue decides.
const fairAhead = 2

// fairBookers is how many goroutines may book a queue's slots at once
// while the guard's slots start at once (bookLocked).
const fairBookers = 4

// fairScale is the virtual time one slot costs a tenant of weight 1: the
// least common multiple of 1..16, so that tags are exact integers for the
// common weights (and within one part in 10^8 for any up to 1000).
const fairScale = 720720

// fairScheduler hands one Client's contended slots out in fair order. It
// is safe for concurrent use.
type fairScheduler struct {
	p *Client

	mu     sync.Mutex            // protects queues, asking, windows and every fairQueue's fields
	queues map[string]*fairQueue // by QuotaScope; only while contended
	// asking counts, by QuotaScope, the attempts asking the guard directly
	// (Client.admitAs): while one is, the next queues instead. Else a
	// burst of attempts, asking at once before any is told to wait, would
	// each book a slot of the upstream's rate limit, which every scope
	// shares, far ahead, rather than fairAhead of them.
	asking  map[string]int
	windows map[string]fairWindow // by QuotaScope; see window
	dropped chan struct{}         // closed and replaced whenever a queue is dropped

	// The scheduler's own goroutines (bookings, and the timers of booked
	// slots) run under ctx, the owner's (Options.Context), and are
	// counted by wg, so that close ends them and waits for them: none
	// outlives the Client or calls Redis after it is closed. closed and
	// done say close has begun; nothing starts or queues after it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed bool
	done   chan struct{}
}

func newFairScheduler(ctx context.Context, p *Client) *fairScheduler {
	ctx, cancel := context.WithCancel(ctx)
	return &fairScheduler{p: p, queues: map[string]*fairQueue{}, asking: map[string]int{}, windows: map[string]fairWindow{},
		dropped: make(chan struct{}), ctx: ctx, cancel: cancel, done: make(chan struct{})}
}

// goLocked starts f as one of the scheduler's goroutines, unless it is
// closed; it reports whether it did.
func (s *fairScheduler) goLocked(f func()) bool {
	if s.closed {
		return false
	}
	s.wg.Go(f)
	return true
}

// afterLocked runs f after d in one of the scheduler's goroutines, or not
// at all if the scheduler closes first; it reports whether it will. (Not
// time.AfterFunc, whose pending call nobody could wait for.)
func (s *fairScheduler) afterLocked(d time.Duration, f func()) bool {
	return s.goLocked(func() {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			f()
		case <-s.ctx.Done():
		}
	})
}

// close stops the scheduler: its waiters are refused, and its goroutines
// end (a booking's Redis call is canceled) and are waited for. Booked
// slots that have not started lapse: a slot of the rate limit is time,
// and no Redis command is sent to give it back.
func (s *fairScheduler) close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.cancel()
	close(s.done)
	s.mu.Unlock()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queues) > 0 {
		clear(s.queues)
		close(s.dropped)
		s.dropped = make(chan struct{})
	}
}

// waitIdle waits until no queue is left: nobody waits, and every booked
// slot has started and been handed out or given back.
func (s *fairScheduler) waitIdle() {
	for {
		s.mu.Lock()
		n, ch := len(s.queues), s.dropped
		s.mu.Unlock()
		if n == 0 {
			return
		}
		<-ch
	}
}

// fairQueue is the local queue of one contended (Client, QuotaScope).
type fairQueue struct {
	scope   string
	tenants map[string]*fairTenant // tenants with waiters
	n       int                    // waiters queued
	slots   []*fairSlot            // booked and not yet started, by start
	booking int                    // goroutines booking slots (book)
	free    bool                   // the guard's last slot started at once: up to fairBookers book
	vtime   int64                  // V: the tag last served
	seq     uint64                 // counts backlog starts, for ties
	// full is the guard's next free slot after it refused one for every
	// waiter (over limit): a waiter whose bound ends before it gets no
	// slot but a booked one.
	full time.Time
}

// fairSlot is a guard slot booked for a queue.
type fairSlot struct {
	a  admission
	at time.Time // its start, by the Client's clock
}

// fairTenant is a backlogged tenant of a queue.
type fairTenant struct {
	name   string
	weight int
	next   int64  // the tag of its next slot
	seq    uint64 // when it became backlogged
	q      []*fairWaiter
}

// cost is the virtual time one slot costs t.
func (t *fairTenant) cost() int64 { return fairScale / int64(t.weight) }

// fairWaiter is one attempt waiting in a queue.
type fairWaiter struct {
	fr       FetchRequest
	qa       quotaAsk    // the quota its slot spends
	t        *fairTenant // nil once handed a slot, or gone
	deadline time.Time   // its bound, by the Client's clock
	ready    chan admission
}

func (w *fairWaiter) background() bool { return w.fr.Background != nil && w.fr.Background() }

// fairWindow is what the guard knows of a quota window: remaining
// requests until reset.
type fairWindow struct {
	remaining int
	reset     time.Time
}

// window is the hook for learned quota pacing (its guard answers feed it;
// no quota logic lives here): the credential scope's window has remaining
// requests left until reset, by the Client's clock. While callers wait, a
// background attempt that would take the last of them is refused rather
// than queued, as one that would take the last slot within its bound is.
func (s *fairScheduler) window(scope string, remaining int, reset time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.p.now()
	for k, w := range s.windows {
		if !w.reset.After(now) {
			delete(s.windows, k)
		}
	}
	if reset.After(now) {
		s.windows[scope] = fairWindow{remaining: remaining, reset: reset}
	}
}

// tryAsk reports whether an attempt of scope may ask the guard directly:
// nobody of scope queues, and no other attempt asks. If so, it counts as
// asking until asked, or until wait takes the slot it was booked.
func (s *fairScheduler) tryAsk(scope string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.queues[scope] != nil || s.asking[scope] > 0 {
		return false
	}
	s.asking[scope]++
	return true
}

// asked ends tryAsk's ask.
func (s *fairScheduler) asked(scope string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.askedLocked(scope)
}

func (s *fairScheduler) askedLocked(scope string) {
	if s.asking[scope]--; s.asking[scope] <= 0 {
		delete(s.asking, scope)
	}
}

// wait queues an attempt of fr, bounded by bound, until the queue hands it
// a slot, and returns that slot's admission; or the admission that
// refuses it (verdictOverLimit, verdictOpen), or an error when ctx ends.
// booked, when not nil, is a slot the guard has just booked for the
// attempt with a wait, asked after tryAsk: it becomes the queue's, and
// the ask ends. report receives the wait.
func (s *fairScheduler) wait(ctx context.Context, fr FetchRequest, qa quotaAsk, bound time.Duration, booked *admission, report func(Event)) (admission, error) {
	p := s.p
	start := time.Now() // bounds are wall-clock, as Client.bound's
	s.mu.Lock()
	if s.closed {
		if booked != nil {
			s.askedLocked(fr.QuotaScope)
		}
		s.mu.Unlock()
		return admission{}, fmt.Errorf("%w: %s: closing", ErrUnavailable, p.up.Name)
	}
	now := p.now()
	q := s.queues[fr.QuotaScope]
	if q == nil {
		q = &fairQueue{scope: fr.QuotaScope, tenants: map[string]*fairTenant{}}
		s.queues[fr.QuotaScope] = q
	}
	var started []admission
	if booked != nil {
		started = s.addSlotLocked(q, *booked, now)
		s.askedLocked(fr.QuotaScope)
	}
	w := &fairWaiter{fr: fr, qa: qa, deadline: now.Add(bound), ready: make(chan admission, 1)}
	q.enqueueLocked(w)
	at, pos, interactive := s.estimateLocked(q, w, now)
	refuse := at.Sub(now) > bound
	if w.background() && interactive > 0 {
		// Background work never takes the last slot within its bound,
		// nor the last of the quota's window, while callers wait.
		refuse = refuse || at.Add(p.interval()).Sub(now) > bound
		if qw, ok := s.windows[q.scope]; ok && qw.reset.After(now) && pos+1 >= qw.remaining {
			refuse = true
		}
	}
	if refuse {
		q.removeLocked(w)
	}
	s.bookLocked(q)
	s.dropIfIdleLocked(q)
	s.mu.Unlock()
	s.handAll(q, started)
	if refuse {
		return admission{verdict: verdictOverLimit, wait: at.Sub(now)}, nil
	}

	wait := at.Sub(now)
	p.m.RateLimitWait(p.up.Name, wait)
	detail := fmt.Sprintf("waiting for a rate-limit slot: %d fetches ahead in fair order", pos)
	if booked != nil && booked.backoff >= booked.wait {
		detail = p.up.Name + " asked to back off (Retry-After)"
	}
	report(Event{Stage: StageRateLimited, Wait: wait, Detail: detail})

	// The bound may move while the attempt waits (callers join with later
	// deadlines: fr.Deadline), never past MaxWait from its start.
	ceiling := start.Add(p.up.Protection.MaxWait)
	if fr.LowPriority {
		ceiling = start.Add(bound)
	}
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		select {
		case a := <-w.ready:
			return a, nil
		case <-timer.C:
			d := time.Now().Add(p.bound(ctx, fr))
			if d.After(ceiling) {
				d = ceiling
			}
			if time.Until(d) > 0 {
				s.mu.Lock()
				w.deadline = p.now().Add(time.Until(d))
				s.mu.Unlock()
				timer.Reset(time.Until(d))
				continue
			}
			s.mu.Lock()
			left := w.t != nil
			if left {
				now := p.now()
				at, _, _ := s.estimateLocked(q, w, now)
				wait = max(at.Sub(now), p.interval())
				q.removeLocked(w)
				s.dropIfIdleLocked(q)
			}
			s.mu.Unlock()
			if left {
				return admission{verdict: verdictOverLimit, wait: wait}, nil
			}
			return <-w.ready, nil // handed its slot as its bound passed: take it
		case <-ctx.Done():
			s.leave(q, w)
			return admission{}, fmt.Errorf("%w: %s: %v", ErrUnavailable, p.up.Name, ctx.Err())
		case <-s.done:
			s.leave(q, w)
			return admission{}, fmt.Errorf("%w: %s: closing", ErrUnavailable, p.up.Name)
		}
	}
}

// leave takes w, which gives up, out of q; a slot it was handed as it
// gave up goes to the next waiter.
func (s *fairScheduler) leave(q *fairQueue, w *fairWaiter) {
	s.mu.Lock()
	left := w.t != nil
	if left {
		q.removeLocked(w)
		s.dropIfIdleLocked(q)
	}
	s.mu.Unlock()
	if !left {
		if a := <-w.ready; a.verdict == verdictAdmitted {
			s.handAll(q, []admission{a})
		}
	}
}

// interval is the time between the rate limit's slots; 0: no limit.
func (p *Client) interval() time.Duration {
	if rate := p.up.Protection.RateLimit; rate > 0 {
		return slotInterval(rate)
	}
	return 0
}

// enqueueLocked queues w behind its tenant's other waiters.
func (q *fairQueue) enqueueLocked(w *fairWaiter) {
	t := q.tenants[w.fr.Tenant]
	if t == nil {
		t = &fairTenant{name: w.fr.Tenant}
		q.tenants[t.name] = t
	}
	t.weight = max(w.fr.Weight, 1) // the latest says
	if len(t.q) == 0 {
		// No credit from idle time: the tag starts from V.
		t.next, t.seq = q.vtime+t.cost(), q.seq
		q.seq++
	}
	t.q = append(t.q, w)
	w.t = t
	q.n++
}

// removeLocked takes w, still queued, out of the queue.
func (q *fairQueue) removeLocked(w *fairWaiter) {
	t := w.t
	for i, x := range t.q {
		if x == w {
			t.q = append(t.q[:i:i], t.q[i+1:]...)
			break
		}
	}
	w.t = nil
	q.n--
	if len(t.q) == 0 {
		// Its tag is at most V + cost: forgetting it forgets no credit.
		delete(q.tenants, t.name)
	}
}

// popLocked takes the next waiter in fair order out of the queue: the
// backlogged tenant with the smallest tag among those with an interactive
// waiter, or, when none has one, among all; its first interactive waiter,
// else its first. Nil when nobody waits.
func (q *fairQueue) popLocked() *fairWaiter {
	var (
		best  *fairTenant
		bestI int
		bestB bool
	)
	for _, t := range q.tenants {
		i, bg := 0, true
		for j, w := range t.q {
			if !w.background() {
				i, bg = j, false
				break
			}
		}
		if best == nil || fairBefore(bg, t, bestB, best) {
			best, bestI, bestB = t, i, bg
		}
	}
	if best == nil {
		return nil
	}
	w := best.q[bestI]
	q.vtime = best.next
	best.next += best.cost()
	q.removeLocked(w)
	return w
}

// orderLocked returns the waiters in the order popLocked would hand them
// slots, leaving the queue as it is.
func (q *fairQueue) orderLocked() []*fairWaiter {
	type saved struct {
		t    *fairTenant
		next int64
		q    []*fairWaiter
	}
	var ss []saved
	for _, t := range q.tenants {
		ss = append(ss, saved{t, t.next, append([]*fairWaiter(nil), t.q...)})
	}
	vtime, n := q.vtime, q.n
	var order []*fairWaiter
	for w := q.popLocked(); w != nil; w = q.popLocked() {
		order = append(order, w)
	}
	q.vtime, q.n = vtime, n
	for _, s := range ss {
		s.t.next, s.t.q = s.next, s.q
		q.tenants[s.t.name] = s.t
		for _, w := range s.q {
			w.t = s.t
		}
	}
	return order
}

// fairBefore reports whether tenant t, whose next waiter is background
// when bg, goes before u (ub likewise).
func fairBefore(bg bool, t *fairTenant, ub bool, u *fairTenant) bool {
	if bg != ub {
		return !bg
	}
	if t.next != u.next {
		return t.next < u.next
	}
	return t.seq < u.seq
}

// estimateLocked returns when w's slot would start if nobody else came
// nor left (a lower bound: other instances book too), how many waiters go
// before it, and how many interactive waiters there are besides w. It
// counts in closed form: tenant u's j-th waiter of a class carries the tag
// u.next + j·cost, after u's interactive ones for the background class.
func (s *fairScheduler) estimateLocked(q *fairQueue, w *fairWaiter, now time.Time) (at time.Time, pos, interactive int) {
	type counts struct{ fg, bg, fgBefore, bgBefore int }
	c := make(map[*fairTenant]*counts, len(q.tenants))
	bg := w.background()
	for _, t := range q.tenants {
		ct := &counts{}
		for _, x := range t.q {
			xb := x.background()
			if x == w {
				ct.fgBefore, ct.bgBefore = ct.fg, ct.bg
			}
			if xb {
				ct.bg++
			} else {
				ct.fg++
			}
		}
		c[t] = ct
		interactive += ct.fg
	}
	own := c[w.t]
	tag := w.t.next + int64(own.fgBefore)*w.t.cost()
	if bg {
		tag = w.t.next + int64(own.fg+own.bgBefore)*w.t.cost()
	} else {
		interactive--
	}
	for t, ct := range c {
		n, base := ct.fg, t.next
		if bg {
			pos += ct.fg
			n, base = ct.bg, t.next+int64(ct.fg)*t.cost()
		}
		if t == w.t {
			pos += own.fgBefore
			if bg {
				pos += own.bgBefore - own.fgBefore
			}
			continue
		}
		if n == 0 || tag < base {
			continue
		}
		k := int((tag-base)/t.cost()) + 1 // waiters with a tag <= w's
		if (tag-base)%t.cost() == 0 && t.seq > w.t.seq {
			k-- // a tie goes to the tenant backlogged first
		}
		pos += min(n, k)
	}
	iv := s.p.interval()
	switch m := len(q.slots); {
	case pos < m:
		return q.slots[pos].at, pos, interactive
	case m > 0:
		at = q.slots[m-1].at.Add(time.Duration(pos-m+1) * iv)
	default:
		at = now.Add(time.Duration(pos) * iv)
	}
	if at.Before(q.full) {
		at = q.full
	}
	if at.Before(now) {
		at = now
	}
	return at, pos, interactive
}

// bookLocked starts a goroutine booking the queue's slots (book) if it
// should book another slot and needs another goroutine for it, counted
// booking: one at a time while the guard's slots start later
// (contention), up to fairBookers while they start at once. Otherwise a
// burst that only had to queue because an attempt of its scope was
// asking (tryAsk), and finds the guard free, would take its slots one
// round trip after another.
func (s *fairScheduler) bookLocked(q *fairQueue) {
	limit := 1
	if q.free {
		limit = fairBookers
	}
	if q.booking >= limit || q.n <= len(q.slots)+q.booking || len(q.slots) >= fairAhead {
		return
	}
	if s.goLocked(func() { s.book(q) }) {
		q.booking++
	}
}

// dropIfIdleLocked forgets q once nobody waits, no slot is booked and
// none is being booked: the next attempt goes straight to the guard.
func (s *fairScheduler) dropIfIdleLocked(q *fairQueue) {
	if q.n == 0 && len(q.slots) == 0 && q.booking == 0 && s.queues[q.scope] == q {
		delete(s.queues, q.scope)
		close(s.dropped)
		s.dropped = make(chan struct{})
	}
}

// addSlotLocked makes a, admitted by the guard now, a slot of q. It
// returns it to be handed out at once when it starts now.
func (s *fairScheduler) addSlotLocked(q *fairQueue, a admission, now time.Time) []admission {
	if a.wait <= 0 {
		return []admission{a}
	}
	sl := &fairSlot{a: a, at: now.Add(a.wait)}
	i := len(q.slots)
	for i > 0 && q.slots[i-1].at.After(sl.at) {
		i--
	}
	q.slots = append(q.slots[:i:i], append([]*fairSlot{sl}, q.slots[i:]...)...)
	// The wait is timed as Client.admit sleeps it: the guard's clock may
	// be Redis's, or a test's that stands still.
	s.afterLocked(a.wait, func() { s.start(q, sl) })
	return nil
}

// start hands sl, which starts now, to the next waiter.
func (s *fairScheduler) start(q *fairQueue, sl *fairSlot) {
	s.mu.Lock()
	for i, x := range q.slots {
		if x == sl {
			q.slots = append(q.slots[:i:i], q.slots[i+1:]...)
			break
		}
	}
	s.mu.Unlock()
	s.handAll(q, []admission{sl.a})
}

// handAll hands each started slot in as to the next waiter in fair order;
// a slot nobody waits for is given back to the guard unused. The queue
// books more slots if it needs them.
func (s *fairScheduler) handAll(q *fairQueue, as []admission) {
	if len(as) == 0 {
		return
	}
	var unused []admission
	s.mu.Lock()
	for _, a := range as {
		if w := q.popLocked(); w != nil {
			w.ready <- a
		} else if !s.closed { // closing, it lapses
			unused = append(unused, a)
		}
	}
	s.bookLocked(q)
	s.dropIfIdleLocked(q)
	s.mu.Unlock()
	for _, a := range unused {
		s.p.record(s.ctx, a, outcomeNone, 0, quotaNote{})
	}
}

// book books guard slots for q while it needs them (bookLocked, which
// counted it in q.booking), asking with the latest bound of its waiters. A refusal
// (over limit, breaker open) fails every waiter that no booked slot will
// serve, as the guard would have refused each of them.
func (s *fairScheduler) book(q *fairQueue) {
	p := s.p
	for {
		s.mu.Lock()
		if s.closed || q.n <= len(q.slots)+q.booking-1 || len(q.slots) >= fairAhead {
			q.booking--
			s.dropIfIdleLocked(q)
			s.mu.Unlock()
			return
		}
		now := p.now()
		var bound time.Duration
		for _, t := range q.tenants {
			for _, w := range t.q {
				bound = max(bound, w.deadline.Sub(now))
			}
		}
		var qa quotaAsk // the quota of the waiter first in fair order
		if order := q.orderLocked(); len(order) > 0 {
			qa = order[0].qa
		}
		s.mu.Unlock()

		a := p.ask(s.ctx, bound, qa)
		s.mu.Lock()
		if a.again() {
			// The quota's window is spent, and nothing was booked: book
			// again when the next one begins (still counted booking).
			if !s.afterLocked(a.wait, func() { s.book(q) }) {
				q.booking--
			}
			s.mu.Unlock()
			return
		}
		if s.closed { // its slot, if any, lapses
			q.booking--
			s.mu.Unlock()
			return
		}
		now = p.now()
		q.free = a.verdict == verdictAdmitted && a.wait <= 0
		var started []admission
		if a.verdict == verdictAdmitted {
			started = s.addSlotLocked(q, a, now)
		} else {
			if a.verdict == verdictOverLimit {
				q.full = now.Add(a.wait)
			}
			// The booked slots serve the first waiters in fair order;
			// the rest are refused, as the guard would have refused each,
			// unless the answer was not for them: an over-limit answer
			// refused the bound asked with, the latest of the waiters
			// queued then, and a waiter that joined since (or whose
			// callers' deadlines moved) and may wait past the slot
			// refused stays, for the next booking, which asks with its
			// bound. Else a tenant's waiters that give up soon would have
			// the guard refuse another tenant's that may wait long.
			order := q.orderLocked()
			late := now.Add(a.wait)
			for _, w := range order[min(len(q.slots), len(order)):] {
				if a.verdict == verdictOverLimit && w.deadline.After(late) {
					continue
				}
				q.removeLocked(w)
				w.ready <- a
			}
		}
		s.mu.Unlock()
		s.handAll(q, started)
	}
}
