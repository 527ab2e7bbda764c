package upstream

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/store"
	"github.com/coordd/coordd/internal/testing/redistest"
)

// slotWait bounds every wait on a signal in these tests: far beyond what
// any takes on a busy machine, and below the slots' one-minute leases, so
// that a slot handed on in time was handed on by its release.
const slotWait = 20 * time.Second

// gate is an upstream whose requests block until the test lets them
// answer, counting how many are in progress at once.
type gate struct {
	srv     *httptest.Server
	arrived chan string   // the path of each request, as it arrives
	answer  chan struct{} // each send lets one request answer
	stop    chan struct{} // closed at the end: every request answers

	mu        sync.Mutex // protects cur and most
	cur, most int
}

func newGate(t *testing.T) *gate {
	g := &gate{arrived: make(chan string, 100), answer: make(chan struct{}), stop: make(chan struct{})}
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		g.cur++
		g.most = max(g.most, g.cur)
		g.mu.Unlock()
		g.arrived <- r.URL.Path
		select {
		case <-g.answer:
		case <-g.stop:
		case <-r.Context().Done():
		}
		g.mu.Lock()
		g.cur--
		g.mu.Unlock()
	}))
	t.Cleanup(func() {
		close(g.stop)
		g.srv.Close()
	})
	return g
}

func (g *gate) counts() (cur, most int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cur, g.most
}

// waitArrival waits for the next request to reach the upstream.
func (g *gate) waitArrival(t *testing.T) string {
	t.Helper()
	select {
	case p := <-g.arrived:
		return p
	case <-time.After(slotWait):
		t.Fatalf("no request reached the upstream within %v", slotWait)
		return ""
	}
}

// noArrival checks that no request reached the upstream so far.
func (g *gate) noArrival(t *testing.T, why string) {
	t.Helper()
	select {
	case p := <-g.arrived:
		t.Fatalf("%s reached the upstream; want it held back (%s)", p, why)
	default:
	}
}

// slotsConfig is an upstream with max slots in flight, no rate limit,
// and a minute's timeout (a minute's lease) and wait.
func slotsConfig(t *testing.T, baseURL string, slots int) *Config {
	up := &Config{Name: "gated", BaseURL: baseURL, Timeout: time.Minute}
	up.Protection.RateLimit = -1
	up.Protection.MaxWait = time.Minute
	up.Protection.MaxInFlight = slots
	up.Protection.Retry.MaxAttempts = 1
	SetDefaults(up)
	if err := Validate(up, "upstreams[0]"); err != nil {
		t.Fatal(err)
	}
	return up
}

// storesOn starts n stores (n instances) on srv, each with a client of
// its own.
func storesOn(t *testing.T, srv *redistest.Server, n int) []*store.Redis {
	var rs []*store.Redis
	for range n {
		ctx, cancel := context.WithCancel(context.Background())
		r := store.Start(ctx, srv.Client(t), store.Config{Prefix: "test:", Timeout: 2 * time.Second, RetryInterval: 50 * time.Millisecond, Logger: quietLogger()})
		t.Cleanup(func() {
			cancel()
			r.Wait()
		})
		if !r.Healthy() {
			t.Fatal("the store did not come up")
		}
		rs = append(rs, r)
	}
	return rs
}

// clientsFor returns n Clients of up: sharing one Redis (shared), or
// each on its own (single-node mode).
func clientsFor(t *testing.T, up *Config, n int, shared bool) []*Client {
	var cls []*Client
	var sts []*store.Redis
	if shared {
		sts = storesOn(t, redistest.Start(t), n)
	}
	for i := range n {
		o := Options{Logger: quietLogger()}
		if shared {
			o.Shared = sts[i]
		}
		cls = append(cls, NewClient(up, o))
	}
	return cls
}

// fetched is the outcome of a Fetch run in a goroutine.
type fetched struct {
	resp *Response
	err  error
}

// waits collects the "waiting for a slot in flight" events of fetches.
type waits chan string

func (w waits) report(path string) func(Event) {
	return func(ev Event) {
		if ev.Stage == StageRateLimited && strings.HasPrefix(ev.Detail, "waiting for one of") {
			w <- path + ": " + ev.Detail
		}
	}
}

func (w waits) wait(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-w:
		case <-time.After(slotWait):
			t.Fatalf("fewer than %d fetches waited for a slot within %v", n, slotWait)
		}
	}
}

func fetchAsync(ctx context.Context, cl *Client, fr FetchRequest, report func(Event)) <-chan fetched {
	ch := make(chan fetched, 1)
	go func() {
		resp, err := cl.Fetch(ctx, fr, report)
		ch <- fetched{resp, err}
	}()
	return ch
}

func waitFetched(t *testing.T, ch <-chan fetched) fetched {
	t.Helper()
	select {
	case f := <-ch:
		return f
	case <-time.After(slotWait):
		t.Fatalf("Fetch did not return within %v", slotWait)
		return fetched{}
	}
}

// TestMaxInFlightAcrossClients: three Clients (three instances) sharing
// one Redis, two slots in flight: the upstream never sees more than two
// requests at once, the others wait for a slot (and say so), and each
// answer hands a slot on, to a waiter of whichever instance, at once:
// the leases last a minute.
func TestMaxInFlightAcrossClients(t *testing.T) {
	g := newGate(t)
	up := slotsConfig(t, g.srv.URL, 2)
	cls := clientsFor(t, up, 3, true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const fetches = 6
	w := make(waits, fetches)
	var done []<-chan fetched
	for i := range fetches {
		path := "/doc" + string(rune('a'+i))
		done = append(done, fetchAsync(ctx, cls[i%len(cls)], FetchRequest{URL: g.srv.URL + path}, w.report(path)))
	}
	g.waitArrival(t)
	g.waitArrival(t)
	w.wait(t, fetches-2)
	g.noArrival(t, "two slots are taken")
	for i := range fetches {
		g.answer <- struct{}{} // one answers; a waiter takes its slot
		if i+2 < fetches {
			g.waitArrival(t)
		}
	}
	for _, ch := range done {
		if f := waitFetched(t, ch); f.err != nil || f.resp.StatusCode != http.StatusOK {
			t.Errorf("Fetch = %v, %v; want 200", f.resp, f.err)
		}
	}
	if _, most := g.counts(); most > 2 {
		t.Errorf("the upstream saw %d requests at once; want at most 2", most)
	}
	if shared, local := cls[0].InFlight(ctx); shared != 0 || local != 0 {
		t.Errorf("InFlight = %d, %d after every fetch; want 0, 0", shared, local)
	}
}

// modes runs fn with Clients sharing one Redis and in single-node mode.
func modes(t *testing.T, fn func(t *testing.T, shared bool)) {
	for _, shared := range []bool{true, false} {
		name := "single-node"
		if shared {
			name = "shared"
		}
		t.Run(name, func(t *testing.T) { fn(t, shared) })
	}
}

// TestMaxInFlightCutOff: a holder cut off (its context cancelled while
// its request is in progress) gives its slot back at once, to a fetch
// waiting on another instance, long before its lease would end.
func TestMaxInFlightCutOff(t *testing.T) {
	modes(t, func(t *testing.T, shared bool) {
		g := newGate(t)
		up := slotsConfig(t, g.srv.URL, 1)
		cls := clientsFor(t, up, 2, shared)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		hctx, cutOff := context.WithCancel(ctx)
		holder := fetchAsync(hctx, cls[0], FetchRequest{URL: g.srv.URL + "/held"}, nil)
		g.waitArrival(t)
		w := make(waits, 1)
		waiter := cls[0] // in single-node mode the slots are the instance's own
		if shared {
			waiter = cls[1]
		}
		next := fetchAsync(ctx, waiter, FetchRequest{URL: g.srv.URL + "/next"}, w.report("/next"))
		w.wait(t, 1)
		g.noArrival(t, "the one slot is taken")
		cutOff()
		if f := waitFetched(t, holder); f.err == nil {
			t.Errorf("the holder cut off: %v; want an error", f.resp)
		}
		if p := g.waitArrival(t); p != "/next" {
			t.Fatalf("%s reached the upstream; want /next", p)
		}
		g.answer <- struct{}{}
		if f := waitFetched(t, next); f.err != nil || f.resp.StatusCode != http.StatusOK {
			t.Errorf("the waiter: %v, %v; want 200", f.resp, f.err)
		}
	})
}

// TestMaxInFlightPerScope: each credential scope has slots of its own:
// while one scope's only slot is taken, another's fetch, and one without
// a credential, reach the upstream at once; the same scope's waits.
func TestMaxInFlightPerScope(t *testing.T) {
	modes(t, func(t *testing.T, shared bool) {
		g := newGate(t)
		up := slotsConfig(t, g.srv.URL, 1)
		cls := clientsFor(t, up, 2, shared)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		other := cls[0] // in single-node mode the slots are the instance's own
		if shared {
			other = cls[1]
		}
		var done []<-chan fetched
		for _, fr := range []FetchRequest{
			{URL: g.srv.URL + "/a", QuotaScope: "s/a"},
			{URL: g.srv.URL + "/b", QuotaScope: "s/b"},
			{URL: g.srv.URL + "/none"},
		} {
			done = append(done, fetchAsync(ctx, other, fr, nil))
			g.waitArrival(t)
		}
		w := make(waits, 1)
		done = append(done, fetchAsync(ctx, cls[0], FetchRequest{URL: g.srv.URL + "/a2", QuotaScope: "s/a"}, w.report("/a2")))
		w.wait(t, 1)
		g.noArrival(t, "scope s/a's one slot is taken")
		if shared {
			s := cls[0].Status(ctx)
			if s.MaxInFlight != 1 || s.InFlight != (InFlightCount{Held: 3, Busiest: 1, Scopes: 3}) {
				t.Errorf("Status: %d of %+v; want 3 held in 3 scopes, of 1", s.MaxInFlight, s.InFlight)
			}
		}
		for range done {
			g.answer <- struct{}{}
		}
		for _, ch := range done {
			if f := waitFetched(t, ch); f.err != nil || f.resp.StatusCode != http.StatusOK {
				t.Errorf("Fetch = %v, %v; want 200", f.resp, f.err)
			}
		}
	})
}

// TestMaxInFlightPastBound: a fetch whose wait bound ends before a slot
// frees fails like the rate limit, with ErrRateLimited and a
// retry-after, and says what it waited for.
func TestMaxInFlightPastBound(t *testing.T) {
	modes(t, func(t *testing.T, shared bool) {
		g := newGate(t)
		up := slotsConfig(t, g.srv.URL, 1)
		up.Protection.MaxWait = 50 * time.Millisecond
		cl := clientsFor(t, up, 1, shared)[0]
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		held := fetchAsync(ctx, cl, FetchRequest{URL: g.srv.URL + "/held"}, nil)
		g.waitArrival(t)
		var events []Event
		_, err := cl.Fetch(ctx, FetchRequest{URL: g.srv.URL + "/late"}, func(ev Event) { events = append(events, ev) })
		if !errors.Is(err, ErrRateLimited) || RetryAfter(err) <= 0 {
			t.Errorf("Fetch = %v; want ErrRateLimited with a retry-after", err)
		}
		if len(events) == 0 || events[0].Detail != "waiting for one of 1 slots in flight" {
			t.Errorf("events %+v; want a wait for one of 1 slots in flight first", events)
		}
		g.answer <- struct{}{}
		waitFetched(t, held)
		g.noArrival(t, "refused")
	})
}

// TestMaxInFlightRedisDown: with Redis down each instance caps its own
// requests in flight at MaxInFlight.
func TestMaxInFlightRedisDown(t *testing.T) {
	g := newGate(t)
	up := slotsConfig(t, g.srv.URL, 1)
	srv := redistest.Start(t)
	cl := NewClient(up, Options{Logger: quietLogger(), Shared: storesOn(t, srv, 1)[0]})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv.Kill()
	first := fetchAsync(ctx, cl, FetchRequest{URL: g.srv.URL + "/first"}, nil)
	g.waitArrival(t)
	w := make(waits, 1)
	second := fetchAsync(ctx, cl, FetchRequest{URL: g.srv.URL + "/second"}, w.report("/second"))
	w.wait(t, 1)
	g.noArrival(t, "the instance's one slot is taken")
	if s := cl.Status(ctx); s.Scope != "instance" || s.InFlight.Held != 1 {
		t.Errorf("Status = %s, %+v; want the instance's own slot held", s.Scope, s.InFlight)
	}
	g.answer <- struct{}{}
	g.waitArrival(t)
	g.answer <- struct{}{}
	for _, ch := range []<-chan fetched{first, second} {
		if f := waitFetched(t, ch); f.err != nil || f.resp.StatusCode != http.StatusOK {
			t.Errorf("Fetch = %v, %v; want 200", f.resp, f.err)
		}
	}
}

func TestMaxInFlightValidate(t *testing.T) {
	up := Config{Name: "up", BaseURL: "https://example.org"}
	up.Protection.MaxInFlight = -1
	SetDefaults(&up)
	if err := Validate(&up, "upstreams[0]"); err == nil || !strings.Contains(err.Error(), "max_in_flight") {
		t.Errorf("Validate = %v; want max_in_flight refused", err)
	}
}
