package upstream

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/testing/testclock"
)

// TestQuotaPacing: the local guard and the shared one (Redis, same
// arithmetic in Lua) pace a learned quota alike, on a fake clock: what
// remains is spread until the reset, the request past it waits for the
// next window, garbage slows pacing down and never speeds it up, a
// window that ends without news is assumed full again, and background
// fetches leave the reserve to fetches a caller waits on.
func TestQuotaPacing(t *testing.T) {
	p := Protection{RateLimit: -1, Breaker: BreakerPolicy{FailureThreshold: -1, FailureRate: -1}}
	note := func(rem, limit int64, reset time.Duration) quotaNote {
		return quotaNote{key: "s/a|core", scope: "s/a", route: "repos", label: "upstream",
			q: Quota{Remaining: rem, Limit: limit, Reset: reset, Partition: "core", Source: "X-RateLimit-Remaining"}}
	}
	askFor := func(scope, partition, route string) quotaAsk {
		return quotaAsk{key: quotaKey(scope, partition), scope: scope, partition: partition, route: route}
	}
	ask := askFor("s/a", "core", "repos")
	guardKinds(t, p, func(t *testing.T, g testGuard, clk *testclock.Clock) {
		// Before any answer, nothing paces but the rate limit (none here).
		for range 3 {
			if a := g.admit(time.Minute, ask); a.verdict != verdictAdmitted || a.wait != 0 {
				t.Fatalf("before any answer: %v; want admitted at once", a)
			}
		}
		// They end without an answer (their leases end): none is still
		// in flight, uncounted, when the quota is learned.
		clk.Advance(3 * time.Second)
		// 10 left of 100 for 10s: the 10 slots spread over the window,
		// the 11th waits for the next one (its reset plus a tenth of it).
		g.record(g.admit(time.Minute, quotaAsk{}), outcomeSuccess, 0, note(10, 100, 10*time.Second))
		var last time.Duration
		for i := range 10 {
			a := g.admit(time.Minute, ask)
			if a.verdict != verdictAdmitted || a.wait < last || a.wait >= 10*time.Second {
				t.Fatalf("slot %d: %v; want admitted within the window, after slot %d (%v)", i, a, i-1, last)
			}
			last = a.wait
		}
		if last < 8*time.Second {
			t.Errorf("the 10th slot starts after %v; want the quota spread until the reset (≥ 8s)", last)
		}
		a := g.admit(time.Minute, ask)
		if a.wait < 10*time.Second+time.Second || a.paced != a.wait {
			t.Errorf("past the quota: %v (paced %v); want a wait past the reset and its margin, all of it the quota's", a, a.paced)
		}
		// Refused past the wait bound, without booking.
		if a := g.admit(5*time.Second, ask); a.verdict != verdictOverLimit {
			t.Errorf("past the quota with a 5s bound: %v; want over limit", a)
		}
		// Other scopes and partitions are not held back.
		if a := g.admit(time.Minute, askFor("s/b", "core", "repos")); a.wait != 0 {
			t.Errorf("another credential: %v; want at once", a)
		}
		if a := g.admit(time.Minute, askFor("s/a", "search", "search")); a.wait != 0 {
			t.Errorf("another partition: %v; want at once", a)
		}
	})

	guardKinds(t, p, func(t *testing.T, g testGuard, clk *testclock.Clock) {
		g.record(g.admit(time.Minute, quotaAsk{}), outcomeSuccess, 0, note(100, 1000, 100*time.Second))
		first := g.admit(time.Minute, ask) // at once; the next one a second later
		second := g.admit(time.Minute, ask)
		if first.wait != 0 || second.wait < 900*time.Millisecond || second.wait > 1100*time.Millisecond {
			t.Fatalf("100 left for 100s: %v then %v; want 0 then about 1s", first, second)
		}
		// Garbage in the same window: more remaining and an earlier reset
		// are not believed; the pacing does not speed up.
		g.record(g.admit(time.Minute, quotaAsk{}), outcomeSuccess, 0, note(1000, 1000, 10*time.Second))
		third := g.admit(time.Minute, ask)
		if third.wait < second.wait+900*time.Millisecond {
			t.Errorf("after an answer claiming more, sooner: %v after %v; want no faster than 1/s", third, second)
		}
		// Less remaining is believed at once: 5 left for the 100s.
		g.record(g.admit(time.Minute, quotaAsk{}), outcomeSuccess, 0, note(5, 1000, 100*time.Second))
		// (the next slot was booked already; the ones after it spread)
		fourth, fifth := g.admit(2*time.Minute, ask), g.admit(2*time.Minute, ask)
		if fifth.wait-fourth.wait < 15*time.Second {
			t.Errorf("5 left for 100s: %v after %v; want about 20s apart", fifth, fourth)
		}
		// The background reserve: a tenth of the limit is kept for fetches
		// a caller waits on.
		clk.Advance(3 * time.Minute) // the window ended: assumed full again
		if a := g.admit(time.Minute, ask); a.wait != 0 {
			t.Errorf("after the window: %v; want at once (the limit is back)", a)
		}
		g.record(g.admit(time.Minute, quotaAsk{}), outcomeSuccess, 0, note(100, 1000, 100*time.Second+time.Minute))
		if a := g.admit(10*time.Minute, quotaAsk{key: ask.key, scope: ask.scope, partition: ask.partition, route: ask.route, background: true}); a.verdict != verdictOverLimit || a.wait < 100*time.Second {
			t.Errorf("background with 100 of 1000 left: %v; want it refused until the next window", a)
		}
		if a := g.admit(10*time.Minute, ask); a.wait > 2*time.Second {
			t.Errorf("interactive with 100 of 1000 left: %v; want it paced, not held", a)
		}
	})
}

// quotaFake is an upstream with GitHub's primary limit: limit requests
// per window per token, the window starting at a whole second with the
// token's first request, X-RateLimit-* on every answer, a 403 past the
// limit. It counts what it served and refused, per token.
type quotaFake struct {
	limit  int
	window time.Duration

	mu      sync.Mutex
	start   map[string]time.Time
	used    map[string]int
	served  map[string]int
	refused int
	trace   []string // each request: token, its window's offset, count; logged when a test fails
}

func (f *quotaFake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tok := r.Header.Get("Authorization")
	now := time.Now()
	f.mu.Lock()
	if s, ok := f.start[tok]; !ok || !now.Before(s.Add(f.window)) {
		f.start[tok], f.used[tok] = now.Truncate(time.Second), 0
	}
	reset := f.start[tok].Add(f.window)
	f.used[tok]++
	over := f.used[tok] > f.limit
	if over {
		f.refused++
	} else {
		f.served[tok]++
	}
	rem := max(f.limit-f.used[tok], 0)
	f.trace = append(f.trace, fmt.Sprintf("%s %s +%v #%d over=%v", now.Format("15:04:05.000"), tok, now.Sub(f.start[tok]).Round(time.Millisecond), f.used[tok], over))
	f.mu.Unlock()
	h := w.Header()
	h.Set("X-RateLimit-Limit", strconv.Itoa(f.limit))
	h.Set("X-RateLimit-Remaining", strconv.Itoa(rem))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(reset.Unix(), 10))
	h.Set("X-RateLimit-Resource", "core")
	if over {
		w.WriteHeader(http.StatusForbidden)
	}
}

// TestQuotaPacedAcrossInstances: three instances sharing Redis, two
// credentials, many concurrent fetches, two windows' quota:
// the upstream refuses none, because every instance paces each
// credential by the quota the answers announce. With the quota not
// learned (learn_quota: false), the same load at the same rate limit is
// refused.
func TestQuotaPacedAcrossInstances(t *testing.T) {
	if testing.Short() {
		t.Skip("paces for seconds")
	}
	st := testStore(t)
	run := func(t *testing.T, name string, learn bool, rate, maxInFlight int) (refused int, served map[string]int) {
		var fake *quotaFake
		defer func() {
			if learn && refused != 0 {
				t.Logf("%s: the requests the fake saw:\n%s", name, strings.Join(fake.trace, "\n"))
			}
		}()
		// 5s windows: no slot starts within 500ms of a reset, which
		// covers a request that reaches the fake late on a busy machine.
		fake = &quotaFake{limit: 6, window: 5 * time.Second, start: map[string]time.Time{}, used: map[string]int{}, served: map[string]int{}}
		srv := httptest.NewServer(fake)
		defer srv.Close()
		up := Config{Name: name, BaseURL: srv.URL}
		up.Protection.RateLimit = rate
		up.Protection.MaxInFlight = maxInFlight
		up.Protection.MaxWait = time.Minute
		up.Protection.LearnQuota = &learn
		SetDefaults(&up)
		if err := Validate(&up, "upstreams[0]"); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := range 3 {
			cl := NewClient(&up, Options{Shared: st, Logger: quietLogger()})
			for j := range 4 {
				for _, tok := range []string{"alice", "bob"} {
					wg.Go(func() {
						fr := FetchRequest{URL: srv.URL + "/repos/" + strconv.Itoa(i*10+j), Scoped: true, QuotaScope: "s/" + tok, QuotaLabel: "caller",
							Header: http.Header{"Authorization": {"Bearer " + tok}}}
						if _, err := cl.Fetch(context.Background(), fr, nil); err != nil {
							t.Errorf("%s: fetch: %v", tok, err)
						}
					})
				}
			}
		}
		wg.Wait()
		fake.mu.Lock()
		defer fake.mu.Unlock()
		return fake.refused, fake.served
	}
	// A rate limit of 10/s holds before the first answer, above the two
	// quotas' 6/s.
	if refused, served := run(t, "learned", true, 10, 0); refused != 0 || served["Bearer alice"] != 12 || served["Bearer bob"] != 12 {
		t.Errorf("learned: %d refused, served %v; want none refused and 12 each (2 windows of 6)", refused, served)
	}
	if refused, _ := run(t, "fixed", false, 10, 0); refused == 0 {
		t.Errorf("fixed rate limit: none refused; want some (the test would not tell pacing from luck)")
	}
	// No rate limit, only slots in flight: the whole burst is admitted
	// before the first answer, and the attempts held up by the slots ask
	// the quota again once answers are back.
	if refused, served := run(t, "inflight", true, -1, 2); refused != 0 || served["Bearer alice"] != 12 || served["Bearer bob"] != 12 {
		t.Errorf("no rate limit, max_in_flight 2: %d refused, served %v; want none refused and 12 each", refused, served)
	}
}

// TestQuotaGaugeLabels: the partitions an upstream names become metric
// labels only while they are few and look like names; a per-user key
// (the draft's pk) or the 17th partition is "other".
func TestQuotaGaugeLabels(t *testing.T) {
	g := newQuotaGauges()
	for _, p := range []string{"", "core", "search", "graphql"} {
		if got := g.label(p); got != p {
			t.Errorf("label(%q) = %q; want it kept", p, got)
		}
	}
	for _, p := range []string{"dXNlcjE=", "a b", string(make([]byte, 33))} {
		if got := g.label(p); got != "other" {
			t.Errorf("label(%q) = %q; want other", p, got)
		}
	}
	for i := range 20 {
		g.label("p" + strconv.Itoa(i))
	}
	if got := g.label("p19"); got != "other" {
		t.Errorf("the 24th partition: %q; want other", got)
	}
	if got := g.label("core"); got != "core" {
		t.Errorf("a partition labelled before the bound: %q; want core", got)
	}
}

// TestQuotaPacingHoldsNoOtherScope: a credential's quota pacing books
// its slots ahead; the upstream's rate limit, which every credential
// shares, must not be booked that far ahead with them, or every other
// credential's request waits behind the paced ones (a heavy tenant's
// batch made a light tenant with its own credential wait 600 ms). A slot
// the quota paces books the rate limit when it starts (rateLater), so
// the rate limit stays strict for all.
func TestQuotaPacingHoldsNoOtherScope(t *testing.T) {
	p := Protection{RateLimit: 10, Burst: 1, Breaker: BreakerPolicy{FailureThreshold: -1, FailureRate: -1}}
	a := quotaAsk{key: quotaKey("s/a", "core"), scope: "s/a", partition: "core", route: "repos"}
	b := quotaAsk{key: quotaKey("s/b", "core"), scope: "s/b", partition: "core", route: "repos"}
	guardKinds(t, p, func(t *testing.T, g testGuard, clk *testclock.Clock) {
		first := g.admit(time.Minute, a)
		g.record(first, outcomeSuccess, 0, quotaNote{key: a.key, scope: a.scope, route: a.route, label: "upstream",
			q: Quota{Remaining: 10, Limit: 100, Reset: 10 * time.Second, Partition: "core", Source: "X-RateLimit-Remaining"}})
		clk.Advance(time.Second) // past the rate limit's slot
		var last admission
		for i := range 4 {
			last = g.admit(time.Minute, a)
			if last.verdict != verdictAdmitted || (i > 0 && !last.rateLater()) {
				t.Fatalf("s/a slot %d: %v (rate later %v); want admitted, paced slots booking the rate limit when they start", i, last, last.rateLater())
			}
		}
		if last.wait < 2*time.Second {
			t.Fatalf("s/a's 4th slot in %v; want the quota paced (≥ 2s)", last.wait)
		}
		if o := g.admit(time.Minute, b); o.verdict != verdictAdmitted || o.wait > slotInterval(10) {
			t.Errorf("another credential behind s/a's paced slots: %v; want at most the rate limit's interval", o)
		}
		// When a paced slot starts, it books the rate limit, strictly:
		// two at one instant are a rate-limit interval apart.
		clk.Advance(last.wait)
		r1, r2 := g.admit(time.Minute, quotaAsk{asks: askRate}), g.admit(time.Minute, quotaAsk{asks: askRate})
		if r1.verdict != verdictAdmitted || r1.rateLater() || r2.wait-r1.wait < 90*time.Millisecond {
			t.Errorf("rate limit asked as paced slots start: %v then %v; want 100ms apart", r1, r2)
		}
	})
}

// bookable books slots of ask's quota until its window is spent (at most
// 10), and returns how many it booked.
func bookable(g testGuard, ask quotaAsk) int {
	n := 0
	for ; n < 10; n++ {
		if a := g.admit(time.Minute, ask); a.again() || a.verdict != verdictAdmitted {
			break
		}
	}
	return n
}

// TestQuotaUnbookedAnswers: requests admitted before the quota was known
// book no slot. When one of them answers after the window was learned
// from another's answer, which the upstream counted before it, it is
// taken off what remains: else a request too many goes out in the window
// (seen under load in TestQuotaPacedAcrossInstances: 7 of 6).
func TestQuotaUnbookedAnswers(t *testing.T) {
	p := Protection{RateLimit: -1, Breaker: BreakerPolicy{FailureThreshold: -1, FailureRate: -1}}
	ask := quotaAsk{key: quotaKey("s/a", "core"), scope: "s/a", partition: "core", route: "repos"}
	note := func(rem int64, unbooked bool) quotaNote {
		return quotaNote{key: ask.key, scope: ask.scope, route: ask.route, label: "upstream", unbooked: unbooked,
			q: Quota{Remaining: rem, Limit: 6, Reset: 10 * time.Second, Partition: "core", Source: "X-RateLimit-Remaining"}}
	}
	guardKinds(t, p, func(t *testing.T, g testGuard, clk *testclock.Clock) {
		// Two requests go out before any answer: neither is booked.
		a1, a2 := g.admit(time.Minute, ask), g.admit(time.Minute, ask)
		if !a1.unknown || !a2.unknown {
			t.Fatalf("before any answer: %v, %v; want both unknown", a1, a2)
		}
		g.record(a1, outcomeSuccess, 0, note(5, true)) // counted first: 5 of 6 left, a2 in flight
		if b := g.admit(time.Minute, ask); b.unknown { // booked: 4 left by the guard's count
			t.Fatalf("after an answer: %v booked by the rate limit alone; want the quota", b)
		}
		g.record(a2, outcomeSuccess, 0, note(4, true)) // counted second: 4 left, b in flight
		// 3 are left: a1, a2 and b went out (b's answer is not back).
		n := bookable(g, ask)
		if n != 3 {
			t.Errorf("after 3 requests of 6: %d more slots booked in the window; want 3", n)
		}
	})
	// The window is learned while the other is still in flight: it is
	// charged at once, before the window's slots are booked (a burst
	// sent before the first answer, then paced as if it had not been).
	guardKinds(t, p, func(t *testing.T, g testGuard, clk *testclock.Clock) {
		a1, a2 := g.admit(time.Minute, ask), g.admit(time.Minute, ask)
		g.record(a1, outcomeSuccess, 0, note(5, true)) // 5 of 6 left; a2 in flight, maybe not counted
		n := bookable(g, ask)
		if n != 4 {
			t.Errorf("a1 answered, a2 in flight: %d slots booked in the window; want 4", n)
		}
		g.record(a2, outcomeSuccess, 0, note(4, true)) // charged already
		if a := g.admit(time.Minute, ask); !a.again() {
			t.Errorf("a2 answered: %v; want the window still spent", a)
		}
	})
}

// TestQuotaRoomyMargin: no slot starts within the margin of a reset
// while the quota is tight; while more than half of it remains, a call
// there goes at once: whichever window counts it has room (sparse
// callers, a light tenant's agents, waited out the margin otherwise).
func TestQuotaRoomyMargin(t *testing.T) {
	p := Protection{RateLimit: -1, Breaker: BreakerPolicy{FailureThreshold: -1, FailureRate: -1}}
	ask := quotaAsk{key: quotaKey("s/a", "core"), scope: "s/a", partition: "core", route: "repos"}
	note := func(rem int64) quotaNote {
		return quotaNote{key: ask.key, scope: ask.scope, route: ask.route, label: "upstream",
			q: Quota{Remaining: rem, Limit: 100, Reset: 10 * time.Second, Partition: "core", Source: "X-RateLimit-Remaining"}}
	}
	guardKinds(t, p, func(t *testing.T, g testGuard, clk *testclock.Clock) {
		g.record(g.admit(time.Minute, ask), outcomeSuccess, 0, note(90))
		clk.Advance(9500 * time.Millisecond) // within the margin (1s) of the reset
		for i := range 3 {
			if a := g.admit(time.Minute, ask); a.verdict != verdictAdmitted || a.again() || a.wait != 0 {
				t.Fatalf("call %d at the reset with 90 of 100 left: %v (again %v); want at once", i, a, a.again())
			}
		}
	})
	guardKinds(t, p, func(t *testing.T, g testGuard, clk *testclock.Clock) {
		g.record(g.admit(time.Minute, ask), outcomeSuccess, 0, note(10))
		clk.Advance(9500 * time.Millisecond)
		if a := g.admit(time.Minute, ask); !a.again() || a.wait < 1400*time.Millisecond {
			t.Errorf("at the reset with 10 of 100 left: %v (again %v); want it to wait for the next window", a, a.again())
		}
	})
}
