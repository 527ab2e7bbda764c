package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/testing/enginetest"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/redistest"
	"github.com/coordd/coordd/internal/testing/storetest"
)

// ownGoroutines returns the stacks of the goroutines the engine owns,
// running its code (coordinator, internal/upstream, internal/store) and not
// a caller's (a test's) that is still on its way out: none may be left
// once Close has returned.
func ownGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var own []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "coordinator_test.") {
			continue
		}
		for _, pkg := range []string{"/coordd/coordinator.", "/coordd/internal/upstream.", "/coordd/internal/store."} {
			if strings.Contains(g, "github.com/coordd"+pkg) {
				own = append(own, g)
				break
			}
		}
	}
	return own
}

// TestCloseMidBurst: a Coordinator closed while a burst of cold fetches
// queues for the rate limit's slots (two a second, so the fair queue has
// slots booked ahead and timers pending) leaves no goroutine of its own
// once Close returns, and its Redis client sends nothing afterwards, not
// when the slots booked before Close would have started either.
func TestCloseMidBurst(t *testing.T) {
	const rate, burst = 2, 30
	u := fakeupstream.New(t)
	rs := redistest.Start(t)
	rdb := rs.Client(t)
	var trips storetest.RoundTrips
	rdb.AddHook(trips.Hook())
	cfg := enginetest.Protected(u, coordinator.Protection{RateLimit: rate, MaxWait: time.Minute}, nil)
	cfg.RedisTimeout = 2 * time.Second
	c, err := coordinator.New(cfg, coordinator.Options{Redis: rdb})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for i := range burst {
		wg.Go(func() {
			_, err := enginetest.Get(ctx, c, fmt.Sprintf("%s/burst/%d", u.URL(), i), "", coordinator.GetOptions{})
			if err != nil && !errors.Is(err, coordinator.ErrClosed) {
				t.Errorf("fetch %d: %v; want its document or ErrClosed", i, err)
			}
		})
	}
	// The first slot is free; the rest queue, and the queue books ahead.
	if err := enginetest.Poll(ctx, func() bool { return u.Total() >= 2 && len(enginetest.Flights(c)) == burst-2 }); err != nil {
		t.Fatalf("the burst did not queue: %d requests, %d flights: %v", u.Total(), len(enginetest.Flights(c)), err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	closed := time.Now()
	// A goroutine that has called its WaitGroup's Done is still in the
	// dump until it returns, which a busy machine may delay: wait for the
	// dump to empty (as goleak does). One that is left blocked stays.
	var own []string
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	_ = enginetest.Poll(wctx, func() bool { own = ownGoroutines(); return len(own) == 0 })
	wcancel()
	if len(own) > 0 {
		t.Errorf("%d goroutines of the engine left 10s after Close:\n%s", len(own), strings.Join(own, "\n\n"))
	}
	trips.Take()
	wg.Wait()
	// Absence is shown over a window: the slots booked before Close start
	// within a few of the rate's intervals, when a pending timer would
	// hand them out, or give them back to Redis. A busy machine can only
	// make the window shorter than that, never fail the test.
	time.Sleep(time.Until(closed.Add(4 * time.Second / rate)))
	if after := trips.Take(); len(after) > 0 {
		t.Errorf("Redis commands after Close: %v; want none", after)
	}
}
