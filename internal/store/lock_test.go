package store

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/coordd/coordd/internal/testing/redistest"
)

// instances are two stores on one Redis deployment, as two coordd
// instances sharing it, and a plain client of it.
type instances struct {
	a, b       *Redis
	ma, mb     *recorder
	rdb        redis.UniversalClient
	inval      chan string // ids of b's OnInvalidate calls
	drop       chan string // ids of b's OnDrop calls
	ctx        context.Context
	leaseTTL   time.Duration
	invalidTTL time.Duration
}

func startInstances(t *testing.T, be backend) *instances {
	t.Helper()
	in := &instances{inval: make(chan string, 16), drop: make(chan string, 16), leaseTTL: 10 * time.Second, invalidTTL: time.Minute}
	in.a, in.ma = startStore(t, be.client(t))
	in.b, in.mb = startStore(t, be.client(t), func(c *Config) {
		c.OnInvalidate = func(id string) { in.inval <- id }
		c.OnDrop = func(id string) { in.drop <- id }
	})
	in.rdb = be.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	in.ctx = ctx
	return in
}

// lock takes id's fill lock on s, failing the test otherwise.
func (in *instances) lock(t *testing.T, s *Redis, id string) *Lease {
	t.Helper()
	l, h, err := s.TryLock(in.ctx, id, in.leaseTTL)
	if err != nil || l == nil {
		t.Fatalf("TryLock(%s) = %v, %+v, %v; want the lock", id, l, h, err)
	}
	t.Cleanup(l.StopWatchdog)
	return l
}

// holder is who holds id's lock, read through b.
func (in *instances) holder(t *testing.T, id string) string {
	t.Helper()
	h, err := in.b.HolderOf(in.ctx, id)
	if err != nil {
		t.Fatalf("HolderOf(%s): %v", id, err)
	}
	return h.Token
}

// lapse ends the lease of id's lock at once, as if it had run out.
func (in *instances) lapse(t *testing.T, id string) {
	t.Helper()
	if err := in.rdb.Del(in.ctx, in.a.lockKey(id)).Err(); err != nil {
		t.Fatal(err)
	}
}

// gen reads id's generation through a.
func (in *instances) gen(t *testing.T, id string) string {
	t.Helper()
	_, _, gen := in.a.GetDoc(in.ctx, id)
	if gen == UnknownGen {
		t.Fatalf("GetDoc(%s): generation unknown", id)
	}
	return gen
}

// stored reports whether L2 holds id's document, read through b.
func (in *instances) stored(t *testing.T, id string) bool {
	t.Helper()
	d, _, _ := in.b.GetDoc(in.ctx, id)
	return d != nil
}

// TestLockFencing: the fill lock is taken by one instance at a time, and
// a lease acts (lands, releases) only while its token holds the lock or
// the id's generation is still the one read before the fetch; on a
// single Redis and on a Redis Cluster.
func TestLockFencing(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			in := startInstances(t, be)
			t.Run("one holder, named to the others", func(t *testing.T) {
				const id = "https://example.org/one-holder"
				if h := in.holder(t, id); h != "" {
					t.Fatalf("holder of a free lock = %q; want none", h)
				}
				l := in.lock(t, in.a, id)
				got, h, err := in.b.TryLock(in.ctx, id, in.leaseTTL)
				if err != nil || got != nil {
					t.Fatalf("second TryLock = %v, %v; want no lease", got, err)
				}
				if h.Token != l.Token() || h.Left <= 0 || h.Left > in.leaseTTL {
					t.Fatalf("holder %+v; want token %s with up to %v left", h, l.Token(), in.leaseTTL)
				}
				if h, err := in.b.HolderOf(in.ctx, id); err != nil || h.Token != l.Token() || h.Left <= 0 {
					t.Fatalf("HolderOf = %+v, %v; want token %s with time left", h, err, l.Token())
				}
				if a, b := in.ma.count("lock acquired"), in.mb.count("lock contended"); a < 1 || b < 1 {
					t.Fatalf("a acquired %d, b contended %d; want both", a, b)
				}
				l.HandOff(Event{Type: EventRelease})
				if h := in.holder(t, id); h != "" {
					t.Fatalf("holder after HandOff = %q; want none", h)
				}
				if l2 := in.lock(t, in.b, id); l2.Token() == l.Token() {
					t.Fatal("two leases share a token")
				}
			})
			t.Run("HandOff of a lapsed lease spares the next holder", func(t *testing.T) {
				const id = "https://example.org/handoff-lapsed"
				old := in.lock(t, in.a, id)
				in.lapse(t, id)
				next := in.lock(t, in.b, id)
				old.HandOff(Event{Type: EventRelease})
				if h := in.holder(t, id); h != next.Token() {
					t.Fatalf("holder = %q; want the next holder %s", h, next.Token())
				}
			})
			t.Run("Land by token", func(t *testing.T) {
				const id = "https://example.org/land-token"
				l := in.lock(t, in.a, id)
				_, enc := doc(id, "body")
				landed, err := in.a.Land(l, id, UnknownGen, enc, time.Hour, true)
				if err != nil || !landed {
					t.Fatalf("Land = %v, %v; want landed", landed, err)
				}
				d, got, gen := in.b.GetDoc(in.ctx, id)
				if d == nil || !bytes.Equal(got, enc) || gen != "" {
					t.Fatalf("GetDoc = %v, %d bytes, gen %q; want the document landed, no generation", d, len(got), gen)
				}
				if h := in.holder(t, id); h != "" {
					t.Fatalf("holder after Land = %q; want none", h)
				}
			})
			t.Run("Land by generation once the lease lapsed", func(t *testing.T) {
				const id = "https://example.org/land-gen"
				l := in.lock(t, in.a, id)
				gen := in.gen(t, id)
				in.lapse(t, id)
				next := in.lock(t, in.b, id)
				_, enc := doc(id, "body")
				if landed, err := in.a.Land(l, id, gen, enc, time.Hour, true); err != nil || !landed {
					t.Fatalf("Land = %v, %v; want landed: the generation is unchanged", landed, err)
				}
				if !in.stored(t, id) {
					t.Fatal("document not in L2")
				}
				if h := in.holder(t, id); h != next.Token() {
					t.Fatalf("holder = %q; want the next holder %s, whose lock a lapsed lease must not delete", h, next.Token())
				}
			})
			t.Run("unknown generation needs the lock", func(t *testing.T) {
				const id = "https://example.org/land-unknown-gen"
				l := in.lock(t, in.a, id)
				in.lapse(t, id)
				_, enc := doc(id, "body")
				if landed, err := in.a.Land(l, id, UnknownGen, enc, time.Hour, true); err != nil || landed {
					t.Fatalf("Land = %v, %v; want refused", landed, err)
				}
				if in.stored(t, id) {
					t.Fatal("a refused landing wrote L2")
				}
			})
			t.Run("Invalidate fences the fill in flight", func(t *testing.T) {
				const id = "https://example.org/invalidated-in-flight"
				l := in.lock(t, in.a, id)
				gen := in.gen(t, id)
				existed, err := in.b.Invalidate(in.ctx, id, in.invalidTTL)
				if err != nil || existed {
					t.Fatalf("Invalidate = %v, %v; want no document", existed, err)
				}
				if h := in.holder(t, id); h != "" {
					t.Fatalf("holder after Invalidate = %q; want none", h)
				}
				if got := in.gen(t, id); got == gen {
					t.Fatalf("generation %q unchanged by Invalidate", got)
				}
				_, enc := doc(id, "body")
				if landed, err := in.a.Land(l, id, gen, enc, time.Hour, true); err != nil || landed {
					t.Fatalf("Land = %v, %v; want refused: neither the token nor the generation holds", landed, err)
				}
				if in.stored(t, id) {
					t.Fatal("a fenced fill landed after Invalidate")
				}
			})
			t.Run("Invalidate deletes and announces", func(t *testing.T) {
				const id = "https://example.org/invalidate"
				w := in.b.Register(id)
				defer in.b.Unregister(w)
				_, enc := doc(id, "body")
				if landed, err := in.a.Land(in.lock(t, in.a, id), id, "", enc, time.Hour, true); err != nil || !landed {
					t.Fatalf("Land = %v, %v", landed, err)
				}
				nextOf(t, w, EventDone)
				for i, want := range []struct {
					existed bool
					gen     string
				}{{true, "1"}, {false, "2"}} {
					existed, err := in.a.Invalidate(in.ctx, id, in.invalidTTL)
					if err != nil || existed != want.existed {
						t.Fatalf("Invalidate %d = %v, %v; want existed %v", i, existed, err, want.existed)
					}
					if got := in.gen(t, id); got != want.gen {
						t.Fatalf("generation after Invalidate %d = %q; want %q", i, got, want.gen)
					}
					nextOf(t, w, EventInval)
					waitID(t, in.inval, id, "OnInvalidate")
				}
				if in.stored(t, id) {
					t.Fatal("document still in L2")
				}
			})
			t.Run("uncacheable landing", func(t *testing.T) {
				const id = "https://example.org/uncacheable"
				w := in.b.Register(id)
				defer in.b.Unregister(w)
				_, enc := doc(id, "old")
				if landed, err := in.a.Land(in.lock(t, in.a, id), id, "", enc, time.Hour, true); err != nil || !landed {
					t.Fatalf("Land = %v, %v", landed, err)
				}
				nextOf(t, w, EventDone) // the old copy's
				l := in.lock(t, in.a, id)
				_, enc = doc(id, "new")
				if landed, err := in.a.Land(l, id, "", enc, time.Hour, false); err != nil || !landed {
					t.Fatalf("Land = %v, %v; want landed in a result key", landed, err)
				}
				ev := nextOf(t, w, EventDone)
				if !ev.Drop || ev.Token != l.Token() || ev.Result == in.a.docKey(id) {
					t.Fatalf("done event %+v; want Drop, the lease's token, a result key", ev)
				}
				waitID(t, in.drop, id, "OnDrop")
				if in.stored(t, id) {
					t.Fatal("the old copy is still in L2")
				}
				ev.Doc = nil // read the result key, not the inline copy
				d, got, cached := in.b.Landed(in.ctx, ev)
				if d == nil || !bytes.Equal(got, enc) || cached {
					t.Fatalf("Landed = %v, %d bytes, cached %v; want the new document, uncached", d, len(got), cached)
				}
			})
			t.Run("done events carry small documents", func(t *testing.T) {
				for _, tt := range []struct {
					name   string
					size   int
					inline bool
				}{{"inline", 10, true}, {"by key", 4 << 10, false}} {
					t.Run(tt.name, func(t *testing.T) {
						id := "https://example.org/carried/" + tt.name
						w := in.b.Register(id)
						defer in.b.Unregister(w)
						_, enc := doc(id, string(bytes.Repeat([]byte("x"), tt.size)))
						if landed, err := in.a.Land(in.lock(t, in.a, id), id, "", enc, time.Hour, true); err != nil || !landed {
							t.Fatalf("Land = %v, %v", landed, err)
						}
						ev := nextOf(t, w, EventDone)
						if got := len(ev.Doc) > 0; got != tt.inline || ev.Result != in.a.docKey(id) {
							t.Fatalf("done event inline %v, result %q; want inline %v, the document's key", got, ev.Result, tt.inline)
						}
						d, got, cached := in.b.Landed(in.ctx, ev)
						if d == nil || !bytes.Equal(got, enc) || !cached {
							t.Fatalf("Landed = %v, %d bytes, cached %v; want the document, cached", d, len(got), cached)
						}
					})
				}
			})
			t.Run("HandOff announces after releasing", func(t *testing.T) {
				const id = "https://example.org/handoff"
				w := in.b.Register(id)
				defer in.b.Unregister(w)
				l := in.lock(t, in.a, id)
				l.HandOff(Event{Type: EventFail, Kind: "unavailable", Msg: "upstream down", Wait: 1500})
				ev := nextOf(t, w, EventFail)
				if ev.Key != id || ev.Token != l.Token() || ev.Kind != "unavailable" || ev.Msg != "upstream down" || ev.Wait != 1500 {
					t.Fatalf("fail event %+v; want the lease's id and token, and what failed", ev)
				}
				if h := in.holder(t, id); h != "" {
					t.Fatalf("holder after HandOff = %q; want none: a woken follower must find the lock free", h)
				}
			})
		})
	}
}

// TestWatchdogRenewsLease: while the watchdog runs, the lease outlives
// its TTL many times over; once stopped, the lock lapses with the lease
// (time is the subject here: the lapse is waited for), and another
// instance takes it.
func TestWatchdogRenewsLease(t *testing.T) {
	rs := redistest.Start(t)
	a, m := startStore(t, rs.Client(t))
	b, _ := startStore(t, rs.Client(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A renewal every ttl/3 leaves a busy machine 2/3 of it to spare.
	const id, ttl = "https://example.org/renewed", 600 * time.Millisecond
	l, _, err := a.TryLock(ctx, id, ttl)
	if err != nil || l == nil {
		t.Fatalf("TryLock = %v, %v", l, err)
	}
	defer l.StopWatchdog()
	m.waitCount(t, "extension ok", 4) // one every ttl/3: more than a TTL
	if h, err := b.HolderOf(ctx, id); err != nil || h.Token != l.Token() || h.Left <= 0 {
		t.Fatalf("HolderOf = %+v, %v; want the lease, renewed", h, err)
	}
	if n := m.count("extension lost") + m.count("extension error"); n != 0 {
		t.Fatalf("%d failed renewals; want none", n)
	}
	l.StopWatchdog()
	waitLapsed(t, b, id)
	if l2, _, err := b.TryLock(ctx, id, ttl); err != nil || l2 == nil {
		t.Fatalf("TryLock after the lapse = %v, %v; want the lock", l2, err)
	} else {
		l2.StopWatchdog()
	}
}

// waitLapsed waits until nobody holds id's lock: for a TTL to run out.
func waitLapsed(t *testing.T, r *Redis, id string) {
	t.Helper()
	for deadline := time.Now().Add(waitTimeout); ; {
		h, err := r.HolderOf(context.Background(), id)
		if err == nil && h.Token == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lock of %s still held (%+v, %v); want it lapsed", id, h, err)
		}
		time.Sleep(10 * time.Millisecond) // the TTL running out is the subject
	}
}

// TestLeaseLapsesWithoutWatchdog: a lease whose watchdog stopped lapses
// at its TTL, which the other instances see shrinking.
func TestLeaseLapsesWithoutWatchdog(t *testing.T) {
	rs := redistest.Start(t)
	a, _ := startStore(t, rs.Client(t))
	b, mb := startStore(t, rs.Client(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const id, ttl = "https://example.org/lapses", time.Second
	l, _, err := a.TryLock(ctx, id, ttl)
	if err != nil || l == nil {
		t.Fatalf("TryLock = %v, %v", l, err)
	}
	l.StopWatchdog()
	if l2, h, err := b.TryLock(ctx, id, ttl); err != nil || l2 != nil || h.Token != l.Token() || h.Left > ttl {
		t.Fatalf("TryLock = %v, %+v, %v; want a's lease with at most %v left", l2, h, err, ttl)
	}
	waitLapsed(t, b, id)
	l2, _, err := b.TryLock(ctx, id, ttl)
	if err != nil || l2 == nil {
		t.Fatalf("TryLock after the lapse = %v, %v; want the lock", l2, err)
	}
	l2.StopWatchdog()
	if got := mb.count("lock acquired"); got != 1 {
		t.Fatalf("b acquired %d times; want 1", got)
	}
}

// TestWatchdogStopsWhenLockLost: a watchdog that finds its lock gone (an
// Invalidate deleted it) counts it lost and stops by itself, and never
// renews the lock another instance took since.
func TestWatchdogStopsWhenLockLost(t *testing.T) {
	rs := redistest.Start(t)
	a, m := startStore(t, rs.Client(t))
	b, _ := startStore(t, rs.Client(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const id, ttl = "https://example.org/lost", 300 * time.Millisecond
	l, _, err := a.TryLock(ctx, id, ttl)
	if err != nil || l == nil {
		t.Fatalf("TryLock = %v, %v", l, err)
	}
	defer l.StopWatchdog()
	if _, err := b.Invalidate(ctx, id, time.Minute); err != nil {
		t.Fatal(err)
	}
	next, _, err := b.TryLock(ctx, id, time.Minute)
	if err != nil || next == nil {
		t.Fatalf("TryLock after Invalidate = %v, %v; want the lock", next, err)
	}
	next.StopWatchdog() // b's lease must last by its TTL alone
	m.waitCount(t, "extension lost", 1)
	select {
	case <-l.done:
	case <-time.After(waitTimeout):
		t.Fatal("the watchdog of a lost lock still runs")
	}
	if h, err := b.HolderOf(ctx, id); err != nil || h.Token != next.Token() || h.Left <= ttl {
		t.Fatalf("HolderOf = %+v, %v; want b's lease, with more than a's TTL left", h, err)
	}
}

// TestTryLockUncertainLease: a lock request whose reply never comes (the
// timeout ends it) may have taken the lock, so TryLock returns an
// uncertain lease with the error; its HandOff releases the lock that the
// request did take, and the followers hear it.
func TestTryLockUncertainLease(t *testing.T) {
	rs := redistest.Start(t)
	loadScripts(t, rs)
	proxy := redistest.StartProxy(t, rs.Addr())
	a, m := startStore(t, proxyClient(t, proxy))
	b, _ := startStore(t, rs.Client(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const id = "https://example.org/uncertain"
	held, release := proxy.HoldNext(lockScript.Hash(), a.lockKey(id))
	defer release()
	l, _, err := a.TryLock(ctx, id, time.Minute)
	waitFired(t, held)
	if !errors.Is(err, ErrUnavailable) || l == nil {
		t.Fatalf("TryLock = %v, %v; want an uncertain lease and ErrUnavailable", l, err)
	}
	defer l.StopWatchdog()
	if got := m.count("lock unavailable"); got != 1 {
		t.Fatalf("lock unavailable counted %d times; want 1", got)
	}
	if h, err := b.HolderOf(ctx, id); err != nil || h.Token != l.Token() {
		t.Fatalf("HolderOf = %+v, %v; want the uncertain lease's token: the request ran", h, err)
	}
	w := b.Register(id)
	defer b.Unregister(w)
	l.HandOff(Event{Type: EventRelease})
	if ev := nextOf(t, w, EventRelease); ev.Token != l.Token() {
		t.Fatalf("release event %+v; want the lease's token", ev)
	}
	if h, err := b.HolderOf(ctx, id); err != nil || h.Token != "" {
		t.Fatalf("HolderOf after HandOff = %+v, %v; want the lock free", h, err)
	}
}

// TestDownFailsFast: while Redis is marked down, request-path operations
// fail with ErrUnavailable without asking it, and TryLock returns no
// lease.
func TestDownFailsFast(t *testing.T) {
	rs := redistest.Start(t)
	up := make(health, 4)
	r, m := startStore(t, rs.Client(t), func(c *Config) { c.OnHealth = up.onHealth })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rs.Kill()
	const id = "https://example.org/down"
	// The failure of this call makes Redis suspect; the ping marks it down.
	if _, err := r.HolderOf(ctx, id); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("HolderOf = %v; want ErrUnavailable", err)
	}
	up.wait(t, false)
	if r.Healthy() || r.Downs() != 1 {
		t.Fatalf("Healthy %v, Downs %d; want down once", r.Healthy(), r.Downs())
	}
	l, h, err := r.TryLock(ctx, id, time.Minute)
	if l != nil || h.Token != "" || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("TryLock = %v, %+v, %v; want no lease and ErrUnavailable", l, h, err)
	}
	if got := m.count("lock unavailable"); got != 1 {
		t.Fatalf("lock unavailable counted %d times; want 1", got)
	}
	if d, _, gen := r.GetDoc(ctx, id); d != nil || gen != UnknownGen {
		t.Fatalf("GetDoc = %v, %q; want nothing, generation unknown", d, gen)
	}
	if _, err := r.Invalidate(ctx, id, time.Minute); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Invalidate = %v; want ErrUnavailable", err)
	}
	if _, err := r.Admit(ctx, "up", Admit{TTL: time.Minute}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Admit = %v; want ErrUnavailable", err)
	}
	rs.Restart()
	up.wait(t, true)
	if l, _, err := r.TryLock(ctx, id, time.Minute); err != nil || l == nil {
		t.Fatalf("TryLock once back = %v, %v; want the lock", l, err)
	} else {
		l.StopWatchdog()
	}
}
