package fakeapi

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/testing/testclock"
)

// get requests path as token and returns the answer, its body read.
func get(t *testing.T, ctx context.Context, a *API, path, token string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.URL()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp
}

// start is a whole second plus 400 ms, so that a window starting in it
// starts 400 ms before it.
var start = time.Unix(1_800_000_000, 400_000_000)

func TestPrimaryLimitHeaders(t *testing.T) {
	clock := testclock.New(start)
	a := New(t, Options{Tokens: map[string]string{"tok-a": "alice"}, Limit: 3, SearchLimit: 2, Window: 2 * time.Second, Now: clock.Now})
	ctx := context.Background()
	reset := strconv.FormatInt(start.Truncate(time.Second).Add(2*time.Second).Unix(), 10)
	for i, c := range []struct {
		name, path                string
		code                      int
		remaining, used, resource string
		retryAfter                string
	}{
		{"first", "/user", 200, "2", "1", "core", ""},
		{"second", "/repos/o/r/readme", 200, "1", "2", "core", ""},
		{"search counts apart", "/search/issues?q=x", 200, "1", "1", "search", ""},
		{"third", "/repos/o/r/issues", 200, "0", "3", "core", ""},
		{"past the limit: 403, no Retry-After", "/user", 403, "0", "3", "core", ""},
	} {
		resp := get(t, ctx, a, c.path, "tok-a")
		h := resp.Header
		limit := "3"
		if c.resource == "search" {
			limit = "2"
		}
		for _, f := range []struct{ name, got, want string }{
			{"status", strconv.Itoa(resp.StatusCode), strconv.Itoa(c.code)},
			{"x-ratelimit-limit", h.Get("X-RateLimit-Limit"), limit},
			{"x-ratelimit-remaining", h.Get("X-RateLimit-Remaining"), c.remaining},
			{"x-ratelimit-reset", h.Get("X-RateLimit-Reset"), reset},
			{"x-ratelimit-used", h.Get("X-RateLimit-Used"), c.used},
			{"x-ratelimit-resource", h.Get("X-RateLimit-Resource"), c.resource},
			{"retry-after", h.Get("Retry-After"), c.retryAfter},
		} {
			if f.got != f.want {
				t.Errorf("%d %s: %s: got %q; want %q", i, c.name, f.name, f.got, f.want)
			}
		}
	}
	got := a.Stats("alice")
	want := Stats{Served: 4, Refused403: 1, MaxConcurrent: 1, Windows: 2, MaxWindowRequests: 4}
	if got != want {
		t.Errorf("stats: got %+v; want %+v", got, want)
	}

	// The window ends at the reset: a fresh one begins, and the count
	// of the worst window stays.
	clock.Advance(1600 * time.Millisecond)
	resp := get(t, ctx, a, "/user", "tok-a")
	if resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Remaining") != "2" || resp.Header.Get("X-RateLimit-Reset") != strconv.FormatInt(start.Unix()+4, 10) {
		t.Errorf("after the reset: got %d, remaining %s, reset %s; want 200, 2, %d", resp.StatusCode,
			resp.Header.Get("X-RateLimit-Remaining"), resp.Header.Get("X-RateLimit-Reset"), start.Unix()+4)
	}
	if st := a.Stats("alice"); st.Windows != 3 || st.MaxWindowRequests != 4 || st.Served != 5 {
		t.Errorf("after the reset: got %+v; want 3 windows, at most 4 requests in one, 5 served", st)
	}
}

func TestPrimaryLimitStatus(t *testing.T) {
	for _, c := range []struct {
		name   string
		status int
		want   Stats
	}{
		{"default 403", 0, Stats{Served: 1, Refused403: 2, MaxConcurrent: 1, Windows: 1, MaxWindowRequests: 3}},
		{"429", http.StatusTooManyRequests, Stats{Served: 1, Refused429: 2, MaxConcurrent: 1, Windows: 1, MaxWindowRequests: 3}},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := testclock.New(start)
			a := New(t, Options{Tokens: map[string]string{"tok-b": "bob"}, Limit: 1, Window: time.Minute, LimitStatus: c.status, Now: clock.Now})
			var last *http.Response
			for range 3 {
				last = get(t, context.Background(), a, "/user", "tok-b")
			}
			want := c.status
			if want == 0 {
				want = http.StatusForbidden
			}
			if last.StatusCode != want || last.Header.Get("X-RateLimit-Remaining") != "0" {
				t.Errorf("got %d, remaining %q; want %d, 0", last.StatusCode, last.Header.Get("X-RateLimit-Remaining"), want)
			}
			if got := a.Stats("bob"); got != c.want {
				t.Errorf("stats: got %+v; want %+v", got, c.want)
			}
		})
	}
}

func TestSecondaryLimit(t *testing.T) {
	clock := testclock.New(start)
	// Delay holds every admitted request in flight until its caller gives
	// up (see hold).
	a := New(t, Options{Tokens: map[string]string{"tok-a": "alice", "tok-c": "carol"}, Limit: 10, Window: time.Minute,
		MaxConcurrent: 1, SecondaryRetryAfter: 1500 * time.Millisecond, Delay: time.Hour, Now: clock.Now})
	releaseA := hold(t, a, "alice", "tok-a")
	resp := get(t, context.Background(), a, "/user", "tok-a")
	if resp.StatusCode != http.StatusForbidden || resp.Header.Get("Retry-After") != "2" || resp.Header.Get("X-RateLimit-Remaining") != "9" {
		t.Errorf("second concurrent request: got %d, Retry-After %q, remaining %q; want 403, 2, 9",
			resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("X-RateLimit-Remaining"))
	}
	// Another login is not held back.
	releaseC := hold(t, a, "carol", "tok-c")
	releaseC()
	releaseA()
	// Once the held request has left, the next one is admitted.
	hold(t, a, "alice", "tok-a")()
	got := a.Stats("alice")
	want := Stats{Served: 2, Refused403: 1, Secondary: 1, MaxConcurrent: 1, Windows: 1, MaxWindowRequests: 3}
	if got != want {
		t.Errorf("alice: got %+v; want %+v", got, want)
	}
	if got := a.Stats("carol"); got.Served != 1 || got.Secondary != 0 {
		t.Errorf("carol: got %+v; want 1 served, none refused", got)
	}
}

// hold starts a request of login (as token) that a's Delay keeps in
// flight, waits until a has admitted it, and returns the function that
// ends it and waits for it to leave.
func hold(t *testing.T, a *API, login, token string) (release func()) {
	t.Helper()
	before := a.Stats(login).Served
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, a.URL()+"/user", nil)
		req.Header.Set("Authorization", "token "+token)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_ = resp.Body.Close()
		} else if !errors.Is(err, context.Canceled) {
			t.Errorf("held request: %v", err)
		}
	}()
	// A bound for a stuck server, not a speed check.
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	if !a.waitUntil(wctx, func() bool { return a.Stats(login).Served != before }) {
		wcancel()
		t.Fatalf("the held request of %s was never admitted", login)
	}
	return func() {
		defer wcancel()
		cancel()
		<-done
		// The server's handler ends on its own goroutine once it sees the
		// cancellation; wait until it has left.
		if !a.waitUntil(wctx, func() bool { return a.inFlightOf(login) == 0 }) {
			t.Fatalf("the held request of %s never left", login)
		}
	}
}

// TestLimitsOff checks the behaviour the credential tests rely on: without
// Window, an hour's Limit that never resets, and no Stats.
func TestLimitsOff(t *testing.T) {
	a := New(t, Options{Tokens: map[string]string{"tok-a": "alice"}, Limit: 2})
	ctx := context.Background()
	var codes []int
	for range 3 {
		codes = append(codes, get(t, ctx, a, "/user", "tok-a").StatusCode)
	}
	resp := get(t, ctx, a, "/user", "tok-a")
	if codes[0] != 200 || codes[1] != 200 || codes[2] != 403 || resp.Header.Get("Retry-After") == "" || resp.Header.Get("X-RateLimit-Limit") != "2" {
		t.Errorf("got %v then %d (Retry-After %q, limit %q); want 200 200 403, then 403 with a Retry-After and limit 2",
			codes, resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("X-RateLimit-Limit"))
	}
	if st := a.Stats("alice"); st != (Stats{}) {
		t.Errorf("stats: got %+v; want none without limits", st)
	}
	if n := a.Requests("/user", "alice"); n != 4 {
		t.Errorf("requests: got %d; want 4", n)
	}
}

// inFlightOf returns how many of login's requests are being served.
func (a *API) inFlightOf(login string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inFlight[login]
}
