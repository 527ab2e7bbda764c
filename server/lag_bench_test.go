package server_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/coorddtest"
	"github.com/coordd/coordd/internal/fakeupstream"
)

// BenchmarkFollowerLag measures how long after the upstream answers the
// callers on 3 instances get their metadata, for coordd's push (pub/sub)
// and, as the baseline, the design coordd replaced: waiters polling for the
// value every 200 ms (here polling L2, which is kinder than polling a local
// map, since it at least sees other processes' fills).
func BenchmarkFollowerLag(b *testing.B) {
	cl := startCluster(b, 3, nil)
	const callers = 150
	var push, poll []time.Duration
	ctx := context.Background()
	rdb := cl.instances[0].Redis
	b.ResetTimer()
	for i := range b.N {
		path := fmt.Sprintf("/lag/%d", i)
		release := make(chan struct{})
		cl.up.Set(path, fakeupstream.Behavior{Block: release})
		var landed time.Time
		go func() {
			_ = cl.up.WaitCount(ctx, path, 1)
			time.Sleep(150 * time.Millisecond) // every caller waiting
			landed = time.Now()
			close(release)
		}()
		var mu sync.Mutex
		var wg sync.WaitGroup
		arrived := make([]time.Time, 0, 2*callers)
		for k := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := coorddtest.Get(ctx, cl.clients[k%3], &coorddv1.GetOrFetchRequest{Url: cl.url(path)}); err != nil {
					b.Error(err)
				}
				mu.Lock()
				arrived = append(arrived, time.Now())
				mu.Unlock()
			}()
		}
		// The baseline pollers start with the burst and poll L2 every 200ms.
		polled := make([]time.Time, callers)
		for k := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(rand.N(200 * time.Millisecond)) // pollers' phases are random
				t := time.NewTicker(200 * time.Millisecond)
				defer t.Stop()
				for range t.C {
					if n, _ := rdb.Exists(ctx, "coordd:{"+cl.url(path)+"}:doc").Result(); n == 1 {
						polled[k] = time.Now()
						return
					}
				}
			}()
		}
		wg.Wait()
		for _, a := range arrived {
			push = append(push, a.Sub(landed))
		}
		for _, a := range polled {
			poll = append(poll, a.Sub(landed))
		}
	}
	b.StopTimer()
	pct := func(d []time.Duration, p int) time.Duration {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[len(d)*p/100]
	}
	pp50, pp99, qp50, qp99 := pct(push, 50), pct(push, 99), pct(poll, 50), pct(poll, 99)
	b.ReportMetric(float64(pp50.Microseconds()), "push-p50-µs")
	b.ReportMetric(float64(pp99.Microseconds()), "push-p99-µs")
	fmt.Printf("follower lag, %d callers on 3 instances: push p50 %v p99 %v; 200ms-poll baseline p50 %v p99 %v; push is %.0fx sooner at p50\n",
		callers, pp50.Round(time.Microsecond), pp99.Round(time.Microsecond), qp50.Round(time.Microsecond), qp99.Round(time.Microsecond),
		float64(qp50)/float64(max(pp50, time.Microsecond)))
}
