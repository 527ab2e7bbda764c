package coordinator

import (
	"context"
	"time"

	"github.com/coordd/coordd/internal/document"
	"github.com/coordd/coordd/internal/store"
	"github.com/coordd/coordd/internal/upstream"
)

// shared coordinates the flights of every instance through Redis. While
// Redis does not answer, a claim falls back to this instance alone: it
// gets a lease whose landing is still fenced by the generation read
// before, and still wakes whoever waits on its token, so that nothing a
// follower is owed is lost when Redis comes back.
type shared struct{ r *store.Redis }

func (s shared) claim(ctx context.Context, id string, ttl time.Duration, peek bool, ask *upstream.FirstAsk) claim {
	w := s.r.Register(id)
	var aa *store.AdmitAsk
	if ask != nil {
		aa = &store.AdmitAsk{Upstream: ask.Upstream, Admit: ask.Admit}
	}
	c := s.r.ClaimAdmitting(ctx, id, ttl, peek, aa)
	if c.Admission != nil {
		ask.Answered(*c.Admission)
	}
	cl := claim{found: c.Found, doc: c.Doc, enc: c.Enc, gen: c.Gen}
	switch {
	case c.Err != nil:
		// Fail open: this flight is the only fetch in this instance. When
		// Redis did not answer, c.Lease is the lease we may hold (nil when
		// Redis was marked down and not asked): its token still lands and
		// wakes whoever waits on it.
		s.r.Unregister(w)
		cl.lease, cl.degraded, cl.err = remoteLease{r: s.r, l: c.Lease}, true, c.Err
	case c.Found:
		s.r.Unregister(w)
	case c.Lease != nil:
		s.r.Unregister(w)
		cl.lease = remoteLease{r: s.r, l: c.Lease}
	default:
		cl.holder, cl.pushes, cl.unwatch = c.Holder, w.Events(), func() { s.r.Unregister(w) }
	}
	return cl
}

func (s shared) holder(ctx context.Context, id string) (store.Holder, error) {
	return s.r.HolderOf(ctx, id)
}

func (s shared) landed(ctx context.Context, ev store.Event) (*document.Document, []byte, bool) {
	return s.r.Landed(ctx, ev)
}

func (s shared) invalidate(ctx context.Context, id string, genTTL time.Duration) (bool, error) {
	return s.r.Invalidate(ctx, id, genTTL)
}

func (s shared) guards() upstream.Shared { return s.r }

func (s shared) redisStatus() RedisStatus {
	return RedisStatus{Mode: s.r.Mode(), Healthy: s.r.Healthy(), Downs: s.r.Downs()}
}

func (s shared) wait() { s.r.Wait() }

// remoteLease is a fill lock in Redis that this instance holds or may hold
// (the reply to the lock request was lost), or, with l nil, no lock at all
// because Redis was marked down when the flight asked: then it lands
// fenced by the generation alone, and has nobody to hand off to.
type remoteLease struct {
	r *store.Redis
	l *store.Lease // nil: Redis was not asked
}

func (rl remoteLease) shared() bool { return rl.l != nil }

func (rl remoteLease) setTrace(traceparent string) {
	if rl.l != nil {
		rl.l.SetTrace(traceparent)
	}
}

func (rl remoteLease) lands(gen string) bool { return rl.l != nil || gen != store.UnknownGen }

func (rl remoteLease) land(id, gen string, enc []byte, ttl time.Duration, cacheable bool) (bool, error) {
	return rl.r.Land(rl.l, id, gen, enc, ttl, cacheable)
}

func (rl remoteLease) handOff(ev store.Event) {
	if rl.l != nil {
		rl.l.HandOff(ev)
	}
}

func (rl remoteLease) stop() {
	if rl.l != nil {
		rl.l.StopWatchdog()
	}
}
