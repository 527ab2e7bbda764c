package coordinator

import (
	"testing"
	"time"
)

// TestWindowRolls: counts land in their second's bucket, each span sums
// its own seconds, and a bucket is emptied when its slot comes round
// again, windowSeconds later.
func TestWindowRolls(t *testing.T) {
	var w window
	t0 := time.Unix(1_000_000, 0)
	w.at(t0).calls.Add(1)
	w.at(t0.Add(30 * time.Second)).calls.Add(2)
	w.at(t0.Add(4 * time.Minute)).upstream.Add(1)
	now := t0.Add(4*time.Minute + 30*time.Second)
	for _, tt := range []struct {
		span           int
		calls, fetches int64
	}{{60, 0, 1}, {300, 3, 1}, {900, 3, 1}} {
		if c := w.sum(now, tt.span); c.Calls != tt.calls || c.Upstream != tt.fetches {
			t.Errorf("%ds: %+v; want %d calls, %d fetches", tt.span, c, tt.calls, tt.fetches)
		}
	}
	later := t0.Add(windowSeconds * time.Second) // t0's slot again
	w.at(later).calls.Add(5)
	if c := w.sum(later, windowSeconds); c.Calls != 7 || c.Upstream != 1 {
		t.Errorf("15 minutes on: %+v; want t0's call gone: 7 calls, 1 fetch", c)
	}
	w.at(t0).calls.Add(100) // a clock that went back counts in the newer second
	if c := w.sum(later, 1); c.Calls != 105 {
		t.Errorf("clock went back: %+v; want it counted in the newer second", c)
	}
}

// BenchmarkStatusCounting is what Status's counting adds to every Get, on
// every core at once: a bucket's counters and the tenant's.
func BenchmarkStatusCounting(b *testing.B) {
	var s statusCounters
	res := &Result{Source: SourceL1}
	now := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s.served("team-a", now, res, nil)
		}
	})
}
