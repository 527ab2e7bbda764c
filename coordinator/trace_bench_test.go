package coordinator_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/coordd/coordd/coordinator"
)

// benchCoordinator is a single-node Coordinator (no Redis: the benchmark
// measures the engine, not Redis) over a loopback upstream that answers
// every path at once with a small cacheable document.
func benchCoordinator(b *testing.B, opt coordinator.Options) (*coordinator.Coordinator, string) {
	b.Helper()
	body := make([]byte, 4<<10)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=3600")
		_, _ = w.Write(body)
	}))
	b.Cleanup(up.Close)
	// No rate limit: the cold benchmark measures the engine, not the
	// slots of the default limit.
	c, err := coordinator.New(coordinator.Config{Upstreams: []coordinator.Upstream{{
		Name: "b", BaseURL: up.URL, Protection: coordinator.Protection{RateLimit: -1},
	}}}, opt)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c, up.URL
}

// BenchmarkGetL1Hit is the hot path: a Get that L1 answers. With tracing
// off (Options without a TracerProvider) it must cost what it cost before
// tracing existed; compare runs with benchstat.
func BenchmarkGetL1Hit(b *testing.B) {
	c, base := benchCoordinator(b, coordinator.Options{})
	t, err := c.Resolve(base+"/hit", "")
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if _, err := c.Get(ctx, t, coordinator.GetOptions{}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			res, err := c.Get(ctx, t, coordinator.GetOptions{})
			if err != nil || res.Source != coordinator.SourceL1 {
				b.Errorf("Get = %v, %v; want an L1 hit", res, err)
				return
			}
		}
	})
}

// BenchmarkGetColdFanOut is the cold path: per op, 32 callers ask at once
// for a key no tier holds; one fetches, the others join its flight.
func BenchmarkGetColdFanOut(b *testing.B) {
	const callers = 32
	c, base := benchCoordinator(b, coordinator.Options{})
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t, err := c.Resolve(fmt.Sprintf("%s/cold/%d", base, i), "")
		if err != nil {
			b.Fatal(err)
		}
		var wg sync.WaitGroup
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := c.Get(ctx, t, coordinator.GetOptions{}); err != nil {
					b.Error(err)
				}
			}()
		}
		wg.Wait()
	}
}
