package testclock_test

import (
	"sync"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/testing/testclock"
)

func TestClock(t *testing.T) {
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	c := testclock.New(start)
	if got := c.Now(); !got.Equal(start) {
		t.Fatalf("Now() = %v; want %v", got, start)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				c.Advance(time.Millisecond)
				_ = c.Now()
			}
		})
	}
	wg.Wait()
	if got, want := c.Now(), start.Add(800*time.Millisecond); !got.Equal(want) {
		t.Errorf("after 800 advances of 1ms: Now() = %v; want %v", got, want)
	}
	later := start.Add(time.Hour)
	c.Set(later)
	if got := c.Now(); !got.Equal(later) {
		t.Errorf("after Set: Now() = %v; want %v", got, later)
	}
	c.Advance(-time.Minute)
	if got, want := c.Now(), later.Add(-time.Minute); !got.Equal(want) {
		t.Errorf("after Advance(-1m): Now() = %v; want %v", got, want)
	}
}

// TestClockStripsMonotonic: a clock started from time.Now() must not carry
// its monotonic reading, or comparisons with parsed times would differ.
func TestClockStripsMonotonic(t *testing.T) {
	now := time.Now()
	c := testclock.New(now)
	if got, want := c.Now().String(), now.Round(0).String(); got != want {
		t.Errorf("Now() = %s; want %s (no m=+ reading)", got, want)
	}
}
