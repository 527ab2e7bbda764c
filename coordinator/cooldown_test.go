package coordinator

import (
	"fmt"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/testing/testclock"
)

// TestCooldownBounded: ids cool down for Config.RefreshCooldown, expired
// ones are forgotten, and however many ids fail within one cooldown, at
// most maxCooling are kept, the newest.
func TestCooldownBounded(t *testing.T) {
	clock := testclock.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	c, err := New(Config{RefreshCooldown: 5 * time.Second, Now: clock.Now}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	c.coolDown("a")
	clock.Advance(4 * time.Second)
	if !c.coolingDown("a", clock.Now()) {
		t.Fatalf("a not cooling down 4s into a 5s cooldown")
	}
	clock.Advance(time.Second)
	if c.coolingDown("a", clock.Now()) {
		t.Fatalf("a still cooling down when its 5s cooldown ended")
	}

	const n = 3 * maxCooling
	for i := range n {
		c.coolDown(fmt.Sprint(i))
	}
	if got := coolingLen(c); got > maxCooling {
		t.Fatalf("%d ids kept after %d failed within one cooldown; want at most %d", got, n, maxCooling)
	}
	if last := fmt.Sprint(n - 1); !c.coolingDown(last, clock.Now()) {
		t.Fatalf("the newest id, %s, is not cooling down", last)
	}
	clock.Advance(5 * time.Second)
	c.coolDown("b") // forgets the expired
	if got := coolingLen(c); got != 1 {
		t.Fatalf("%d ids kept once every cooldown but b's ended; want 1", got)
	}
}

func coolingLen(c *Coordinator) int { return c.cooling.len() }
