package upstream

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/store"
	"github.com/coordd/coordd/internal/testing/redistest"
	"github.com/coordd/coordd/internal/testing/testclock"
)

// newTestClock returns the guard tests' clock, at a fixed instant.
func newTestClock() *testclock.Clock { return testclock.New(time.Unix(1_800_000_000, 0)) }

// testGuard is what the scenarios drive: the local guard, or the Redis one.
type testGuard interface {
	admit(maxWait time.Duration, qa quotaAsk) admission
	record(a admission, o outcome, backoff time.Duration, n quotaNote)
}

type redisTestGuard struct {
	t *testing.T
	g *sharedGuard
}

func (r redisTestGuard) admit(maxWait time.Duration, qa quotaAsk) admission {
	a, err := r.g.admit(context.Background(), maxWait, qa)
	if err != nil {
		r.t.Fatalf("admit: %v", err)
	}
	return a
}

func (r redisTestGuard) record(a admission, o outcome, backoff time.Duration, n quotaNote) {
	r.g.record(context.Background(), a, o, backoff, n)
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// testStore returns a store over a fresh redis-server.
func testStore(t testing.TB) *store.Redis {
	t.Helper()
	srv := redistest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	r := store.Start(ctx, srv.Client(t), store.Config{Prefix: "test:", Timeout: 2 * time.Second, RetryInterval: time.Second, Logger: quietLogger()})
	t.Cleanup(func() {
		cancel()
		r.Wait()
	})
	if !r.Healthy() {
		t.Fatal("the store did not come up")
	}
	return r
}

// guardKinds runs fn against the local guard and the Redis one, each built
// for p on a clock of its own, so that the two implementations of the same
// state machine are held to the same expectations.
func guardKinds(t *testing.T, p Protection, fn func(t *testing.T, g testGuard, clk *testclock.Clock)) {
	st := testStore(t)
	n := 0
	for _, kind := range []string{"local", "redis"} {
		t.Run(kind, func(t *testing.T) {
			up := &Config{Name: "up", Timeout: time.Second, Protection: p}
			up.Protection.setDefaults()
			if err := up.Protection.validate("test"); err != nil {
				t.Fatal(err)
			}
			clk := newTestClock()
			var g testGuard = newLocalGuard(up, false, clk.Now, quietLogger(), nil)
			if kind == "redis" {
				n++
				up.Name = "up" + string(rune('0'+n)) // a fresh key per run
				g = redisTestGuard{t, newSharedGuard(st, up, clk.Now, quietLogger(), nil)}
			}
			fn(t, g, clk)
		})
	}
}

func (a admission) String() string {
	return [...]string{"admitted", "open", "over limit"}[a.verdict] + " wait=" + a.wait.String()
}

func wantVerdict(t *testing.T, step string, a admission, v verdict) {
	t.Helper()
	if a.verdict != v {
		t.Fatalf("%s: got %v; want %v", step, a, admission{verdict: v})
	}
}

// noLimit turns the rate limit off, so that scenarios see only the breaker.
var noLimit = Protection{RateLimit: -1}

func TestBreakerOpensOnConsecutiveFailures(t *testing.T) {
	p := noLimit
	p.Breaker = BreakerPolicy{FailureThreshold: 3, FailureRate: -1, OpenFor: time.Second, CloseAfter: 2}
	guardKinds(t, p, func(t *testing.T, g testGuard, clk *testclock.Clock) {
		// A success resets the count: f f s f f stays closed.
		for i, o := range []outcome{outcomeFailure, outcomeFailure, outcomeSuccess, outcomeFailure, outcomeFailure} {
			a := g.admit(time.Second, quotaAsk{})
			wantVerdict(t, "closed", a, verdictAdmitted)
			g.record(a, o, 0, quotaNote{})
			_ = i
		}
		late := g.admit(time.Second, quotaAsk{}) // admitted before the breaker opens
		a := g.admit(time.Second, quotaAsk{})
		g.record(a, outcomeFailure, 0, quotaNote{}) // third in a row: opens
		a = g.admit(time.Second, quotaAsk{})
		wantVerdict(t, "after 3 failures", a, verdictOpen)
		if a.wait != time.Second {
			t.Errorf("open wait = %v; want 1s", a.wait)
		}
		// A result from before the breaker opened changes nothing.
		g.record(late, outcomeSuccess, 0, quotaNote{})
		wantVerdict(t, "after a stale result", g.admit(time.Second, quotaAsk{}), verdictOpen)

		clk.Advance(999 * time.Millisecond)
		wantVerdict(t, "just before open_for", g.admit(time.Second, quotaAsk{}), verdictOpen)
		clk.Advance(time.Millisecond)

		// Half-open: one probe at a time (the default), closing after two
		// successes in a row.
		probe := g.admit(time.Second, quotaAsk{})
		wantVerdict(t, "half-open probe", probe, verdictAdmitted)
		if probe.probe != 1 {
			t.Errorf("probe slot = %d; want 1", probe.probe)
		}
		wantVerdict(t, "second probe while the first runs", g.admit(time.Second, quotaAsk{}), verdictOpen)
		g.record(probe, outcomeSuccess, 0, quotaNote{})
		probe = g.admit(time.Second, quotaAsk{})
		wantVerdict(t, "probe after one success", probe, verdictAdmitted)
		if probe.probe != 1 {
			t.Fatalf("after one success of two: probe slot = %d; want 1 (still half-open)", probe.probe)
		}
		wantVerdict(t, "second probe while the first runs", g.admit(time.Second, quotaAsk{}), verdictOpen)
		g.record(probe, outcomeSuccess, 0, quotaNote{})
		for i := range 3 {
			a := g.admit(time.Second, quotaAsk{})
			wantVerdict(t, "closed again", a, verdictAdmitted)
			if a.probe != 0 {
				t.Errorf("closed: request %d holds probe slot %d", i, a.probe)
			}
		}
	})
}

func TestBreakerHalfOpenFailureReopens(t *testing.T) {
	p := noLimit
	p.Breaker = BreakerPolicy{FailureThreshold: 1, FailureRate: -1, OpenFor: time.Second}
	guardKinds(t, p, func(t *testing.T, g testGuard, clk *testclock.Clock) {
		g.record(g.admit(time.Second, quotaAsk{}), outcomeFailure, 0, quotaNote{})
		wantVerdict(t, "opened", g.admit(time.Second, quotaAsk{}), verdictOpen)
		clk.Advance(time.Second)
		probe := g.admit(time.Second, quotaAsk{})
		wantVerdict(t, "probe", probe, verdictAdmitted)
		g.record(probe, outcomeFailure, 0, quotaNote{})
		a := g.admit(time.Second, quotaAsk{})
		wantVerdict(t, "after a failed probe", a, verdictOpen)
		if a.wait != time.Second {
			t.Errorf("reopened for %v; want 1s", a.wait)
		}
	})
}

func TestBreakerProbeLeaseExpires(t *testing.T) {
	p := noLimit
	p.Breaker = BreakerPolicy{FailureThreshold: 1, FailureRate: -1, OpenFor: time.Second}
	guardKinds(t, p, func(t *testing.T, g testGuard, clk *testclock.Clock) {
		g.record(g.admit(time.Second, quotaAsk{}), outcomeFailure, 0, quotaNote{})
		clk.Advance(time.Second)
		lost := g.admit(time.Second, quotaAsk{}) // its instance dies: no result ever comes
		wantVerdict(t, "probe", lost, verdictAdmitted)
		wantVerdict(t, "while the probe's lease runs", g.admit(time.Second, quotaAsk{}), verdictOpen)
		clk.Advance(2 * time.Second) // the lease: timeout (1s) + 1s
		a := g.admit(time.Second, quotaAsk{})
		wantVerdict(t, "after the lease", a, verdictAdmitted)
		if a.probe == 0 {
			t.Errorf("not a probe: %+v", a)
		}
		// An attempt that said nothing (outcomeNone) frees its slot.
		g.record(a, outcomeNone, 0, quotaNote{})
		wantVerdict(t, "after an outcome-less probe", g.admit(time.Second, quotaAsk{}), verdictAdmitted)
	})
}

func TestBreakerFailureRate(t *testing.T) {
	p := noLimit
	p.Breaker = BreakerPolicy{FailureThreshold: -1, FailureRate: 0.5, MinRequests: 4, Window: time.Second, OpenFor: time.Second}
	guardKinds(t, p, func(t *testing.T, g testGuard, clk *testclock.Clock) {
		// s f s, then the window moves past them: one request in window.
		for _, o := range []outcome{outcomeSuccess, outcomeFailure, outcomeSuccess} {
			g.record(g.admit(time.Second, quotaAsk{}), o, 0, quotaNote{})
		}
		clk.Advance(1100 * time.Millisecond)
		for _, o := range []outcome{outcomeFailure, outcomeSuccess, outcomeFailure} {
			g.record(g.admit(time.Second, quotaAsk{}), o, 0, quotaNote{})
		}
		wantVerdict(t, "3 requests in window", g.admit(time.Second, quotaAsk{}), verdictAdmitted)
		g.record(g.admit(time.Second, quotaAsk{}), outcomeSuccess, 0, quotaNote{}) // 4 requests, 2 failures: 50%
		wantVerdict(t, "4 requests, half failed", g.admit(time.Second, quotaAsk{}), verdictOpen)
	})
}

func TestRateLimitReservations(t *testing.T) {
	p := Protection{RateLimit: 10, Breaker: BreakerPolicy{FailureThreshold: -1, FailureRate: -1}}
	guardKinds(t, p, func(t *testing.T, g testGuard, clk *testclock.Clock) {
		for i, want := range []time.Duration{0, 102500 * time.Microsecond, 205 * time.Millisecond} {
			a := g.admit(time.Second, quotaAsk{})
			wantVerdict(t, "slot", a, verdictAdmitted)
			if a.wait != want {
				t.Errorf("slot %d: wait %v; want %v", i, a.wait, want)
			}
		}
		// A slot past the bound is refused and not booked.
		a := g.admit(300*time.Millisecond, quotaAsk{})
		wantVerdict(t, "past the bound", a, verdictOverLimit)
		if a.wait != 307500*time.Microsecond {
			t.Errorf("refused slot: wait %v; want 307.5ms", a.wait)
		}
		if a := g.admit(time.Second, quotaAsk{}); a.wait != 307500*time.Microsecond {
			t.Errorf("after a refusal: wait %v; want 307.5ms (the refused slot was not booked)", a.wait)
		}
		// A Retry-After backoff holds every slot back until it ends, and
		// slots stay paced after it.
		clk.Advance(time.Second)
		g.record(g.admit(time.Second, quotaAsk{}), outcomeFailure, 2*time.Second, quotaNote{})
		for i, want := range []time.Duration{2 * time.Second, 2102500 * time.Microsecond} {
			a := g.admit(3*time.Second, quotaAsk{})
			if a.wait != want || a.backoff != 2*time.Second {
				t.Errorf("after backoff, slot %d: %+v; want wait %v with backoff 2s", i, a, want)
			}
		}
		// A shorter backoff does not shorten a longer one.
		g.record(g.admit(3*time.Second, quotaAsk{}), outcomeFailure, time.Second, quotaNote{})
		if a := g.admit(3*time.Second, quotaAsk{}); a.backoff != 2*time.Second {
			t.Errorf("backoff after a shorter one: %v; want 2s", a.backoff)
		}
	})
}

func TestRateLimitBurst(t *testing.T) {
	p := Protection{RateLimit: 10, Burst: 3}
	guardKinds(t, p, func(t *testing.T, g testGuard, clk *testclock.Clock) {
		var got []time.Duration
		for range 5 {
			got = append(got, g.admit(time.Second, quotaAsk{}).wait)
		}
		want := []time.Duration{0, 0, 0, 102500 * time.Microsecond, 205 * time.Millisecond}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("waits %v; want %v", got, want)
			}
		}
	})
}

func TestSlotIntervalNeverFitsAnExtraSlot(t *testing.T) {
	for _, rate := range []int{1, 3, 7, 10, 30, 33, 999, 1000, 1001} {
		if iv := slotInterval(rate); time.Duration(rate)*iv < time.Second {
			t.Errorf("rate %d: interval %v fits %d slots in 1s", rate, iv, rate+1)
		}
	}
}
