package main

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	coordd "github.com/coordd/coordd/clients/go"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/wirefloor"
)

// results is everything one run measured.
type results struct {
	cfg     config
	facts   facts
	grid    []gridCell
	lag     []lagCell
	cold    []coldCell
	tput    []tputPoint
	streams streamsResult
	mem     memResult
	swarm   *swarmResult   // nil if not run
	gateway *gatewayResult // nil if not run
	quota   *quotaResult   // nil if not run
	elapsed time.Duration
}

// gridCell is the cold bursts of one (instances, callers) pair.
type gridCell struct {
	k, callers    int
	coordd, poll  []burstResult // one per cold key
	coorddRedisBy map[string]int64
}

// lagCell is the follower-lag bursts of one (size, instances) pair, merged.
type lagCell struct {
	size, k             int
	coordd, poll, floor burstResult
}

// tputPoint is warm-hit throughput at one (size, callers) pair.
type tputPoint struct {
	size, callers       int
	coordd, poll, floor tput
}

type tput struct {
	docs    int64
	elapsed time.Duration
	errors  int64
	slices  []float64 // documents per second in each slice, in order
}

// perSec is documents received per second.
func (t tput) perSec() float64 {
	if t.elapsed <= 0 {
		return 0
	}
	return float64(t.docs) / t.elapsed.Seconds()
}

func (t *tput) add(u tput) {
	t.docs += u.docs
	t.elapsed += u.elapsed
	t.errors += u.errors
	t.slices = append(t.slices, u.perSec())
}

// sliceRatio is the median, over the slices, of a's throughput ÷ b's in
// the same slice: each pair ran back to back, so a drift in what else the
// machine does moves both, where the ratio of the totals takes it whole.
func sliceRatio(a, b tput) float64 {
	var rs []float64
	for i := range min(len(a.slices), len(b.slices)) {
		if b.slices[i] > 0 {
			rs = append(rs, a.slices[i]/b.slices[i])
		}
	}
	if len(rs) == 0 {
		return 0
	}
	slices.Sort(rs)
	if n := len(rs); n%2 == 0 {
		return (rs[n/2-1] + rs[n/2]) / 2
	}
	return rs[len(rs)/2]
}

// measure runs every measurement in turn; progress reports each phase.
func measure(ctx context.Context, e *env, progress func(string, ...any)) (*results, error) {
	cfg := e.cfg
	res := &results{cfg: cfg, facts: machineFacts()}
	if cfg.quickNote != "" {
		progress("%s", cfg.quickNote)
	}

	progress("cold bursts: upstream requests and Redis commands per key")
	for _, k := range []int{1, 3, 5} {
		for _, n := range gridCallers(k, cfg.gridCallers) {
			cell, err := e.gridCell(ctx, k, n)
			if err != nil {
				return nil, err
			}
			res.grid = append(res.grid, cell)
		}
	}

	progress("follower lag and cross-instance wake-up")
	for _, size := range []int{cfg.small, cfg.large} {
		for _, k := range []int{1, 3} {
			c := lagCell{size: size, k: k}
			for range cfg.lagRounds {
				// Interleaved, so that the three share the machine's moods.
				for _, t := range []struct {
					tg      *target
					into    *burstResult
					coorddK int
				}{{e.coorddT, &c.coordd, k}, {e.pollT, &c.poll, 0}, {e.floorT, &c.floor, 0}} {
					r, err := e.burst(ctx, burstSpec{stubs: t.tg.stubs[:k], callers: cfg.lagCallers, size: size, coorddK: t.coorddK})
					if err != nil {
						return nil, err
					}
					t.into.merge(r)
				}
			}
			res.lag = append(res.lag, c)
		}
	}

	progress("cold path: round trips per step, first answer")
	cold, err := e.measureCold(ctx)
	if err != nil {
		return nil, err
	}
	res.cold = cold

	progress("warm-hit throughput")
	tp, err := e.throughputCurve(ctx)
	if err != nil {
		return nil, err
	}
	res.tput = tp

	progress("%d concurrent streams on one instance", cfg.streams)
	if res.streams, err = e.manyStreams(ctx); err != nil {
		return nil, err
	}

	progress("memory and GC with %d documents in L1", cfg.docs)
	if res.mem, err = measureMemory(ctx, cfg.docs, cfg.small); err != nil {
		return nil, err
	}
	progress("done")
	return res, ctx.Err()
}

// gridCallers returns one caller per instance, then each of ns above it.
func gridCallers(k int, ns []int) []int {
	out := []int{k}
	for _, n := range ns {
		if n > k {
			out = append(out, n)
		}
	}
	return out
}

// gridCell runs the cold bursts of k instances and n callers, for coordd
// and the polling baseline.
func (e *env) gridCell(ctx context.Context, k, n int) (gridCell, error) {
	c := gridCell{k: k, callers: n, coorddRedisBy: map[string]int64{}}
	for i := range max(e.cfg.gridRounds, e.cfg.pollRounds) {
		if i < e.cfg.gridRounds {
			r, err := e.burst(ctx, burstSpec{stubs: e.coorddT.stubs[:k], callers: n, size: e.cfg.small, coorddK: k})
			if err != nil {
				return c, err
			}
			c.coordd = append(c.coordd, r)
			for cmd, v := range r.redisBy {
				c.coorddRedisBy[cmd] += v
			}
		}
		if i < e.cfg.pollRounds {
			r, err := e.burst(ctx, burstSpec{stubs: e.pollT.stubs[:k], callers: n, size: e.cfg.small})
			if err != nil {
				return c, err
			}
			c.poll = append(c.poll, r)
		}
	}
	return c, nil
}

// throughputCurve measures warm hits, on one instance of each, for both
// body sizes and every count of callers.
func (e *env) throughputCurve(ctx context.Context) ([]tputPoint, error) {
	clients := map[string]*coordd.Client{}
	for _, t := range []*target{e.coorddT, e.pollT, e.floorT} {
		c, err := coordd.Dial(t.addrs[0])
		if err != nil {
			return nil, err
		}
		defer c.Close()
		clients[t.name] = c
	}
	var out []tputPoint
	for _, size := range []int{e.cfg.small, e.cfg.large} {
		path := e.newKey("warm")
		e.cat.put(path, &entry{body: e.cat.body(size)})
		u := e.up.url + path
		for _, name := range []string{nameCoordd, namePolling} { // the floor needs no warming
			if _, err := clients[name].Get(ctx, u); err != nil {
				return nil, fmt.Errorf("warm %s: %w", name, err)
			}
		}
		// The floor sends what coordd sends for the hit, byte for byte.
		hit, err := wirefloor.CaptureHit(ctx, e.coorddT.stubs[0], u)
		if err != nil {
			return nil, fmt.Errorf("coordd's hit: %w", err)
		}
		e.cat.get(path).hit.Store(&hit)
		for _, n := range e.cfg.tputCallers {
			p := tputPoint{size: size, callers: n}
			// In slices taken in turn, so that the three share the
			// machine's moods (it is shared).
			slices := e.cfg.tputSlices()
			d := e.cfg.tputTime(n) / time.Duration(slices)
			targets := []struct {
				name string
				into *tput
			}{{nameCoordd, &p.coordd}, {nameFloor, &p.floor}, {namePolling, &p.poll}}
			for s := range slices {
				// Each slice starts with the next target, so that none
				// always runs right after the same one, and from a
				// collected heap: the garbage of the one before (the
				// polling server's is the most) is not collected on the
				// next one's time.
				for i := range targets {
					t := targets[(s+i)%len(targets)]
					runtime.GC()
					// Labelled client=name for --cpuprofile, as the servers are.
					pprof.Do(ctx, pprof.Labels("client", t.name), func(ctx context.Context) {
						t.into.add(throughput(ctx, clients[t.name], u, n, d))
					})
				}
			}
			out = append(out, p)
		}
		e.cat.drop(path)
	}
	return out, ctx.Err()
}

// throughput has n callers get u in a loop for d, through the Go client,
// and returns the documents received per second.
func throughput(ctx context.Context, c *coordd.Client, u string, n int, d time.Duration) tput {
	var docs, errs atomic.Int64
	start := time.Now()
	stop := start.Add(d)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) && ctx.Err() == nil {
				if _, err := c.Get(ctx, u); err != nil {
					errs.Add(1)
				} else {
					docs.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return tput{docs: docs.Load(), elapsed: time.Since(start), errors: errs.Load()}
}

// streamsResult is cfg.streams concurrent streams on one coordd instance
// and on one floor server.
type streamsResult struct {
	n             int
	coordd, floor streamFigures
}

type streamFigures struct {
	bytesPerStream      float64 // live heap and stacks while every stream waits, per stream
	goroutinesPerStream float64
	burst               burstResult
}

// manyStreams opens cfg.streams GetOrFetch streams of one cold key on
// coordd instance 0, over cfg.streamConns connections, measures memory
// while all of them wait, then releases the upstream; and the same on the
// floor. The memory includes the client side of each stream, which runs
// in this process too.
func (e *env) manyStreams(ctx context.Context) (streamsResult, error) {
	r := streamsResult{n: e.cfg.streams}
	for _, t := range []struct {
		addr string
		into *streamFigures
	}{{e.coorddT.addrs[0], &r.coordd}, {e.floorT.addrs[0], &r.floor}} {
		var stubs []coorddv1.CoordinatorServiceClient
		var closers []func()
		for range e.cfg.streamConns {
			cc := dial(e.h, t.addr)
			stubs = append(stubs, coorddv1.NewCoordinatorServiceClient(cc))
			closers = append(closers, func() { _ = cc.Close() })
		}
		settle()
		before, g0 := liveBytes(), runtime.NumGoroutine()
		var after uint64
		var g1 int
		b, err := e.burst(ctx, burstSpec{stubs: stubs, callers: e.cfg.streams, size: e.cfg.small, atJoined: func() {
			settle()
			after, g1 = liveBytes(), runtime.NumGoroutine()
		}})
		for _, c := range closers {
			c()
		}
		if err != nil {
			return r, err
		}
		*t.into = streamFigures{
			bytesPerStream:      (float64(after) - float64(before)) / float64(e.cfg.streams),
			goroutinesPerStream: float64(g1-g0) / float64(e.cfg.streams),
			burst:               b,
		}
	}
	return r, nil
}

// settle collects garbage until the live heap has not shrunk for two
// collections in a row (at most ten), so that what remains is what is in
// use: a collection moves sync.Pool contents (gRPC's buffers among them)
// to their victim caches, which the next one frees, and queues cleanups
// (L1's weak map registers one per document, and each holds the whole L1
// until it ran).
func settle() {
	prev, still := uint64(math.MaxUint64), 0
	for range 10 {
		runtime.GC()
		live := liveBytes()
		if live >= prev-prev/100 {
			if still++; still == 2 {
				return
			}
		} else {
			still = 0
		}
		prev = min(prev, live)
		time.Sleep(10 * time.Millisecond) // lets queued cleanups run; the runtime offers no way to wait for them
	}
}

// liveBytes is the live heap plus goroutine stacks; call it after settle.
func liveBytes() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc + ms.StackInuse
}

// percentiles returns the p50, p99 and max of ds (zeros if empty).
func percentiles(ds []time.Duration) (p50, p99, pmax time.Duration) {
	if len(ds) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return at(0.50), at(0.99), s[len(s)-1]
}
