package fakeupstream_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/testing/fakeupstream"
)

const docPath = "/en-US/docs/Web/HTTP"

type result struct {
	status int
	header http.Header
	body   []byte
}

// get fetches path from u with a client that does not follow redirects.
func get(t *testing.T, u *fakeupstream.Upstream, path string, header http.Header) (result, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u.URL()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	c := u.Client()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	c.Timeout = 10 * time.Second
	resp, err := c.Do(req)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return result{resp.StatusCode, resp.Header, body}, err
}

func mustGet(t *testing.T, u *fakeupstream.Upstream, path string, header http.Header) result {
	t.Helper()
	r, err := get(t, u, path, header)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return r
}

func TestDefault(t *testing.T) {
	u := fakeupstream.New(t)
	r := mustGet(t, u, docPath+"?q=1", http.Header{"User-Agent": {"coordd-test"}})
	if r.status != http.StatusOK {
		t.Fatalf("status = %d; want 200", r.status)
	}
	if !bytes.Equal(r.body, u.Body(docPath)) {
		t.Fatalf("body = %q; want Body(%q)", r.body, docPath)
	}
	if len(r.body) != fakeupstream.DefaultSize {
		t.Errorf("len(body) = %d; want %d", len(r.body), fakeupstream.DefaultSize)
	}
	if got, want := r.header.Get("Content-Type"), "text/html; charset=utf-8"; got != want {
		t.Errorf("Content-Type = %q; want %q", got, want)
	}
	if got, want := r.header.Get("ETag"), u.ETag(docPath); got != want || got == "" {
		t.Errorf("ETag = %q; want %q", got, want)
	}
	if bytes.Equal(u.Body("/a"), u.Body("/b")) {
		t.Errorf("Body(/a) == Body(/b); want bodies to differ by path")
	}
	if got := u.Count(docPath); got != 1 {
		t.Errorf("Count = %d; want 1 (query ignored)", got)
	}
	if got := u.Total(); got != 1 {
		t.Errorf("Total = %d; want 1", got)
	}
	if got := u.LastHeader(docPath).Get("User-Agent"); got != "coordd-test" {
		t.Errorf("LastHeader User-Agent = %q; want coordd-test", got)
	}
	if got := u.LastHeader("/never"); got != nil {
		t.Errorf("LastHeader(/never) = %v; want nil", got)
	}
	if got := u.Paths(); len(got) != 1 || got[0] != docPath {
		t.Errorf("Paths = %v; want [%s]", got, docPath)
	}
}

func TestScripts(t *testing.T) {
	retry := fakeupstream.Status(http.StatusTooManyRequests).WithHeader("Retry-After", "1")
	tests := []struct {
		name    string
		program func(u *fakeupstream.Upstream)
		want    []int // statuses of successive requests to docPath
	}{
		{"default", func(*fakeupstream.Upstream) {}, []int{200, 200}},
		{"always 503", func(u *fakeupstream.Upstream) {
			u.Set(docPath, fakeupstream.Status(503))
		}, []int{503, 503, 503}},
		{"429 twice then 200", func(u *fakeupstream.Upstream) {
			u.SetSequence(docPath, []fakeupstream.Behavior{retry, retry, {}})
		}, []int{429, 429, 200, 200}},
		{"sequence last repeats", func(u *fakeupstream.Upstream) {
			u.SetSequence(docPath, []fakeupstream.Behavior{{}, fakeupstream.Status(500)})
		}, []int{200, 500, 500}},
		{"cycle", func(u *fakeupstream.Upstream) {
			u.SetCycle(docPath, []fakeupstream.Behavior{fakeupstream.Status(503), {}})
		}, []int{503, 200, 503, 200}},
		{"fail every 3rd", func(u *fakeupstream.Upstream) {
			u.FailEvery(docPath, 3, fakeupstream.Status(502))
		}, []int{200, 200, 502, 200, 200, 502}},
		{"all paths", func(u *fakeupstream.Upstream) {
			u.Set(fakeupstream.AllPaths, fakeupstream.Status(404))
		}, []int{404, 404}},
		{"path beats all paths", func(u *fakeupstream.Upstream) {
			u.Set(fakeupstream.AllPaths, fakeupstream.Status(404))
			u.Set(docPath, fakeupstream.Status(410))
		}, []int{410}},
		{"clear", func(u *fakeupstream.Upstream) {
			u.Set(docPath, fakeupstream.Status(500))
			u.Clear(docPath)
		}, []int{200}},
		{"empty sequence clears", func(u *fakeupstream.Upstream) {
			u.Set(docPath, fakeupstream.Status(500))
			u.SetSequence(docPath, nil)
		}, []int{200}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := fakeupstream.New(t)
			tt.program(u)
			for i, want := range tt.want {
				r := mustGet(t, u, docPath, nil)
				if r.status != want {
					t.Fatalf("request %d: status = %d; want %d", i+1, r.status, want)
				}
			}
			if got := u.Count(docPath); got != len(tt.want) {
				t.Errorf("Count = %d; want %d", got, len(tt.want))
			}
		})
	}
}

func TestRetryAfterHeaderAndBody(t *testing.T) {
	u := fakeupstream.New(t)
	u.Set(docPath, fakeupstream.Status(429).WithHeader("Retry-After", "1"))
	r := mustGet(t, u, docPath, nil)
	if got := r.header.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After = %q; want 1", got)
	}
	if got, want := string(r.body), "Too Many Requests\n"; got != want {
		t.Errorf("body = %q; want %q", got, want)
	}
	if r.header.Get("ETag") != "" {
		t.Errorf("429 carries ETag %q; want none", r.header.Get("ETag"))
	}
}

func TestAllPathsCountsPerPath(t *testing.T) {
	u := fakeupstream.New(t)
	u.SetSequence(fakeupstream.AllPaths, []fakeupstream.Behavior{fakeupstream.Status(503), {}})
	for _, p := range []string{"/a", "/b"} {
		for i, want := range []int{503, 200} {
			if r := mustGet(t, u, p, nil); r.status != want {
				t.Fatalf("%s request %d: status = %d; want %d", p, i+1, r.status, want)
			}
		}
	}
}

func TestSizeBodyAndHandler(t *testing.T) {
	u := fakeupstream.New(t)
	u.Set("/big", fakeupstream.Behavior{Size: 100_000})
	u.Set("/fixed", fakeupstream.Behavior{Status: 201, Body: []byte("hello")})
	u.Set("/h", fakeupstream.Behavior{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTeapot)
	})})

	r := mustGet(t, u, "/big", nil)
	if len(r.body) != 100_000 || !bytes.Equal(r.body, fakeupstream.SizedBody("/big", 100_000)) {
		t.Errorf("/big: len(body) = %d; want SizedBody of 100000", len(r.body))
	}
	if got := r.header.Get("Content-Length"); got != "100000" {
		t.Errorf("/big: Content-Length = %q; want 100000", got)
	}
	if r := mustGet(t, u, "/fixed", nil); r.status != 201 || string(r.body) != "hello" {
		t.Errorf("/fixed = %d %q; want 201 hello", r.status, r.body)
	}
	if r := mustGet(t, u, "/h", nil); r.status != http.StatusTeapot {
		t.Errorf("/h status = %d; want 418", r.status)
	}
}

func TestRedirect(t *testing.T) {
	u := fakeupstream.New(t)
	u.Set("/old", fakeupstream.Redirect("/new"))
	r := mustGet(t, u, "/old", nil)
	if r.status != http.StatusFound || r.header.Get("Location") != "/new" {
		t.Fatalf("got %d Location %q; want 302 Location /new", r.status, r.header.Get("Location"))
	}
	// A following client lands on /new.
	resp, err := u.Client().Get(u.URL() + "/old")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || u.Count("/new") != 1 {
		t.Fatalf("followed redirect: status %d, Count(/new) %d; want 200, 1", resp.StatusCode, u.Count("/new"))
	}
}

func TestRequestURIs(t *testing.T) {
	u := fakeupstream.New(t)
	mustGet(t, u, "/a/..%2fb?q=1", nil)
	mustGet(t, u, "/c", nil)
	if got, want := u.RequestURIs(), []string{"/a/..%2fb?q=1", "/c"}; !slices.Equal(got, want) {
		t.Fatalf("RequestURIs() = %q; want %q", got, want)
	}
	if got := u.Paths(); !slices.Equal(got, []string{"/a/../b", "/c"}) {
		t.Errorf("Paths() = %q; want the decoded paths", got)
	}
	u.Reset()
	if got := u.RequestURIs(); len(got) != 0 {
		t.Errorf("after Reset, RequestURIs() = %q; want none", got)
	}
}

func TestConditional(t *testing.T) {
	tests := []struct {
		name        string
		b           fakeupstream.Behavior
		inm         string
		wantStatus  int
		wantETag    string
		wantBodyLen int
	}{
		{"match", fakeupstream.Behavior{Conditional: true}, "", 304, "", 0},
		{"weak match", fakeupstream.Behavior{Conditional: true}, "W/", 304, "", 0},
		{"star", fakeupstream.Behavior{Conditional: true}, "*", 304, "", 0},
		{"mismatch", fakeupstream.Behavior{Conditional: true}, `"nope"`, 200, "", fakeupstream.DefaultSize},
		{"explicit etag", fakeupstream.Behavior{Conditional: true, ETag: `"v2"`}, `"v1", "v2"`, 304, `"v2"`, 0},
		{"not asked", fakeupstream.Behavior{}, "", 200, "", fakeupstream.DefaultSize},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := fakeupstream.New(t)
			u.Set(docPath, tt.b)
			etag := tt.wantETag
			if etag == "" {
				etag = u.ETag(docPath)
			}
			inm := tt.inm
			switch inm {
			case "":
				inm = etag
			case "W/":
				inm = "W/" + etag
			}
			r := mustGet(t, u, docPath, http.Header{"If-None-Match": {inm}})
			if r.status != tt.wantStatus || len(r.body) != tt.wantBodyLen {
				t.Fatalf("got %d with %d bytes; want %d with %d", r.status, len(r.body), tt.wantStatus, tt.wantBodyLen)
			}
			if got := r.header.Get("ETag"); got != etag {
				t.Errorf("ETag = %q; want %q", got, etag)
			}
			if u.Count(docPath) != 1 {
				t.Errorf("Count = %d; want 1", u.Count(docPath))
			}
		})
	}
}

func TestHangUntilClientGivesUp(t *testing.T) {
	u := fakeupstream.New(t)
	u.Set(docPath, fakeupstream.Hang())
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u.URL()+docPath, nil)
	_, err := u.Client().Do(req)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v; want context.DeadlineExceeded", err)
	}
	if u.Count(docPath) != 1 {
		t.Fatalf("Count = %d; want 1", u.Count(docPath))
	}
}

func TestDelayOutlastsClient(t *testing.T) {
	u := fakeupstream.New(t)
	u.Set(docPath, fakeupstream.Behavior{Delay: time.Hour})
	c := u.Client()
	c.Timeout = 50 * time.Millisecond
	_, err := c.Get(u.URL() + docPath)
	var te interface{ Timeout() bool }
	if !errors.As(err, &te) || !te.Timeout() {
		t.Fatalf("err = %v; want a timeout", err)
	}
}

func TestBlockHoldsRequestInFlight(t *testing.T) {
	u := fakeupstream.New(t)
	release := make(chan struct{})
	u.Set(docPath, fakeupstream.Behavior{Block: release, Status: 202})
	done := make(chan result, 1)
	go func() {
		resp, err := u.Client().Get(u.URL() + docPath)
		if err != nil {
			done <- result{}
			return
		}
		resp.Body.Close()
		done <- result{status: resp.StatusCode}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := u.WaitCount(ctx, docPath, 1); err != nil {
		t.Fatalf("WaitCount: %v", err)
	}
	select {
	case r := <-done:
		t.Fatalf("request finished while blocked: %+v", r)
	default:
	}
	close(release)
	if r := <-done; r.status != 202 {
		t.Fatalf("status after release = %d; want 202", r.status)
	}
}

func TestWaitCountHonoursContext(t *testing.T) {
	u := fakeupstream.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := u.WaitCount(ctx, docPath, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitCount = %v; want context.Canceled", err)
	}
}

func TestResetConnection(t *testing.T) {
	u := fakeupstream.New(t)
	u.Set(docPath, fakeupstream.ResetConnection())
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	_, err := c.Get(u.URL() + docPath)
	if err == nil {
		t.Fatalf("GET succeeded; want a network error")
	}
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
		t.Errorf("err = %v; want connection reset", err)
	}
	if u.Count(docPath) != 1 {
		t.Errorf("Count = %d; want 1", u.Count(docPath))
	}
}

func TestResetRewinds(t *testing.T) {
	u := fakeupstream.New(t)
	u.SetSequence(docPath, []fakeupstream.Behavior{fakeupstream.Status(503), {}})
	mustGet(t, u, docPath, nil)
	mustGet(t, u, docPath, nil)
	u.Reset()
	if u.Count(docPath) != 0 || u.Total() != 0 || len(u.Times(docPath)) != 0 || u.LastHeader(docPath) != nil {
		t.Fatalf("after Reset: Count %d Total %d Times %v; want all empty", u.Count(docPath), u.Total(), u.Times(docPath))
	}
	if r := mustGet(t, u, docPath, nil); r.status != 503 {
		t.Fatalf("first request after Reset: status %d; want 503 (script rewound)", r.status)
	}
}

func TestCloseReleasesAndRefuses(t *testing.T) {
	u := fakeupstream.New(t)
	u.Set(docPath, fakeupstream.Hang())
	errc := make(chan error, 1)
	go func() {
		_, err := u.Client().Get(u.URL() + docPath)
		errc <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := u.WaitCount(ctx, docPath, 1); err != nil {
		t.Fatalf("WaitCount: %v", err)
	}
	u.Close()
	u.Close() // idempotent
	if err := <-errc; err == nil {
		t.Errorf("hung request succeeded after Close; want an error")
	}
	c := &http.Client{Timeout: 5 * time.Second}
	if _, err := c.Get(u.URL() + docPath); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("GET after Close: err %v; want connection refused", err)
	}
}

func TestConcurrentRequestsAndScripting(t *testing.T) {
	u := fakeupstream.New(t)
	const n = 50
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			p := "/p" + strconv.Itoa(i%5)
			if i%10 == 0 {
				u.FailEvery(p, 2, fakeupstream.Status(503))
			}
			resp, err := u.Client().Get(u.URL() + p)
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			_ = u.Count(p)
			_ = u.Times(p)
		})
	}
	wg.Wait()
	if got := u.Total(); got != n {
		t.Fatalf("Total = %d; want %d", got, n)
	}
	sum := 0
	for _, p := range u.Paths() {
		times := u.Times(p)
		if len(times) != u.Count(p) {
			t.Errorf("%s: len(Times) = %d; want Count %d", p, len(times), u.Count(p))
		}
		for i := 1; i < len(times); i++ {
			if times[i].Before(times[i-1]) {
				t.Errorf("%s: Times not in order: %v", p, times)
			}
		}
		sum += u.Count(p)
	}
	if sum != n {
		t.Fatalf("sum of Count = %d; want %d", sum, n)
	}
}

func TestWithHeaderCopies(t *testing.T) {
	base := fakeupstream.Status(429).WithHeader("Retry-After", "1")
	other := base.WithHeader("Retry-After", "2")
	if got := base.Header.Values("Retry-After"); len(got) != 1 {
		t.Fatalf("base Retry-After = %v; want [1] (WithHeader must not modify its receiver)", got)
	}
	if got := other.Header.Values("Retry-After"); len(got) != 2 {
		t.Fatalf("other Retry-After = %v; want [1 2]", got)
	}
}
