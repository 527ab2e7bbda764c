// Package testclock holds the one settable clock coordd's tests inject as a
// Config.Now (coordinator.Config, upstream.Protection) where time matters,
// instead of sleeping. It imports only the standard library, so that any
// package's internal tests can use it without an import cycle.
package testclock

import (
	"sync"
	"time"
)

// Clock is a clock that moves only when the test moves it. It is safe for
// concurrent use: the engine reads it from its own goroutines while the
// test advances it.
type Clock struct {
	mu sync.Mutex
	t  time.Time // protected by mu
}

// New returns a Clock that reads start until moved. The monotonic reading
// is stripped (Round(0)), so that its times compare by wall time only, as
// times read back from Redis or a header do.
func New(start time.Time) *Clock { return &Clock{t: start.Round(0)} }

// Now returns the clock's time; pass the method value as a Config.Now.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d (back, if d is negative).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t.Round(0)
}
