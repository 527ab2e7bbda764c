package coordinator

import (
	"sync"
	"sync/atomic"
	"time"
)

// windowSeconds is the longest rolling window Status reports: 15 minutes.
const windowSeconds = 15 * 60

// window counts calls and upstream requests in one-second buckets over the
// last windowSeconds, by Config.Now, for Status's rolling 1, 5 and 15
// minute figures. Counting is lock-free except once a second, when the
// first event of a new second empties that second's bucket: a mutex on
// every Get would serialize the L1 hit path. It is hand-rolled because the
// rolling counters at hand (go-metrics' meters, Prometheus's summaries)
// either decay exponentially or tick on a goroutine of their own and the
// wall clock, not the Coordinator's clock. The zero window is ready.
type window struct {
	mu      sync.Mutex // serializes the emptying of a bucket for a new second
	buckets [windowSeconds]bucket
}

// bucket is one second's counts; sec is the unix second they belong to.
type bucket struct {
	sec                         atomic.Int64
	calls, errors, l1, upstream atomic.Int64
}

// Counts are what a window counted over a span.
type Counts struct {
	Calls    int64 // Gets that returned, errors included
	Errors   int64 // of which returned an error
	L1       int64 // of which were answered from L1, fresh or stale
	Upstream int64 // upstream fetches started (one per flight that led)
}

// at returns now's bucket, emptied if it held an older second.
func (w *window) at(now time.Time) *bucket {
	sec := now.Unix()
	b := &w.buckets[uint64(sec)%windowSeconds]
	if b.sec.Load() == sec {
		return b
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if old := b.sec.Load(); old != sec {
		if old > sec {
			return b // a clock that went back: count in the newer second
		}
		b.calls.Store(0)
		b.errors.Store(0)
		b.l1.Store(0)
		b.upstream.Store(0)
		b.sec.Store(sec) // last, so that a reader of sec sees the counts emptied
	}
	return b
}

// sum returns the counts of the span seconds up to now, now's included.
func (w *window) sum(now time.Time, span int) Counts {
	sec := now.Unix()
	var c Counts
	for i := range w.buckets {
		b := &w.buckets[i]
		if s := b.sec.Load(); s > sec-int64(span) && s <= sec {
			c.Calls += b.calls.Load()
			c.Errors += b.errors.Load()
			c.L1 += b.l1.Load()
			c.Upstream += b.upstream.Load()
		}
	}
	return c
}

// statusCounters are the running counts behind Status: the rolling
// window, and each tenant's totals since start. The zero value is ready.
type statusCounters struct {
	win     window
	tenants sync.Map // tenant name → *tenantCounts; tenants are the configured ones, a bounded set
}

type tenantCounts struct{ calls, upstream atomic.Int64 }

func (s *statusCounters) tenant(name string) *tenantCounts {
	if v, ok := s.tenants.Load(name); ok {
		return v.(*tenantCounts)
	}
	v, _ := s.tenants.LoadOrStore(name, new(tenantCounts))
	return v.(*tenantCounts)
}

// served counts a Get of tenant that returned res, err at now.
func (s *statusCounters) served(tenant string, now time.Time, res *Result, err error) {
	b := s.win.at(now)
	b.calls.Add(1)
	switch {
	case err != nil:
		b.errors.Add(1)
	case res.Source == SourceL1:
		b.l1.Add(1)
	}
	s.tenant(tenant).calls.Add(1)
}

// fetched counts an upstream fetch started for tenant at now.
func (s *statusCounters) fetched(tenant string, now time.Time) {
	s.win.at(now).upstream.Add(1)
	s.tenant(tenant).upstream.Add(1)
}
