package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/testing/redistest"
	"github.com/coordd/coordd/internal/testing/testclock"
)

// waitingSignal returns an Acquire.Waiting that closes the channel it
// returns on its (only) call.
func waitingSignal() (func(int, time.Duration), <-chan struct{}) {
	ch := make(chan struct{})
	var once sync.Once
	return func(int, time.Duration) { once.Do(func() { close(ch) }) }, ch
}

// waitSignal waits until ch is closed.
func waitSignal(t testing.TB, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(waitTimeout):
		t.Fatalf("no %s within %v", what, waitTimeout)
	}
}

// acquired is the outcome of an AcquireSlot run in a goroutine.
type acquired struct {
	s   Slot
	err error
}

func acquireAsync(ctx context.Context, r *Redis, upstream, scope string, a Acquire) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		s, err := r.AcquireSlot(ctx, upstream, scope, a)
		ch <- acquired{s, err}
	}()
	return ch
}

func waitAcquired(t testing.TB, ch <-chan acquired) acquired {
	t.Helper()
	select {
	case got := <-ch:
		return got
	case <-time.After(2 * waitTimeout):
		t.Fatalf("AcquireSlot did not return within %v", 2*waitTimeout)
		return acquired{}
	}
}

// TestSlotsInFlightAcrossInstances: three instances (three clients) of
// one Redis, two slots, many concurrent acquirers: never more than two
// hold a slot at once, and every one is served, whatever instance frees
// the slot it waits for. On a single Redis and on a Redis Cluster, whose
// slot events go over sharded pub/sub.
func TestSlotsInFlightAcrossInstances(t *testing.T) {
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			var fleet []*Redis
			for range 3 {
				r, _ := startStore(t, be.client(t))
				fleet = append(fleet, r)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			const max, acquirers, rounds = 2, 12, 3
			// A minute's lease and wait: only a release, over pub/sub, can
			// hand a slot on within the test.
			a := Acquire{Max: max, Lease: time.Minute, MaxWait: time.Minute}
			var held, most, served atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, acquirers)
			for i := range acquirers {
				r := fleet[i%len(fleet)]
				wg.Go(func() {
					for range rounds {
						s, err := r.AcquireSlot(ctx, "up", "", a)
						if err != nil || s.Token == "" {
							errs <- fmt.Errorf("AcquireSlot = %+v, %v; want a slot", s, err)
							return
						}
						n := held.Add(1)
						for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
						}
						served.Add(1)
						held.Add(-1)
						if err := r.ReleaseSlot(ctx, "up", "", Release{Token: s.Token, Max: max}); err != nil {
							errs <- err
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if got := most.Load(); got > max {
				t.Errorf("%d slots held at once; want at most %d", got, max)
			}
			if got := served.Load(); got != acquirers*rounds {
				t.Errorf("%d acquisitions served; want %d", got, acquirers*rounds)
			}
			if in, err := fleet[0].SlotsInFlight(ctx, "up", time.Time{}); err != nil || len(in) != 0 {
				t.Errorf("SlotsInFlight = %v, %v; want none", in, err)
			}
		})
	}
}

// TestSlotReleaseWakesWaiterElsewhere: a release on instance a wakes a
// waiter on instance b. Its lease is a minute and its wait bound half
// that: only the release's event can hand it the slot in time.
func TestSlotReleaseWakesWaiterElsewhere(t *testing.T) {
	rs := redistest.Start(t)
	a, _ := startStore(t, rs.Client(t))
	b, _ := startStore(t, rs.Client(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	acq := Acquire{Max: 1, Lease: time.Minute, MaxWait: 30 * time.Second}
	first, err := a.AcquireSlot(ctx, "up", "s/1", acq)
	if err != nil || first.Token == "" || first.Held != 1 {
		t.Fatalf("AcquireSlot = %+v, %v; want the slot", first, err)
	}
	waiting, isWaiting := waitingSignal()
	acq.Waiting = func(held int, wait time.Duration) {
		if held != 1 || wait <= 30*time.Second || wait > time.Minute {
			t.Errorf("Waiting(%d, %v); want 1 held, about a minute to wait", held, wait)
		}
		waiting(held, wait)
	}
	got := acquireAsync(ctx, b, "up", "s/1", acq)
	waitSignal(t, isWaiting, "wait for a slot")
	if err := a.ReleaseSlot(ctx, "up", "s/1", Release{Token: first.Token, Max: 1}); err != nil {
		t.Fatal(err)
	}
	r := waitAcquired(t, got)
	if r.err != nil || r.s.Token == "" {
		t.Fatalf("AcquireSlot = %+v, %v; want the slot a released", r.s, r.err)
	}
	// Released twice (a replay, a second call): nothing more changes.
	if err := a.ReleaseSlot(ctx, "up", "s/1", Release{Token: first.Token, Max: 1}); err != nil {
		t.Fatal(err)
	}
	if in, err := a.SlotsInFlight(ctx, "up", time.Time{}); err != nil || in["s/1"] != 1 || len(in) != 1 {
		t.Fatalf("SlotsInFlight = %v, %v; want b's slot alone", in, err)
	}
}

// TestSlotOfDeadHolderFrees: an instance that takes a slot and dies (its
// store stopped, its client closed) never releases it; a waiter elsewhere
// gets it when its lease ends, by its timer alone.
func TestSlotOfDeadHolderFrees(t *testing.T) {
	rs := redistest.Start(t)
	dctx, die := context.WithCancel(context.Background())
	rdb := rs.Client(t)
	dead := Start(dctx, rdb, testConfig())
	b, _ := startStore(t, rs.Client(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	acq := Acquire{Max: 1, Lease: 300 * time.Millisecond}
	s, err := dead.AcquireSlot(ctx, "up", "", acq)
	if err != nil || s.Token == "" {
		t.Fatalf("AcquireSlot = %+v, %v; want the slot", s, err)
	}
	die()
	dead.Wait()
	_ = rdb.Close()

	acq.MaxWait = 2 * waitTimeout
	waiting, isWaiting := waitingSignal()
	acq.Waiting = waiting
	got := acquireAsync(ctx, b, "up", "", acq)
	r := waitAcquired(t, got)
	if r.err != nil || r.s.Token == "" {
		t.Fatalf("AcquireSlot = %+v, %v; want the dead holder's slot", r.s, r.err)
	}
	select {
	case <-isWaiting:
	default:
		// The lease ended before b asked: nothing to wait for; the timer
		// path was not exercised, which only a very slow machine does.
		t.Log("the dead holder's lease ended before b asked")
	}
}

// TestSlotsDownFailsFast: while Redis is down AcquireSlot fails with
// ErrUnavailable, and a waiter is woken by the outage to fail so (and
// fall back), well within its wait bound.
func TestSlotsDownFailsFast(t *testing.T) {
	rs := redistest.Start(t)
	up := make(health, 4)
	r, _ := startStore(t, rs.Client(t), func(c *Config) { c.OnHealth = up.onHealth })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	acq := Acquire{Max: 1, Lease: 2 * time.Minute}
	if s, err := r.AcquireSlot(ctx, "up", "", acq); err != nil || s.Token == "" {
		t.Fatalf("AcquireSlot = %+v, %v; want the slot", s, err)
	}
	acq.MaxWait = 2 * time.Minute // the test's own timeout ends first
	waiting, isWaiting := waitingSignal()
	acq.Waiting = waiting
	got := acquireAsync(ctx, r, "up", "", acq)
	waitSignal(t, isWaiting, "wait for a slot")
	rs.Kill()
	up.wait(t, false)
	if res := waitAcquired(t, got); !errors.Is(res.err, ErrUnavailable) {
		t.Fatalf("waiting AcquireSlot = %+v, %v; want ErrUnavailable", res.s, res.err)
	}
	if _, err := r.AcquireSlot(ctx, "up", "", acq); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("AcquireSlot = %v; want ErrUnavailable", err)
	}
	if _, err := r.SlotsInFlight(ctx, "up", time.Time{}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("SlotsInFlight = %v; want ErrUnavailable", err)
	}
}

// TestSlotLeases: by a clock passed in, a lease ends when it should, an
// acquirer that finds every slot taken is told when the earliest ends,
// and SlotsInFlight counts each scope's live slots.
func TestSlotLeases(t *testing.T) {
	rs := redistest.Start(t)
	r, _ := startStore(t, rs.Client(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	clk := testclock.New(time.Unix(1_800_000_000, 0))
	acq := Acquire{Now: clk.Now, Max: 2, Lease: 10 * time.Second}
	take := func(scope string) Slot {
		t.Helper()
		s, err := r.AcquireSlot(ctx, "up", scope, acq)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if s := take("a"); s.Token == "" || s.Held != 1 {
		t.Fatalf("first: %+v; want a slot, 1 held", s)
	}
	clk.Advance(4 * time.Second)
	if s := take("a"); s.Token == "" || s.Held != 2 {
		t.Fatalf("second: %+v; want a slot, 2 held", s)
	}
	if s := take("b"); s.Token == "" || s.Held != 1 {
		t.Fatalf("other scope: %+v; want a slot of its own", s)
	}
	if s := take("a"); s.Token != "" || s.Held != 2 || s.Wait != 6*time.Second {
		t.Fatalf("third: %+v; want none, 2 held, 6s until the first lease ends", s)
	}
	if in, err := r.SlotsInFlight(ctx, "up", clk.Now()); err != nil || in["a"] != 2 || in["b"] != 1 || len(in) != 2 {
		t.Fatalf("SlotsInFlight = %v, %v; want a: 2, b: 1", in, err)
	}
	clk.Advance(6 * time.Second) // the first lease ends
	if s := take("a"); s.Token == "" || s.Held != 2 {
		t.Fatalf("after the first lease: %+v; want its slot", s)
	}
	clk.Advance(time.Hour)
	if in, err := r.SlotsInFlight(ctx, "up", clk.Now()); err != nil || len(in) != 0 {
		t.Fatalf("SlotsInFlight after every lease = %v, %v; want none", in, err)
	}
}

// TestSlotReplayAfterLostReply: go-redis replays a script whose reply
// was lost with its connection; the replay answers the first run's reply
// and changes nothing more.
func TestSlotReplayAfterLostReply(t *testing.T) {
	t.Run("acquire", func(t *testing.T) {
		fl := startReplayFleet(t)
		key := fl.a.slotKey("up", "")
		dropped := fl.proxy.DropNext(acquireSlotScript.Hash(), key)
		s, err := fl.a.AcquireSlot(fl.ctx, "up", "", Acquire{Max: 2, Lease: time.Minute})
		waitFired(t, dropped)
		if err != nil || s.Token == "" || s.Held != 1 {
			t.Fatalf("AcquireSlot = %+v, %v; want the slot the first run took", s, err)
		}
		if in, err := fl.b.SlotsInFlight(fl.ctx, "up", time.Time{}); err != nil || in[""] != 1 {
			t.Fatalf("SlotsInFlight = %v, %v; want one slot", in, err)
		}
	})
	t.Run("release", func(t *testing.T) {
		fl := startReplayFleet(t)
		acq := Acquire{Max: 1, Lease: time.Minute}
		s, err := fl.a.AcquireSlot(fl.ctx, "up", "", acq)
		if err != nil || s.Token == "" {
			t.Fatalf("AcquireSlot = %+v, %v", s, err)
		}
		key := fl.a.slotKey("up", "")
		dropped := fl.proxy.DropNext(releaseSlotScript.Hash(), key)
		if err := fl.a.ReleaseSlot(fl.ctx, "up", "", Release{Token: s.Token, Max: 1}); err != nil {
			t.Fatal(err)
		}
		waitFired(t, dropped)
		if n := fl.events.count(t, EventSlot, key); n != 1 {
			t.Fatalf("%d slot events; want 1", n)
		}
		if in, err := fl.b.SlotsInFlight(fl.ctx, "up", time.Time{}); err != nil || len(in) != 0 {
			t.Fatalf("SlotsInFlight = %v, %v; want none", in, err)
		}
	})
}

// TestSlotReleaseWakesOnlyWhenFull: a release publishes a slot event only
// when every slot was taken, when someone may wait.
func TestSlotReleaseWakesOnlyWhenFull(t *testing.T) {
	rs := redistest.Start(t)
	r, _ := startStore(t, rs.Client(t))
	events := watchEvents(t, rs, r)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	acq := Acquire{Max: 2, Lease: time.Minute}
	key := r.slotKey("up", "")
	s1, err1 := r.AcquireSlot(ctx, "up", "", acq)
	s2, err2 := r.AcquireSlot(ctx, "up", "", acq)
	if err1 != nil || err2 != nil || s1.Token == "" || s2.Token == "" {
		t.Fatalf("AcquireSlot = %+v, %v and %+v, %v; want two slots", s1, err1, s2, err2)
	}
	for i, s := range []Slot{s1, s2} {
		if err := r.ReleaseSlot(ctx, "up", "", Release{Token: s.Token, Max: 2}); err != nil {
			t.Fatal(err)
		}
		if n := events.count(t, EventSlot, key); n != 1 {
			t.Fatalf("after release %d: %d slot events; want 1 (the full set's release)", i+1, n)
		}
	}
}
