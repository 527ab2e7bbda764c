package enginetest

import (
	"context"
	"testing"
	"time"

	"github.com/coordd/coordd/coordinator"
)

// Poll calls cond every millisecond until it holds, and returns nil; or
// ctx's error if ctx ends first. It is how a test waits on observable
// state (a count, a status) with a deadline, instead of sleeping and
// hoping; cond must be cheap and safe to call from Poll's goroutine.
func Poll(ctx context.Context, cond func() bool) error {
	if cond() {
		return nil
	}
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			if cond() {
				return nil
			}
		}
	}
}

// Flights returns c's flights in progress (Status.Flights). It reads
// nothing from Redis: Status is given a context already canceled, so it
// shows each upstream's own guard instead of reading the shared one, and
// polling it costs no Redis command (tests that count commands poll it
// too).
func Flights(c *coordinator.Coordinator) []coordinator.FlightStatus {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return c.Status(ctx).Flights
}

// Joined reports whether n callers in all wait for the flights of key (a
// cache key, or a url called without one) on the coordinators cs, and
// whether each of those flights is past its start: leading, degraded, or
// following another instance's fetch (the follower is then subscribed to
// the leader's push). A test that holds a leader's fetch lets it land
// once Joined holds, knowing that every caller is a follower.
func Joined(key string, n int, cs ...*coordinator.Coordinator) bool {
	waiting := 0
	for _, c := range cs {
		for _, f := range Flights(c) {
			if f.Key != key && f.URL != key {
				continue
			}
			if f.Role == "starting" {
				return false
			}
			waiting += f.Waiters
		}
	}
	return waiting >= n
}

// AwaitJoined waits until Joined(key, n, cs...) holds, or ctx ends.
func AwaitJoined(ctx context.Context, key string, n int, cs ...*coordinator.Coordinator) error {
	return Poll(ctx, func() bool { return Joined(key, n, cs...) })
}

// WaitFor waits until cond holds (Poll), failing t after limit with what
// was awaited. Call it from the test's goroutine.
func WaitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	if err := Poll(ctx, cond); err != nil {
		t.Fatalf("gave up after %v waiting for %s", limit, what)
	}
}
