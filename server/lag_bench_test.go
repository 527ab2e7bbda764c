package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/redistest"
	"github.com/coordd/coordd/internal/testing/storetest"
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
	st := storetest.New(cl.instances[0].Redis, "")
	b.ResetTimer()
	for i := range b.N {
		path := fmt.Sprintf("/lag/%d", i)
		release := make(chan struct{})
		cl.up.Set(path, fakeupstream.Behavior{Block: release})
		var landed time.Time
		go func() {
			_ = cl.awaitJoined(ctx, path, callers) // every caller waiting
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
				if _, err := fleettest.Get(ctx, cl.clients[k%3], &coorddv1.GetOrFetchRequest{Url: cl.url(path)}); err != nil {
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
					if stored, _ := st.DocStored(ctx, cl.url(path)); stored {
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

// BenchmarkHandOff measures the hand-off to other instances: a caller on
// instance 0 leads; 20 callers on each of instances 1 and 2 wait for its
// push. Reported: how long after the upstream's answer the followers on the
// other instances get their metadata (p50, p99), at 1 KiB and 32 KiB.
func BenchmarkHandOff(b *testing.B) {
	for _, size := range []int{1 << 10, 32 << 10} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			cl := startCluster(b, 3, nil)
			ctx := context.Background()
			var lags []time.Duration
			for i := range b.N {
				path := fmt.Sprintf("/handoff/%d", i)
				release := make(chan struct{})
				cl.up.Set(path, fakeupstream.Behavior{Block: release, Size: size})
				var wg sync.WaitGroup
				wg.Go(func() {
					if _, err := fleettest.Get(ctx, cl.clients[0], &coorddv1.GetOrFetchRequest{Url: cl.url(path)}); err != nil {
						b.Error(err)
					}
				})
				_ = cl.up.WaitCount(ctx, path, 1)
				var mu sync.Mutex
				arrived := make([]time.Time, 0, 40)
				for k := range 40 {
					wg.Go(func() {
						if _, err := fleettest.Get(ctx, cl.clients[1+k%2], &coorddv1.GetOrFetchRequest{Url: cl.url(path)}); err != nil {
							b.Error(err)
						}
						mu.Lock()
						arrived = append(arrived, time.Now())
						mu.Unlock()
					})
				}
				if err := cl.awaitJoined(ctx, path, 1+40); err != nil { // every follower waiting
					b.Fatal(err)
				}
				landed := time.Now()
				close(release)
				wg.Wait()
				for _, a := range arrived {
					lags = append(lags, a.Sub(landed))
				}
			}
			sort.Slice(lags, func(i, j int) bool { return lags[i] < lags[j] })
			p50, p99 := lags[len(lags)/2], lags[len(lags)*99/100]
			b.ReportMetric(float64(p50.Microseconds()), "p50-µs")
			b.ReportMetric(float64(p99.Microseconds()), "p99-µs")
		})
	}
}

// BenchmarkFirstCallAfterStart measures a fresh instance's first call, an
// L2 hit: what a process started during a burst makes its first callers
// wait (connections, scripts, types), with the gRPC connection already up.
func BenchmarkFirstCallAfterStart(b *testing.B) {
	rs := redistest.Start(b)
	up := fakeupstream.New(b)
	cfg := coordinator.Config{Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: up.URL()}}}
	ctx := context.Background()
	seed := fleettest.Start(b, fleettest.Options{RedisURL: rs.URL(), Config: cfg})
	url := up.URL() + "/first"
	if _, err := fleettest.Get(ctx, seed.Dial(b), &coorddv1.GetOrFetchRequest{Url: url}); err != nil {
		b.Fatal(err)
	}
	var lat []time.Duration
	for range b.N {
		in := fleettest.Start(b, fleettest.Options{RedisURL: rs.URL(), Config: cfg})
		c := in.Dial(b)
		_, _ = c.Invalidate(ctx, &coorddv1.InvalidateRequest{}) // connect: refused before any I/O
		t0 := time.Now()
		d, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: url})
		lat = append(lat, time.Since(t0))
		if err != nil || d.Meta.GetSource() != coorddv1.Source_SOURCE_L2 {
			b.Fatalf("%v, %v; want an L2 hit", err, d.GetMeta())
		}
		in.Stop()
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "first-p50-µs")
	b.ReportMetric(float64(lat[len(lat)*9/10].Microseconds()), "first-p90-µs")
}

// BenchmarkWarmHit measures L1 hits of a 1 KiB document over gRPC, from
// parallel callers on 8 connections, with the log at INFO (successful calls
// log at DEBUG, so nothing is written): the per-call cost of the
// interceptors and the stream. cpu-ns/op is the process's CPU time (user
// and system, client included) per call: on a shared machine it moves
// less than ns/op, which counts the time other processes took.
func BenchmarkWarmHit(b *testing.B) {
	up := fakeupstream.New(b)
	cfg := coordinator.Config{Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: up.URL()}}}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))
	in := fleettest.Start(b, fleettest.Options{Config: cfg})
	var clients []coorddv1.CoordinatorServiceClient
	for range 8 {
		clients = append(clients, in.Dial(b))
	}
	ctx := context.Background()
	req := &coorddv1.GetOrFetchRequest{Url: up.URL() + "/hit"}
	if _, err := fleettest.Get(ctx, clients[0], req); err != nil {
		b.Fatal(err)
	}
	var next atomic.Int64
	b.ReportAllocs()
	cpu0 := cpuTime()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c := clients[next.Add(1)%8]
		for pb.Next() {
			if _, err := fleettest.Get(ctx, c, req); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
}
