package upstream

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// The fairness tests run in a testing/synctest bubble: time.Now, which is
// the Client's clock (Options.Now) and its guard's, and the timers its
// waits use are the bubble's fake clock, which moves only when every
// goroutine of the bubble is blocked. So they are deterministic and sleep
// no real time; synctest.Wait is the signal that every fetch has queued.
// (testclock.Clock cannot stand in: it has no timers to wait on.)

// slotLog is an upstream that answers at once, logging the attempts it
// is sent in the order they arrive.
type slotLog struct {
	mu  sync.Mutex
	got []slotRec
}

type slotRec struct {
	tenant, url string
	at          time.Time
}

func (l *slotLog) Fetch(_ context.Context, fr FetchRequest, _ func(Event)) (*Response, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, slotRec{tenant: fr.Tenant, url: fr.URL, at: time.Now()})
	return &Response{StatusCode: 200}, nil
}

func (l *slotLog) log() []slotRec {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]slotRec(nil), l.got...)
}

// fairClient returns a Client of upstream name limited to rate per second,
// waiting at most maxWait, over shared (nil: the local guard), which
// sends its attempts to log.
func fairClient(t testing.TB, name string, rate int, maxWait time.Duration, shared Shared, log *slotLog) *Client {
	t.Helper()
	up := &Config{Name: name, BaseURL: "https://up.example", Timeout: time.Second, Protection: Protection{
		RateLimit: rate, MaxWait: maxWait,
		Retry:   RetryPolicy{MaxAttempts: 1},
		Breaker: BreakerPolicy{FailureThreshold: -1, FailureRate: -1},
	}}
	up.Protection.setDefaults()
	if err := up.Protection.validate("test"); err != nil {
		t.Fatal(err)
	}
	c := NewClient(up, Options{Shared: shared, Logger: quietLogger()})
	c.next = log
	t.Cleanup(c.Close) // in a synctest bubble, before it ends: its slot timers wait in goroutines
	return c
}

// fetchReq is a request of tenant with weight; bg, when set, says whether
// it is background.
func fetchReq(tenant string, weight, i int, bg func() bool) FetchRequest {
	return FetchRequest{URL: fmt.Sprintf("https://up.example/%s/%d", tenant, i), Tenant: tenant, Weight: weight, Background: bg}
}

// maxMinFair divides capacity among flows of demand and weight as
// Kubernetes APF's fair queuing tests judge it (water-filling): no flow
// gets more than it demands, and what the others leave is shared by
// weight among the rest.
func maxMinFair(capacity float64, demand, weight []float64) []float64 {
	share := make([]float64, len(demand))
	open := make([]bool, len(demand))
	for i := range open {
		open[i] = true
	}
	for left := capacity; ; {
		var w float64
		for i := range demand {
			if open[i] {
				w += weight[i]
			}
		}
		if w == 0 || left <= 0 {
			return share
		}
		capped := false
		for i := range demand {
			if open[i] && demand[i] <= left*weight[i]/w {
				share[i], open[i], capped = demand[i], false, true
				left -= demand[i]
			}
		}
		if !capped {
			for i := range demand {
				if open[i] {
					share[i] = left * weight[i] / w
				}
			}
			return share
		}
	}
}

func TestMaxMinFair(t *testing.T) {
	got := maxMinFair(100, []float64{10, math.Inf(1), math.Inf(1)}, []float64{1, 1, 2})
	want := []float64{10, 30, 60}
	for i := range want {
		if math.Abs(got[i]-want[i]) > 1e-9 {
			t.Fatalf("got %v; want %v", got, want)
		}
	}
}

// checkFair fails unless each tenant's count of slots is within 25% of its
// max-min fair share.
func checkFair(t *testing.T, got map[string]int, tenants []string, fair []float64) {
	t.Helper()
	for i, name := range tenants {
		t.Logf("tenant %s: %d slots; max-min fair share %.1f", name, got[name], fair[i])
		if d := math.Abs(float64(got[name]) - fair[i]); d > 0.25*fair[i] {
			t.Errorf("tenant %s: %d slots; want %.1f ± 25%% (all: %v)", name, got[name], fair[i], got)
		}
	}
}

// TestFairSharesMaxMin: A (weight 1) and C (weight 2) queue a thousand
// fetches each, B (weight 1) asks 10 a second, under a rate of 100 a
// second. Over ten contended seconds each tenant's slots are within 25% of
// its max-min fair share: B all it asks, A and C the rest, 1:2.
func TestFairSharesMaxMin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := &slotLog{}
		c := fairClient(t, "up", 100, time.Minute, nil, log)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for i := range 1000 {
			wg.Go(func() { c.Fetch(ctx, fetchReq("a", 1, i, nil), nil) })
			wg.Go(func() { c.Fetch(ctx, fetchReq("c", 2, i, nil), nil) })
		}
		start := time.Now()
		wg.Go(func() {
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-tick.C:
					wg.Go(func() { c.Fetch(ctx, fetchReq("b", 1, i, nil), nil) })
				case <-ctx.Done():
					return
				}
			}
		})
		from, to := start.Add(time.Second), start.Add(11*time.Second)
		time.Sleep(to.Sub(start)) // the bubble's fake time: time is what is under test
		cancel()
		wg.Wait()

		got := map[string]int{}
		for _, r := range log.log() {
			if !r.at.Before(from) && r.at.Before(to) {
				got[r.tenant]++
			}
		}
		capacity := float64(to.Sub(from)) / float64(slotInterval(100))
		fair := maxMinFair(capacity, []float64{math.Inf(1), 100, math.Inf(1)}, []float64{1, 1, 2})
		checkFair(t, got, []string{"a", "b", "c"}, fair)
	})
}

// TestFairLightTenantWaitBounded: however many fetches a heavy tenant
// queues, a light tenant's fetch waits what its own share implies: the
// same behind 1000 as behind 100.
func TestFairLightTenantWaitBounded(t *testing.T) {
	wait := map[int]time.Duration{}
	for _, heavy := range []int{100, 1000} {
		synctest.Test(t, func(t *testing.T) {
			log := &slotLog{}
			c := fairClient(t, "up", 100, time.Minute, nil, log)
			var wg sync.WaitGroup
			defer wg.Wait()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel() // before wg.Wait
			for i := range heavy {
				wg.Go(func() { c.Fetch(ctx, fetchReq("heavy", 1, i, nil), nil) })
			}
			time.Sleep(time.Second) // fake time: the heavy tenant is served meanwhile
			start := time.Now()
			if _, err := c.Fetch(ctx, fetchReq("light", 1, 0, nil), nil); err != nil {
				t.Fatal(err)
			}
			wait[heavy] = time.Since(start)
			cancel()
		})
	}
	t.Logf("light tenant waited %v behind 100, %v behind 1000", wait[100], wait[1000])
	if wait[1000] != wait[100] || wait[100] > 2*slotInterval(100) {
		t.Errorf("light tenant waited %v behind 100, %v behind 1000; want the same, at most two slots (%v)", wait[100], wait[1000], 2*slotInterval(100))
	}
}

// TestFairLendsUnusedShare: a lone tenant gets every slot, back to back.
func TestFairLendsUnusedShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := &slotLog{}
		c := fairClient(t, "up", 10, time.Minute, nil, log)
		start := time.Now()
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Go(func() {
				if _, err := c.Fetch(context.Background(), fetchReq("a", 1, i, nil), nil); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		got := log.log()
		if len(got) != 20 {
			t.Fatalf("%d slots; want 20", len(got))
		}
		for i, r := range got {
			if want := start.Add(time.Duration(i) * slotInterval(10)); !r.at.Equal(want) {
				t.Errorf("slot %d at %v; want %v (none left unused)", i, r.at.Sub(start), want.Sub(start))
			}
		}
	})
}

// queueInOrder starts a fetch for each request, one after the other, each
// queued (the bubble blocked) before the next starts. It returns the
// errors, by index, once all are done.
func queueInOrder(ctx context.Context, c *Client, frs []FetchRequest) func() []error {
	errs := make([]error, len(frs))
	var wg sync.WaitGroup
	for i, fr := range frs {
		wg.Go(func() { _, errs[i] = c.Fetch(ctx, fr, nil) })
		synctest.Wait()
	}
	return func() []error {
		wg.Wait()
		return errs
	}
}

func urls(recs []slotRec) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.url)
	}
	return out
}

func TestFairInteractiveBeforeBackground(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := &slotLog{}
		c := fairClient(t, "up", 10, time.Minute, nil, log)
		yes := func() bool { return true }
		var promoted atomic.Bool // b3 is joined by a caller while queued
		promoted.Store(true)
		frs := []FetchRequest{
			fetchReq("a", 1, 0, nil), // takes the free slot
			fetchReq("a", 1, 1, yes),
			fetchReq("a", 1, 2, yes),
			fetchReq("a", 1, 3, promoted.Load),
			fetchReq("a", 1, 4, nil),
			fetchReq("b", 1, 5, nil),
		}
		done := queueInOrder(context.Background(), c, frs)
		promoted.Store(false)
		for i, err := range done() {
			if err != nil {
				t.Errorf("fetch %d: %v", i, err)
			}
		}
		want := []string{"a/0", "a/3", "b/5", "a/4", "a/1", "a/2"}
		got := urls(log.log())
		for i := range want {
			want[i] = "https://up.example/" + want[i]
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("slots went to %v; want %v", got, want)
		}
	})
}

func TestFairBackgroundLeavesTheLastSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := &slotLog{}
		// Three slots within the bound: now, 102.5ms and 205ms.
		c := fairClient(t, "up", 10, 300*time.Millisecond, nil, log)
		yes := func() bool { return true }
		done := queueInOrder(context.Background(), c, []FetchRequest{
			fetchReq("a", 1, 0, nil), // now
			fetchReq("a", 1, 1, nil), // 102.5ms
			fetchReq("b", 1, 2, yes), // would take 205ms, the last slot within its bound, while a/1 waits
		})
		errs := done()
		if errs[0] != nil || errs[1] != nil {
			t.Fatalf("interactive fetches: %v", errs[:2])
		}
		if !errors.Is(errs[2], ErrRateLimited) || RetryAfter(errs[2]) <= 0 {
			t.Errorf("background fetch for the last slot: %v (retry after %v); want ErrRateLimited with a wait", errs[2], RetryAfter(errs[2]))
		}
		// With no caller waiting, background work takes what there is.
		start := time.Now()
		errs = queueInOrder(context.Background(), c, []FetchRequest{
			fetchReq("b", 1, 3, yes),
			fetchReq("b", 1, 4, yes),
		})()
		if errs[0] != nil || errs[1] != nil {
			t.Errorf("background fetches alone: %v", errs)
		}
		if d := time.Since(start); d > 300*time.Millisecond {
			t.Errorf("took %v", d)
		}
	})
}

// TestFairLeaversKeepNoSlot: a waiter whose bound passes while queued
// fails as the rate limit refuses, one whose context ends leaves, and
// every slot still goes to a waiter.
func TestFairLeaversKeepNoSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := &slotLog{}
		c := fairClient(t, "up", 10, time.Minute, nil, log)
		iv := slotInterval(10)
		start := time.Now()
		shortBound := fetchReq("a", 1, 3, nil)
		shortBound.Deadline = func() (time.Time, bool) { return start.Add(3*iv + 10*time.Millisecond), true }
		cctx, cancelC := context.WithCancel(context.Background())
		var gone error
		var wg sync.WaitGroup
		done := queueInOrder(context.Background(), c, []FetchRequest{
			fetchReq("a", 1, 0, nil), // slot 0
			fetchReq("a", 1, 1, nil),
			fetchReq("a", 1, 2, nil),
			shortBound,               // its slot, 3, is within its bound until b's come
			fetchReq("b", 1, 4, nil), // ahead of a/2 and a/3
			fetchReq("b", 1, 5, nil), // ahead of a/3, which cannot be served within its bound any more
		})
		wg.Go(func() { _, gone = c.Fetch(cctx, fetchReq("c", 1, 6, nil), nil) })
		synctest.Wait()
		cancelC() // c/6 leaves before its slot
		errs := done()
		wg.Wait()
		if !errors.Is(gone, ErrUnavailable) {
			t.Errorf("cancelled waiter: %v; want ErrUnavailable", gone)
		}
		for i, err := range errs {
			if i == 3 {
				if !errors.Is(err, ErrRateLimited) || RetryAfter(err) <= 0 {
					t.Errorf("waiter past its bound: %v; want ErrRateLimited with a wait", err)
				}
				continue
			}
			if err != nil {
				t.Errorf("fetch %d: %v", i, err)
			}
		}
		got := log.log()
		want := []string{"a/0", "a/1", "b/4", "a/2", "b/5"}
		for i := range want {
			want[i] = "https://up.example/" + want[i]
		}
		if fmt.Sprint(urls(got)) != fmt.Sprint(want) {
			t.Errorf("slots went to %v; want %v", urls(got), want)
		}
		for i, r := range got {
			if at := start.Add(time.Duration(i) * iv); !r.at.Equal(at) {
				t.Errorf("slot %d at %v; want %v (no slot lost)", i, r.at.Sub(start), at.Sub(start))
			}
		}
	})
}

// TestFairSharedGuard: three instances share the Redis guard; on each,
// tenants a (weight 1) and b (weight 2) queue alike. Each instance hands
// its slots out fairly while both its tenants wait, which is measured per
// instance (they start at their own pace); the counts of all three are
// each tenant's fair share within 25%.
func TestFairSharedGuard(t *testing.T) {
	st := testStore(t)
	const instances, perTenant = 3, 150
	log := &slotLog{}
	// An instance's contended period starts once each of its fetches has
	// queued (it reports its wait) or been sent (it took a free slot at
	// once, as some do while the others start), and ends with the last
	// fetch of either tenant.
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		from  [instances]int // log length when the instance's fetches had settled
		count [instances]int
	)
	settle := func(n int, once *sync.Once) {
		once.Do(func() {
			mu.Lock()
			defer mu.Unlock()
			if count[n]++; count[n] == 2*perTenant {
				from[n] = len(log.log())
			}
		})
	}
	for n := range instances {
		c := fairClient(t, "fair", 500, time.Minute, st, log)
		for i := range perTenant {
			for tenant, weight := range map[string]int{"a": 1, "b": 2} {
				fr := fetchReq(tenant, weight, i, nil)
				fr.URL = fmt.Sprintf("https://up.example/%d/%s/%d", n, tenant, i)
				wg.Go(func() {
					var once sync.Once
					if _, err := c.Fetch(context.Background(), fr, func(Event) { settle(n, &once) }); err != nil {
						t.Error(err)
					}
					settle(n, &once)
				})
			}
		}
		t.Cleanup(c.fair.waitIdle)
	}
	wg.Wait()

	recs := log.log()
	got := map[string]int{}
	var slots int
	for n := range instances {
		var mine []slotRec
		for _, r := range recs[from[n]:] {
			if strings.HasPrefix(r.url, fmt.Sprintf("https://up.example/%d/", n)) {
				mine = append(mine, r)
			}
		}
		// Up to the last slot of the tenant that ran out first.
		end := len(mine)
		for _, tenant := range []string{"a", "b"} {
			last := -1
			for j, r := range mine {
				if r.tenant == tenant {
					last = j
				}
			}
			end = min(end, last+1)
		}
		for _, r := range mine[:end] {
			got[r.tenant]++
		}
		slots += end
	}
	if slots < 150 {
		t.Fatalf("%d slots were handed out while both tenants waited; want at least 150 to judge", slots)
	}
	checkFair(t, got, []string{"a", "b"}, maxMinFair(float64(slots), []float64{math.Inf(1), math.Inf(1)}, []float64{1, 2}))
}

// TestFairQuotaWindowKeepsTheLastForCallers: the hook the learned quota
// feeds (window) keeps the last request of a window from background work
// while callers wait.
func TestFairQuotaWindowKeepsTheLastForCallers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := fairClient(t, "up", 10, time.Minute, nil, &slotLog{})
		yes := func() bool { return true }
		for _, remaining := range []int{3, 2} {
			c.fair.window("", remaining, time.Now().Add(time.Minute))
			errs := queueInOrder(context.Background(), c, []FetchRequest{
				fetchReq("a", 1, 0, nil), // the free slot, if any
				fetchReq("a", 1, 1, nil), // waits
				fetchReq("b", 1, 2, yes), // second in the queue
			})()
			if errs[0] != nil || errs[1] != nil {
				t.Fatalf("interactive fetches: %v", errs[:2])
			}
			if refused := errors.Is(errs[2], ErrRateLimited); refused != (remaining == 2) {
				t.Errorf("%d left in the window: background fetch got %v; want it refused only when it would take the last", remaining, errs[2])
			}
		}
	})
}

// TestFairBurstBooksFewAhead: a burst of fetches of one credential scope,
// all asking at once, books only a few of the upstream's shared
// rate-limit slots ahead (the queue's fairAhead, and the one ask in
// flight), not one per fetch: the rate limit is every scope's, and a
// fetch of another credential (another tenant's) must not wait behind the
// whole burst. Each attempt that finds an ask of its scope in flight
// joins the queue.
func TestFairBurstBooksFewAhead(t *testing.T) {
	st := testStore(t)
	const burst, rate = 30, 20
	c := fairClient(t, "burst", rate, time.Minute, st, &slotLog{})
	t.Cleanup(c.fair.waitIdle)
	var (
		wg      sync.WaitGroup
		settled = make(chan struct{}, burst)
	)
	for i := range burst {
		fr := fetchReq("heavy", 1, i, nil)
		fr.QuotaScope = "s/heavy"
		wg.Go(func() {
			var once sync.Once
			if _, err := c.Fetch(context.Background(), fr, func(e Event) {
				if e.Stage == StageRateLimited {
					once.Do(func() { settled <- struct{}{} })
				}
			}); err != nil {
				t.Error(err)
			}
			once.Do(func() { settled <- struct{}{} }) // sent without a wait
		})
	}
	for range burst { // every fetch of the burst has queued or gone
		<-settled
	}
	fr := fetchReq("light", 1, 0, nil)
	fr.QuotaScope = "s/light"
	var waited time.Duration
	if _, err := c.Fetch(context.Background(), fr, func(e Event) {
		if e.Stage == StageRateLimited {
			waited = max(waited, e.Wait)
		}
	}); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if iv := slotInterval(rate); waited > 5*iv {
		t.Errorf("another scope's fetch waited %v behind a burst of %d (%v a slot); want at most a few slots (%v)", waited, burst, iv, 5*iv)
	}
}

// hookShared is a Shared store whose Admit runs a hook, set once, before it
// asks: a test holds one ask in flight while it acts.
type hookShared struct {
	Shared
	hook atomic.Pointer[func()]
}

func (h *hookShared) Admit(ctx context.Context, upstream string, a SharedAdmit) (SharedAdmission, error) {
	if f := h.hook.Swap(nil); f != nil {
		(*f)()
	}
	return h.Shared.Admit(ctx, upstream, a)
}

// TestFairRefusalSparesLaterWaiters: the guard refuses a queue's booking
// ask for the bound of the waiters queued when it was asked; a waiter that
// joined while the ask was in flight, whose own bound reaches past the
// refused slot, is not refused by that answer but served by the next
// booking. Tenant A's two waiters may wait 2 s, another instance books
// the guard's slots 3 s ahead while the queue's booker asks, and tenant
// B, which may wait 10 s, joins then. (B was refused: "next slot in 3s,
// past the 10s this fetch may wait".)
func TestFairRefusalSparesLaterWaiters(t *testing.T) {
	st := testStore(t)
	const rate, maxWait = 100, 10 * time.Second // a slot every 10 ms
	hs := &hookShared{Shared: st}
	c := fairClient(t, "spare", rate, maxWait, hs, &slotLog{})
	other := fairClient(t, "spare", rate, maxWait, st, &slotLog{}) // another instance
	t.Cleanup(c.fair.waitIdle)
	bookAhead := func(n int) {
		for range n {
			if a := other.ask(context.Background(), maxWait, quotaAsk{}); a.verdict != verdictAdmitted {
				t.Errorf("another instance's booking: %+v; want it admitted", a)
				return
			}
		}
	}
	// fetch starts fr and returns its result, and a channel closed once it
	// has queued (reported its wait for a slot).
	fetch := func(fr FetchRequest) (<-chan error, <-chan struct{}) {
		done, queued := make(chan error, 1), make(chan struct{})
		var once sync.Once
		go func() {
			_, err := c.Fetch(context.Background(), fr, func(e Event) {
				if e.Stage == StageRateLimited {
					once.Do(func() { close(queued) })
				}
			})
			done <- err
		}()
		return done, queued
	}
	short := func(i int) FetchRequest {
		fr := fetchReq("a", 1, i, nil)
		dl := time.Now().Add(2 * time.Second)
		fr.Deadline = func() (time.Time, bool) { return dl, true }
		return fr
	}

	bookAhead(50) // the guard's next slot is 0.5 s ahead: A's first attempt queues
	a0, queued := fetch(short(0))
	<-queued
	var b <-chan error
	f := func() {
		bookAhead(300) // past A's bounds: the guard refuses this ask
		var bQueued <-chan struct{}
		b, bQueued = fetch(fetchReq("b", 1, 0, nil))
		<-bQueued
	}
	hs.hook.Store(&f)
	a1, _ := fetch(short(1)) // its queue books a slot for it: the hooked ask
	if err := <-a1; !errors.Is(err, ErrRateLimited) {
		t.Errorf("A's second fetch, whose bound ends before the guard's next slot: %v; want ErrRateLimited", err)
	}
	if err := <-a0; err != nil {
		t.Errorf("A's first fetch, holding a slot: %v", err)
	}
	if b == nil {
		t.Fatal("the queue's booking ask was not made")
	}
	if err := <-b; err != nil {
		t.Errorf("B, which joined during the refused ask and may wait 10 s: %v; want it served", err)
	}
}

// churnUpstream answers each attempt after up to 3 ms, as an API does.
type churnUpstream struct{ sent atomic.Int64 }

func (u *churnUpstream) Fetch(ctx context.Context, _ FetchRequest, _ func(Event)) (*Response, error) {
	u.sent.Add(1)
	select { // the latency of an upstream, not a wait for a signal
	case <-time.After(time.Duration(rand.Int64N(int64(3 * time.Millisecond)))):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &Response{StatusCode: 200}, nil
}

// TestFairChurnSparesOtherTenant: two instances share the Redis guard,
// rate_limit 150, max_in_flight 40, max_wait 10 s. Tenant A keeps 60 cold
// fetches going on each, every one given up 0–30 ms after it starts;
// tenant B asks for one cold key every 50 ms on each (about 4,000 of A's
// a second to one of B's 20). Every one of B's
// fetches is served: B may wait 10 s, and A's leavers give it no refusal
// (a refusal the guard gave A's short bounds was handed to B). The bug
// showed in about one call in a hundred; the churn runs until B has made
// 200 calls.
func TestFairChurnSparesOtherTenant(t *testing.T) {
	st := testStore(t)
	const instances, churners, calls = 2, 60, 200
	up := &churnUpstream{}
	var cs []*Client
	for range instances {
		c := fairClient(t, "churn", 150, 10*time.Second, st, nil)
		c.Close()
		c.up.Protection.MaxInFlight = 40
		c = NewClient(c.up, Options{Shared: st, Logger: quietLogger()})
		c.next = up
		t.Cleanup(c.Close)
		t.Cleanup(c.fair.waitIdle)
		cs = append(cs, c)
	}
	stop := make(chan struct{})
	var churn sync.WaitGroup
	var given atomic.Int64
	for n, c := range cs {
		for g := range churners {
			churn.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					fr := fetchReq("a", 1, i, nil)
					fr.URL = fmt.Sprintf("https://up.example/a/%d/%d/%d", n, g, i)
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rand.Int64N(int64(30*time.Millisecond))))
					c.Fetch(ctx, fr, func(Event) {}) // A's result is not judged: it gives up
					<-ctx.Done()                     // a stream held 0–30 ms, whatever it was answered
					cancel()
					given.Add(1)
				}
			})
		}
	}
	var (
		b       sync.WaitGroup
		refused atomic.Int64
	)
	for n, c := range cs {
		b.Go(func() {
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for i := range calls / instances {
				<-tick.C
				fr := fetchReq("b", 1, i, nil)
				fr.URL = fmt.Sprintf("https://up.example/b/%d/%d", n, i)
				if _, err := c.Fetch(context.Background(), fr, func(Event) {}); err != nil {
					refused.Add(1)
					t.Errorf("instance %d: B's call %d: %v; want it served", n, i, err)
				}
			}
		})
	}
	b.Wait()
	close(stop)
	churn.Wait()
	t.Logf("A started and gave up %d fetches; %d attempts reached the upstream; B: %d of %d refused", given.Load(), up.sent.Load(), refused.Load(), calls)
	if given.Load() < calls {
		t.Errorf("A churned only %d fetches while B made %d calls; want many more", given.Load(), calls)
	}
}
