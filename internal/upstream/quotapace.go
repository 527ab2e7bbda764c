package upstream

import (
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coordd/coordd/internal/guardwire"
)

// Learned quotas. Every answer from the upstream may announce the quota
// it counted the request against (parseQuota): what remains of it and
// when it resets, per credential scope and per partition the upstream
// names (GitHub's core and search). The guard paces each such quota so
// that what remains lasts until the reset: each slot books one request of
// the quota, and the next slot starts (reset - slot) / remaining later,
// never earlier than the rate limit allows (stricter only). The shared
// guard keeps the same state in Redis, one hash per quota beside the
// upstream's guard hash (store/guard.go: admitScript and recordScript
// run the same arithmetic as quotaWindow below).
//
// What is believed, and what is not (docs/upstream-protection.md):
//   - an announcement within the window already known lowers what
//     remains, never raises it, and moves the reset only later: a stale
//     answer (sent before others that are still in flight), a second
//     client of the same token, or garbage can only slow pacing down;
//   - a reset later than the known one by more than quotaSlack starts a
//     new window at what it announces;
//   - when the known window ends without an answer from the next one,
//     the next is assumed to hold the limit for as long as the last one
//     (the longest reset seen), until an answer says otherwise;
//   - a slot past the wait bound is refused, as any rate-limit slot is:
//     a quota spent until a reset an hour away fails fetches at once with
//     that Retry-After, and never stalls them beyond max_wait.

// The invariants of pacing, each with the test that shows it (on both
// guards: guardKinds runs each against localGuard and sharedGuard, and
// FuzzQuotaGoVsLua holds the two to the same answers on random
// sequences):
//   - never over the announced quota: the slots booked in a window are at
//     most what its answer said remains, less the requests admitted
//     before it was known and still in flight; one past it waits for the
//     next window (TestQuotaPacing, TestQuotaUnbookedAnswers);
//   - a request is counted once: booked in one window, or, admitted while
//     its quota was unknown, charged to the window its answers announce
//     once, whether or not its own answer comes (TestQuotaUnbookedAnswers);
//   - at a reset: no slot starts within margin of it unless more than
//     half the limit remains (TestQuotaRoomyMargin); a spent window books
//     nothing and asks again at its edge (thenAskAgain, TestQuotaPacing);
//     a window that ends unanswered is assumed full for as long as the
//     longest reset seen (TestQuotaPacing);
//   - pacing never holds another credential: the rate limit a paced slot
//     needs is booked when the slot starts (thenAskRate,
//     TestQuotaPacingHoldsNoOtherScope).

// quotaSlack is how much later a reset must be than the known one to
// start a new window rather than restate the current one: resets in
// whole seconds (the draft's t, relative to an answer that took a while)
// jitter by up to a second.
const quotaSlack = guardwire.QuotaSlack

// backgroundReserve is the part of a window's limit that background
// fetches (FetchRequest.Background) never take: at least one request.
func backgroundReserve(limit int64) int64 { return max(1, limit/guardwire.ReserveParts) }

// quotaWindow is one learned quota, as the guard paces it. It is not safe
// for concurrent use.
type quotaWindow struct {
	known     bool      // rem and reset hold a window
	rem       int64     // requests left in the window, after the slots booked
	reset     time.Time // when the window ends
	limit     int64     // of the window; 0: not said
	win       time.Duration
	tat       time.Time // the earliest start of the next slot
	partition string    // for status: partition, source, label
	source    string
	label     string
	seen      time.Time // when the last announcement arrived
}

// margin is how far from its reset a window is taken to be uncertain: a
// tenth of it, at most quotaSlack. Resets come in whole seconds, and a
// request reaches the upstream a while after its slot starts (later still
// on a busy machine), so a slot within margin of the reset may be counted
// in either window: none starts there.
func (w *quotaWindow) margin() time.Duration {
	return min(quotaSlack, w.win/guardwire.QuotaMarginParts)
}

// edge is when w's next window is sure to have begun; last, when its own
// last slot may start.
func (w *quotaWindow) edge() time.Time { return w.reset.Add(w.margin()) }
func (w *quotaWindow) last() time.Time { return w.reset.Add(-w.margin()) }

// roll moves w past a window that ended by at: to the next one, assumed
// to hold the limit for the window's length, or to unknown.
func (w *quotaWindow) roll(at time.Time) {
	if !w.known || w.edge().After(at) {
		return
	}
	if w.limit <= 0 || w.win <= 0 {
		w.known = false
		return
	}
	n := int64(at.Sub(w.reset)/w.win) + 1
	w.reset = w.reset.Add(time.Duration(n) * w.win)
	w.rem = w.limit
}

// earliest is the earliest start the quota allows a slot asked at now:
// now when nothing is known; else the pacing's next slot, with burst-1
// slots of headroom. When the window is spent, again is true and at is
// the window's edge: the attempt books nothing, waits for the edge and
// asks again, so that no slot is booked in a window that no answer has
// announced yet (its length and start are guesses until one does). held
// is true for a background fetch when what remains is the reserve
// (backgroundReserve): it must not book a slot at all.
func (w *quotaWindow) earliest(now time.Time, burst int, background bool) (at time.Time, again, held bool) {
	w.roll(now)
	if !w.known {
		return now, false, false
	}
	if background && w.rem <= backgroundReserve(w.limit) {
		return w.edge(), false, true
	}
	if w.rem <= 0 {
		return w.edge(), true, false
	}
	at = w.tat.Add(-time.Duration(burst-1) * w.interval(now))
	if at.Before(now) {
		at = now
	}
	if !at.Before(w.last()) {
		if w.roomy() {
			return now, false, false
		}
		return w.edge(), true, false
	}
	return at, false, false
}

// roomy reports whether more than half of the window's limit remains:
// then a slot may start within margin of the reset, since whichever
// window the upstream counts it in has room for it, and its answer says
// which before the fleet could spend the next one. A quota that sparse
// callers spend would otherwise make a fifth of their calls wait out the
// margin on both sides of every reset.
func (w *quotaWindow) roomy() bool { return w.limit > 0 && 2*w.rem > w.limit }

// interval is the pacing at now: the time left for slots in the window
// over what remains of it.
func (w *quotaWindow) interval(now time.Time) time.Duration {
	return max(w.last().Sub(now), 0) / time.Duration(max(w.rem, 1))
}

// book takes one request of the quota for a slot starting at at: the
// next slot is what is left of the window over what remained, later.
func (w *quotaWindow) book(at time.Time) {
	w.roll(at)
	if !w.known {
		return
	}
	next := at
	if w.tat.After(at) {
		next = w.tat
	}
	next = next.Add(w.interval(at))
	w.rem--
	if w.rem <= 0 {
		w.rem, w.tat = 0, w.edge()
		return
	}
	w.tat = next
}

// unbookedCount counts a credential scope's requests admitted before
// their quota was known, so booked in no window, and not answered yet
// (quotaNote.unbooked). A window first learned from one answer is taken
// not to have counted the others still in flight: they are charged to it
// at once, rather than when they answer, since by then the window's slots
// may all be booked (a burst sent before the first answer, then paced as
// if it had not been sent: a request too many in the window). An
// unbooked answer that finds no charge left is taken off what remains.
// Charged or not, each unbooked request counts once in the window. The
// shared guard keeps the same counts in the scope's hash (unb, chg, and
// unbx, when the last one's lease ends: past it, none is in flight).
type unbookedCount struct {
	n, charged int64
	until      time.Time // the last admission's lease end
}

// learn takes in the quota q that an answer arriving at now announced;
// unbooked: to a request booked in no window, already taken off c.n.
func (w *quotaWindow) learn(now time.Time, q Quota, c *unbookedCount, unbooked bool) {
	reset := now.Add(q.Reset)
	w.roll(now)
	if !w.known || reset.After(w.reset.Add(quotaSlack)) {
		w.known, w.rem, w.reset = true, max(q.Remaining-c.n, 0), reset
		c.charged = c.n
	} else {
		if unbooked {
			if c.charged > 0 {
				c.charged--
			} else {
				w.rem = max(w.rem-1, 0)
			}
		}
		c.charged = min(c.charged, c.n)
		w.rem = min(w.rem, q.Remaining)
		if reset.After(w.reset) {
			w.reset = reset
		}
	}
	if q.Limit > 0 {
		w.limit = q.Limit
	}
	w.win = max(w.win, q.Reset)
	w.partition, w.source, w.seen = q.Partition, q.Source, now
	if w.rem == 0 && w.tat.Before(w.edge()) {
		w.tat = w.edge()
	}
}

// quotaKey names one learned quota of an upstream: the credential scope
// and the partition, "scope|partition".
func quotaKey(scope, partition string) string { return scope + "|" + partition }

// partitions maps the routes of an upstream (the first path segment
// under its base url) to the quota partition their answers name, per
// credential scope, so that a request is paced by its partition's quota
// before its answer says which it is. Unknown routes are the default
// partition's. Per scope, as the shared guard keeps it (the route|ROUTE
// fields of a scope's quota hash): a partition may name the credential
// (the draft's pk), and one scope's answers never route another's
// requests. It is safe for concurrent use.
type partitions struct {
	base string   // the upstream's base path, with a trailing slash
	m    sync.Map // scopeRoute → partition
	n    atomic.Int32
}

// scopeRoute is a route of one credential scope.
type scopeRoute struct{ scope, route string }

// maxRoutes bounds the routes remembered, over every scope: callers
// choose urls, and a route past the bound is paced by the default
// partition.
const maxRoutes = 4096

func newPartitions(baseURL string) *partitions {
	p := &partitions{base: "/"}
	if u, err := url.Parse(baseURL); err == nil {
		p.base = strings.TrimSuffix(u.Path, "/") + "/"
	}
	return p
}

// route is u's first path segment under the base path.
func (p *partitions) route(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return ""
	}
	rest := strings.TrimPrefix(u.Path, p.base)
	r, _, _ := strings.Cut(rest, "/")
	return r
}

// of is the partition scope's requests of route were last answered under.
func (p *partitions) of(scope, route string) string {
	if v, ok := p.m.Load(scopeRoute{scope, route}); ok {
		return v.(string)
	}
	return ""
}

// learn records that scope's requests of route are counted in partition.
func (p *partitions) learn(scope, route, partition string) {
	k := scopeRoute{scope, route}
	v, ok := p.m.Load(k)
	switch {
	case ok && v.(string) != partition:
		p.m.Store(k, partition)
	case !ok && partition != "" && p.n.Add(1) <= maxRoutes:
		p.m.Store(k, partition)
	}
}

// quotaGauges keeps the quota each credential scope's answers last
// announced, per partition, so that the metrics can show a partition's
// total over every credential (never one credential's). It is safe for
// concurrent use.
type quotaGauges struct {
	mu     sync.Mutex
	m      map[string]gauge    // by quotaKey
	labels map[string]struct{} // partitions given a metric label of their own
}

// maxPartitionLabels bounds the partitions of one upstream that get a
// metric label of their own: the upstream names them (the draft's pk may
// be per user), and a metric's labels must stay few.
const maxPartitionLabels = 16

type gauge struct {
	partition   string
	rem, limit  int64
	reset, seen time.Time
}

func newQuotaGauges() *quotaGauges {
	return &quotaGauges{m: map[string]gauge{}, labels: map[string]struct{}{}}
}

// label is partition's metric label: itself if it is a short name of
// letters, digits, '_', '.' or '-' among the first maxPartitionLabels
// seen, else "other".
func (g *quotaGauges) label(partition string) string {
	if len(partition) > 32 || strings.Trim(partition, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") != "" {
		return "other"
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.labels[partition]; !ok {
		if len(g.labels) >= maxPartitionLabels {
			return "other"
		}
		g.labels[partition] = struct{}{}
	}
	return partition
}

// set records q for key, announced at now, and returns the partition's
// remaining and limit summed over the credentials whose window has not
// reset.
// clear forgets every quota seen.
func (g *quotaGauges) clear() {
	g.mu.Lock()
	defer g.mu.Unlock()
	clear(g.m)
}

func (g *quotaGauges) set(key string, q Quota, now time.Time) (rem, limit int64, reset time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.m[key]; ok || len(g.m) < maxQuotas {
		g.m[key] = gauge{partition: q.Partition, rem: q.Remaining, limit: q.Limit, reset: now.Add(q.Reset), seen: now}
	}
	for k, e := range g.m {
		switch {
		case now.After(e.reset) && now.Sub(e.seen) > time.Hour:
			delete(g.m, k)
		case e.partition == q.Partition && !now.After(e.reset):
			rem += e.rem
			limit += e.limit
			if e.reset.After(reset) {
				reset = e.reset
			}
		}
	}
	return rem, limit, reset
}
