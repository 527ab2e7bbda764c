package coordinator

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coordd/coordd/internal/document"
)

// flight is the one fill of one key in this instance. Every concurrent
// caller of the key joins it; only the flight touches Redis and the
// upstream. Callers leave when their context ends; the flight goes on and
// always finishes filling the cache.
type flight struct {
	t    Target
	seed *document.Document // usable stale copy from L1 at start, or nil
	log  *slog.Logger       // carries the key and the starting call's log attributes
	// deadlines bounds the fetch's rate-limit waits by its callers'.
	deadlines callerDeadlines
	// gen is id's generation read from Redis before the fill
	// (store.UnknownGen: unknown), which fences the landing against
	// Invalidate. Set by fill.
	gen string
	// fallback is the newest usable copy the fill has found (L1's seed,
	// or L2's): offered to callers that accept stale, answered with an
	// upstream error (stale-if-error), and revalidated by a conditional
	// fetch. Only the fill's goroutine touches it.
	fallback *Result
	tr       flightTrace // its span, when tracing (trace.go)
	// started is when join started the flight (Config.Now); waiters counts
	// the callers in wait for it. Both for Status only.
	started time.Time
	waiters atomic.Int64
	// interactive counts the callers waiting for the flight that are not
	// background (GetOptions.Background): while none is, its fetch is
	// background work (upstream.FetchRequest.Background), as is a
	// stale-while-revalidate refresh that nobody waits for.
	interactive atomic.Int64

	mu        sync.Mutex    // protects the fields below
	notBefore time.Time     // the oldest FetchedAt a cached copy may have to count as found; raised by callers' max_age
	events    []Progress    // flight-wide progress, replayed to each caller
	changed   chan struct{} // closed and replaced whenever the fields below change
	stale     *Result       // usable stale copy, served at once to callers that accept stale
	done      bool
	res       *Result // on success; or the stale copy when err != nil
	err       error
	// invalidated: an Invalidate came after the flight started; it no
	// longer offers its stale copy nor stores into L1.
	invalidated bool
	// bypass: the flight fetches although a fresh copy exists, because a
	// caller's max_age refused it; it takes only free rate-limit slots.
	bypass bool
}

func newFlight(t Target, seed *document.Document) *flight {
	return &flight{t: t, seed: seed, changed: make(chan struct{})}
}

// signalLocked wakes every caller waiting on the flight. f.mu must be held.
func (f *flight) signalLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// report records a progress event for every present and future caller.
func (f *flight) report(p Progress) {
	f.mu.Lock()
	if !f.done {
		f.events = append(f.events, p)
		f.signalLocked()
	}
	f.mu.Unlock()
}

// offerStale makes a stale copy available to callers that accept it.
func (f *flight) offerStale(r *Result) {
	f.mu.Lock()
	if !f.invalidated {
		f.stale = r
		f.signalLocked()
	}
	f.mu.Unlock()
}

// invalidate fences the flight: its stale copy is withdrawn and it stores
// nothing more into L1.
func (f *flight) invalidate() {
	f.mu.Lock()
	f.invalidated, f.stale = true, nil
	f.mu.Unlock()
}

// whileValid runs fn (an L1 store) unless the flight was invalidated,
// excluding invalidate meanwhile.
func (f *flight) whileValid(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.invalidated {
		fn()
	}
}

// background reports whether no interactive caller waits for f: it is
// upstream.FetchRequest.Background, asked when a slot is handed out.
func (f *flight) background() bool { return f.interactive.Load() == 0 }

func (f *flight) setBypass() {
	f.mu.Lock()
	f.bypass = true
	f.mu.Unlock()
}

func (f *flight) isBypass() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bypass
}

// finish records the outcome, once: the first call wins. res may be a
// stale fallback when err != nil.
func (f *flight) finish(res *Result, err error) {
	f.mu.Lock()
	if !f.done {
		f.done, f.res, f.err = true, res, err
		f.signalLocked()
	}
	f.mu.Unlock()
}

// snapshot returns what a caller needs to decide, and the channel that
// closes on the next change.
type snapshot struct {
	events []Progress
	stale  *Result
	done   bool
	res    *Result
	err    error
	next   <-chan struct{}
}

func (f *flight) snapshot(seen int) snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return snapshot{events: f.events[seen:len(f.events):len(f.events)], stale: f.stale, done: f.done, res: f.res, err: f.err, next: f.changed}
}

// require raises the oldest FetchedAt a cached copy may have for the
// flight to accept it instead of fetching. A copy the flight accepted
// before the raise may still be too old for the caller, who then joins a
// new flight.
func (f *flight) require(notBefore time.Time) {
	f.mu.Lock()
	if notBefore.After(f.notBefore) {
		f.notBefore = notBefore
	}
	f.mu.Unlock()
}

// recent reports whether d was fetched recently enough for every caller
// of the flight so far.
func (f *flight) recent(d *document.Document) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !d.FetchedAt.Before(f.notBefore)
}

// callerDeadlines tracks the latest deadline among the callers waiting on
// a flight. The flight's fetch runs under the coordinator's context, which
// has no deadline; this bound (upstream.FetchRequest.Deadline) lets it give
// up on a rate-limit slot that no caller would live to see. It is safe for concurrent use.
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
