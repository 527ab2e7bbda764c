package coordinator

import (
	"context"
	"time"

	"github.com/coordd/coordd/internal/document"
	"github.com/coordd/coordd/internal/store"
	"github.com/coordd/coordd/internal/upstream"
)

// coordination is how a flight shares its fill with the other instances:
// the copy in L2, the fill lock, the push that wakes the followers. It has
// two implementations: inProcess (single-node mode: nothing is shared, and
// every flight leads) and shared (Redis: see shared.go, where falling back
// to in-process coordination while Redis does not answer lives).
type coordination interface {
	// claim asks for id's fill lock for ttl and reads id's copy in L2
	// and its generation in the same round trip, watching id's pushes
	// first so that none is lost: the flight then either leads under a
	// lease, or follows the instance that holds the lock. With peek, a
	// copy in L2 answers (claim.found) without the lock being asked for.
	// ask, when not nil, is the admission of the fetch the flight would
	// make: asked in the same round trip if the lock is taken, where the
	// store can (ask.Answered).
	claim(ctx context.Context, id string, ttl time.Duration, peek bool, ask *upstream.FirstAsk) claim
	// holder looks at who holds id's fill lock now, and for how long yet.
	holder(ctx context.Context, id string) (store.Holder, error)
	// landed returns the document a done push announces; cached: it
	// landed in L2 as its id's copy, rather than for followers only.
	landed(ctx context.Context, ev store.Event) (d *document.Document, enc []byte, cached bool)
	// invalidate drops id's copy from L2 and fences every fill of it in
	// flight; it reports whether L2 held it.
	invalidate(ctx context.Context, id string, genTTL time.Duration) (existed bool, err error)

	// guards is where the upstreams' guards of every instance meet; nil:
	// each instance guards its upstreams alone.
	guards() upstream.Shared
	// redisStatus is Redis as a status page shows it.
	redisStatus() RedisStatus
	// wait returns once the background work has stopped (after the
	// Coordinator's context ended).
	wait()
}

// claim is the outcome of coordination.claim: a lease to lead under, a
// holder to follow, or (peek) a copy found in L2; each with what L2 held
// as the lock was looked at.
type claim struct {
	// found: peek found a copy in L2 and the lock was not asked for.
	found bool
	// doc is id's copy in L2 (nil: none, or not shared) and enc its
	// encoding; gen is id's generation, which fences a landing against
	// Invalidate (store.UnknownGen: unknown).
	doc *document.Document
	enc []byte
	gen string

	// lease, when not nil: the flight fetches under it.
	lease lease
	// degraded: Redis did not answer, and lease coordinates this instance
	// only (err says why).
	degraded bool
	err      error
	// Otherwise, the instance holding the lock, and its pushes until
	// unwatch is called.
	holder  store.Holder
	pushes  <-chan store.Event
	unwatch func()
}

// lease is a flight's right to fetch its key, which it gives up by landing
// the document or handing off. All methods are called from the flight's
// goroutine.
type lease interface {
	// shared: the lease is (or may be) a fill lock in Redis, whose claim
	// read L2 as it was taken.
	shared() bool
	// setTrace makes the lease's pushes carry the fetch's traceparent.
	setTrace(traceparent string)
	// lands reports whether land would store anything: there is a lock
	// in Redis, or a generation (gen) to fence the write with.
	lands(gen string) bool
	// land stores the document, encoded as enc, for the other instances
	// (in L2 for ttl when cacheable), releases the lease and wakes them,
	// fenced by the lease or by gen. landed is false when the landing was
	// fenced off, or failed (err). Call it only if lands(gen).
	land(id, gen string, enc []byte, ttl time.Duration, cacheable bool) (landed bool, err error)
	// handOff releases the lease and pushes ev to the followers.
	handOff(ev store.Event)
	// stop stops keeping the lease alive; idempotent.
	stop()
}

// inProcess is single-node coordination: no L2, no lock to share, and
// every flight leads under a lease that binds nobody else. The flights of
// this instance are still one per key (join).
type inProcess struct{}

func (inProcess) claim(context.Context, string, time.Duration, bool, *upstream.FirstAsk) claim {
	return claim{lease: localLease{}, gen: store.UnknownGen}
}

func (inProcess) holder(context.Context, string) (store.Holder, error) {
	return store.Holder{}, nil
}

func (inProcess) landed(context.Context, store.Event) (*document.Document, []byte, bool) {
	return nil, nil, false
}

func (inProcess) invalidate(context.Context, string, time.Duration) (bool, error) {
	return false, nil
}

func (inProcess) guards() upstream.Shared { return nil }

func (inProcess) redisStatus() RedisStatus { return RedisStatus{Mode: "single-node"} }

func (inProcess) wait() {}

// localLease binds this instance's flight of a key only: single-node
// mode, or Redis marked down when the lock was asked for.
type localLease struct{}

func (localLease) shared() bool        { return false }
func (localLease) setTrace(string)     {}
func (localLease) handOff(store.Event) {}
func (localLease) stop()               {}

func (localLease) lands(string) bool { return false }

func (localLease) land(string, string, []byte, time.Duration, bool) (bool, error) {
	return false, nil
}
