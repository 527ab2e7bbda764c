package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/logctx"
	"github.com/coordd/coordd/internal/testing/enginetest"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/server"
)

// The tests below call the HTTP door of real coordd instances over
// loopback, with net/http as the client.

// httpAnswer is one HTTP answer, its body read.
type httpAnswer struct {
	status int
	header http.Header
	body   []byte
}

// httpDo sends a request to the door of in and reads the answer.
func httpDo(t testing.TB, ctx context.Context, in *fleettest.Instance, method, path string, q url.Values, hdr http.Header, body io.Reader) httpAnswer {
	t.Helper()
	u := in.HTTPURL + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("%s %s: %v", method, u, err)
		return httpAnswer{}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Errorf("%s %s: body: %v", method, u, err)
	}
	return httpAnswer{status: resp.StatusCode, header: resp.Header, body: b}
}

// httpGetDoc gets the document at docURL from the door of in.
func httpGetDoc(t testing.TB, ctx context.Context, in *fleettest.Instance, docURL string, hdr http.Header) httpAnswer {
	t.Helper()
	return httpDo(t, ctx, in, http.MethodGet, server.HTTPDocumentsPath, url.Values{"url": {docURL}}, hdr, nil)
}

// httpErrorBody is the door's error body.
type httpErrorBody struct {
	Error struct {
		Code       int    `json:"code"`
		Status     string `json:"status"`
		Reason     string `json:"reason"`
		Message    string `json:"message"`
		RetryAfter int64  `json:"retry_after_seconds"`
	} `json:"error"`
}

// checkHTTPError checks that a is an error of the door with status want,
// and returns its body.
func checkHTTPError(t testing.TB, a httpAnswer, want int) httpErrorBody {
	t.Helper()
	var eb httpErrorBody
	if a.status != want {
		t.Errorf("status = %d (%s); want %d", a.status, a.body, want)
		return eb
	}
	if ct := a.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q; want application/json", ct)
	}
	if err := json.Unmarshal(a.body, &eb); err != nil || eb.Error.Code != want || eb.Error.Status == "" || eb.Error.Message == "" {
		t.Errorf("body = %s (%v); want {\"error\": {\"code\": %d, \"status\": …, \"message\": …}}", a.body, err, want)
	}
	if a.header.Get(server.HTTPSourceHeader) != "" {
		t.Errorf("an error carries %s", server.HTTPSourceHeader)
	}
	return eb
}

// waitMetric waits until metric (with labels) of in reaches want.
func waitMetric(t testing.TB, ctx context.Context, in *fleettest.Instance, want float64, metric string, labels ...string) {
	t.Helper()
	for {
		got := in.Scrape(t).Value(metric, labels...)
		if got >= want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s%v = %v; want %v", metric, labels, got, want)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// TestHTTPAndGRPCShareOneFlight: 10 HTTP and 10 gRPC callers of one cold
// document join one flight: the upstream sees one request, and every
// caller gets the body.
func TestHTTPAndGRPCShareOneFlight(t *testing.T) {
	const perProtocol = 10
	u := fakeupstream.New(t)
	in := fleettest.Start(t, fleettest.Options{HTTP: true, Metrics: true, Config: coordinator.Config{
		Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: u.URL()}},
	}})
	const path = "/docs/cold"
	release := make(chan struct{})
	u.Set(path, fakeupstream.Behavior{Block: release, Size: 200 << 10})
	want := fakeupstream.SizedBody(path, 200<<10)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := in.Dial(t)

	var wg sync.WaitGroup
	errs := make(chan string, 2*perProtocol)
	for i := range 2 * perProtocol {
		wg.Go(func() {
			if i%2 == 0 {
				a := httpGetDoc(t, ctx, in, u.URL()+path, nil)
				if a.status != http.StatusOK || !bytes.Equal(a.body, want) {
					errs <- fmt.Sprintf("http caller %d: status %d, %d bytes; want 200 and the %d-byte body", i, a.status, len(a.body), len(want))
				}
				if got := a.header.Get(server.HTTPSourceHeader); got != "upstream" {
					errs <- fmt.Sprintf("http caller %d: %s = %q; want upstream", i, server.HTTPSourceHeader, got)
				}
				return
			}
			d, err := fleettest.Get(ctx, cl, &coorddv1.GetOrFetchRequest{Url: u.URL() + path})
			if err != nil || !bytes.Equal(d.Body, want) {
				errs <- fmt.Sprintf("grpc caller %d: %v; want the body", i, err)
			}
		})
	}
	// Every caller is in: one leads the flight, the others joined it.
	if err := u.WaitCount(ctx, path, 1); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, ctx, in, 2*perProtocol-1, "coordd_followers_total", "scope", "local")
	close(release)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if got := u.Count(path); got != 1 {
		t.Errorf("upstream requests = %d; want 1", got)
	}
	s := in.Scrape(t)
	if got := s.Value("coordd_http_requests_total", "code", "200", "method", "get"); got != perProtocol {
		t.Errorf("coordd_http_requests_total{code=200} = %v; want %d", got, perProtocol)
	}
	if got := s.Value("coordd_requests_total", "source", "upstream"); got != 2*perProtocol {
		t.Errorf("coordd_requests_total{source=upstream} = %v; want %d (HTTP calls counted as gRPC ones)", got, 2*perProtocol)
	}
}

// TestHTTPDocumentHeaders: the answer carries the document's headers, a
// matching If-None-Match gets 304, and a 404 is a document.
func TestHTTPDocumentHeaders(t *testing.T) {
	u := fakeupstream.New(t)
	var logs enginetest.SyncBuffer
	log := slog.New(logctx.NewHandler(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	in := fleettest.Start(t, fleettest.Options{HTTP: true, Config: coordinator.Config{
		Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: u.URL()}},
		Logger:    log,
	}})
	const lastMod = "Wed, 21 Oct 2015 07:28:00 GMT"
	u.Set("/doc", fakeupstream.Behavior{Header: http.Header{"Content-Type": {"text/markdown; charset=utf-8"}, "Last-Modified": {lastMod}}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	doc := u.URL() + "/doc"

	a := httpGetDoc(t, ctx, in, doc, http.Header{"X-Request-Id": {"req-http-1"}})
	if a.status != http.StatusOK || !bytes.Equal(a.body, u.Body("/doc")) {
		t.Fatalf("first get: status %d, body %q; want 200 and the body", a.status, a.body)
	}
	for h, want := range map[string]string{
		"Content-Type":           "text/markdown; charset=utf-8",
		"ETag":                   u.ETag("/doc"),
		"Last-Modified":          lastMod,
		"Age":                    "0",
		"Content-Length":         strconv.Itoa(len(u.Body("/doc"))),
		server.HTTPSourceHeader:  "upstream",
		server.HTTPKeyHeader:     doc,
		"X-Request-Id":           "req-http-1",
		"X-Content-Type-Options": "nosniff",
	} {
		if got := a.header.Get(h); got != want {
			t.Errorf("%s = %q; want %q", h, got, want)
		}
	}
	if l := logs.String(); !strings.Contains(l, "request_id=req-http-1") || !strings.Contains(l, "protocol=http") || !strings.Contains(l, "grpc.code=OK") {
		t.Errorf("no call line with the request id and protocol=http in the log:\n%s", l)
	}

	tests := []struct {
		name       string
		inm        string
		wantStatus int
		wantBody   bool
	}{
		{"matching", u.ETag("/doc"), http.StatusNotModified, false},
		{"weak, in a list", `"other", W/` + u.ETag("/doc"), http.StatusNotModified, false},
		{"star", "*", http.StatusNotModified, false},
		{"another tag", `"other"`, http.StatusOK, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := httpGetDoc(t, ctx, in, doc, http.Header{"If-None-Match": {tt.inm}})
			if a.status != tt.wantStatus || (len(a.body) > 0) != tt.wantBody {
				t.Errorf("status %d, %d bytes; want %d, body %v", a.status, len(a.body), tt.wantStatus, tt.wantBody)
			}
			if got := a.header.Get("ETag"); got != u.ETag("/doc") {
				t.Errorf("ETag = %q; want %q", got, u.ETag("/doc"))
			}
			if got := a.header.Get(server.HTTPSourceHeader); got != "l1" {
				t.Errorf("%s = %q; want l1", server.HTTPSourceHeader, got)
			}
		})
	}

	u.Set("/missing", fakeupstream.Status(http.StatusNotFound))
	a = httpGetDoc(t, ctx, in, u.URL()+"/missing", nil)
	if a.status != http.StatusNotFound || string(a.body) != "Not Found\n" || a.header.Get(server.HTTPSourceHeader) != "upstream" {
		t.Errorf("404: status %d, body %q, source %q; want the upstream's 404 as a document", a.status, a.body, a.header.Get(server.HTTPSourceHeader))
	}
	if got := u.Total(); got != 2 {
		t.Errorf("upstream requests = %d; want 2", got)
	}
}

// TestHTTPBadInput: bad input is refused with 400/403/405 and a JSON body
// before any upstream request; a body over max_body_bytes is 413, and a
// failing upstream 503.
func TestHTTPBadInput(t *testing.T) {
	u := fakeupstream.New(t)
	in := fleettest.Start(t, fleettest.Options{HTTP: true, Config: coordinator.Config{
		Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: u.URL() + "/docs/", MaxBodyBytes: 1000, Protection: coordinator.Protection{
			Retry:   coordinator.RetryPolicy{MaxAttempts: 1},
			Breaker: coordinator.BreakerPolicy{FailureThreshold: -1, FailureRate: -1},
		}}},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	refused := []struct {
		name   string
		method string
		path   string
		q      url.Values
		want   int
	}{
		{"no url", http.MethodGet, server.HTTPDocumentsPath, nil, http.StatusBadRequest},
		{"relative url", http.MethodGet, server.HTTPDocumentsPath, url.Values{"url": {"/docs/x"}}, http.StatusBadRequest},
		{"path trick", http.MethodGet, server.HTTPDocumentsPath, url.Values{"url": {u.URL() + "/docs/%2e%2e/secret"}}, http.StatusBadRequest},
		{"negative max_age", http.MethodGet, server.HTTPDocumentsPath, url.Values{"url": {u.URL() + "/docs/x"}, "max_age": {"-1"}}, http.StatusBadRequest},
		{"bad max_age", http.MethodGet, server.HTTPDocumentsPath, url.Values{"url": {u.URL() + "/docs/x"}, "max_age": {"soon"}}, http.StatusBadRequest},
		{"bad no_stale", http.MethodGet, server.HTTPDocumentsPath, url.Values{"url": {u.URL() + "/docs/x"}, "no_stale": {"maybe"}}, http.StatusBadRequest},
		{"outside every upstream", http.MethodGet, server.HTTPDocumentsPath, url.Values{"url": {"https://evil.example/docs/x"}}, http.StatusForbidden},
		{"outside the base path", http.MethodGet, server.HTTPDocumentsPath, url.Values{"url": {u.URL() + "/private"}}, http.StatusForbidden},
		{"invalidate outside", http.MethodPost, server.HTTPInvalidatePath, url.Values{"url": {"https://evil.example/docs/x"}}, http.StatusForbidden},
		{"POST documents", http.MethodPost, server.HTTPDocumentsPath, url.Values{"url": {u.URL() + "/docs/x"}}, http.StatusMethodNotAllowed},
		{"GET invalidate", http.MethodGet, server.HTTPInvalidatePath, url.Values{"url": {u.URL() + "/docs/x"}}, http.StatusMethodNotAllowed},
		{"unknown path", http.MethodGet, "/v1/nothing", nil, http.StatusNotFound},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			checkHTTPError(t, httpDo(t, ctx, in, tt.method, tt.path, tt.q, nil, nil), tt.want)
		})
	}
	if got := u.Total(); got != 0 {
		t.Errorf("upstream requests = %d; want 0 (refused before any I/O)", got)
	}

	u.Set("/docs/huge", fakeupstream.Behavior{Size: 5000})
	if eb := checkHTTPError(t, httpGetDoc(t, ctx, in, u.URL()+"/docs/huge", nil), http.StatusRequestEntityTooLarge); eb.Error.Status != "FAILED_PRECONDITION" {
		t.Errorf("413: status %q; want FAILED_PRECONDITION", eb.Error.Status)
	}
	u.Set("/docs/down", fakeupstream.Status(http.StatusInternalServerError))
	a := httpGetDoc(t, ctx, in, u.URL()+"/docs/down", nil)
	if eb := checkHTTPError(t, a, http.StatusServiceUnavailable); eb.Error.Reason != "UPSTREAM_UNAVAILABLE" {
		t.Errorf("503: reason %q; want UPSTREAM_UNAVAILABLE", eb.Error.Reason)
	}
	if a.header.Get("Retry-After") != "1" {
		t.Errorf("503 without a known wait has Retry-After %q; want 1", a.header.Get("Retry-After"))
	}
	u.Set("/docs/slow", fakeupstream.Hang())
	a = httpDo(t, ctx, in, http.MethodGet, server.HTTPDocumentsPath, url.Values{"url": {u.URL() + "/docs/slow"}, "timeout": {"200ms"}}, nil, nil)
	checkHTTPError(t, a, http.StatusGatewayTimeout)
}

// TestHTTPRetryAfter: an open breaker is 503 and an exhausted rate limit
// 429 (testdata/http-rendering), with Retry-After in whole seconds, never
// below what coordd knows, and the reason that tells them apart.
func TestHTTPRetryAfter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	check := func(t *testing.T, a httpAnswer, status int, reason string, atLeast, atMost int64) {
		t.Helper()
		eb := checkHTTPError(t, a, status)
		if eb.Error.Reason != reason {
			t.Errorf("reason %q; want %s", eb.Error.Reason, reason)
		}
		ra, err := strconv.ParseInt(a.header.Get("Retry-After"), 10, 64)
		if err != nil || ra < atLeast || ra > atMost || eb.Error.RetryAfter != ra {
			t.Errorf("Retry-After %q, retry_after_seconds %d; want whole seconds in [%d, %d], the same in both", a.header.Get("Retry-After"), eb.Error.RetryAfter, atLeast, atMost)
		}
	}
	t.Run("breaker open", func(t *testing.T) {
		u := fakeupstream.New(t)
		in := fleettest.Start(t, fleettest.Options{HTTP: true, Config: coordinator.Config{
			Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: u.URL(), Protection: coordinator.Protection{
				Retry:   coordinator.RetryPolicy{MaxAttempts: 1},
				Breaker: coordinator.BreakerPolicy{FailureThreshold: 1, FailureRate: -1, OpenFor: 30 * time.Second},
			}}},
		}})
		u.Set(fakeupstream.AllPaths, fakeupstream.Status(http.StatusServiceUnavailable))
		checkHTTPError(t, httpGetDoc(t, ctx, in, u.URL()+"/a", nil), http.StatusServiceUnavailable) // opens it
		check(t, httpGetDoc(t, ctx, in, u.URL()+"/b", nil), http.StatusServiceUnavailable, "BREAKER_OPEN", 1, 30)
		if got := u.Total(); got != 1 {
			t.Errorf("upstream requests = %d; want 1 (the open breaker sends none)", got)
		}
	})
	t.Run("rate limit", func(t *testing.T) {
		u := fakeupstream.New(t)
		in := fleettest.Start(t, fleettest.Options{HTTP: true, Config: coordinator.Config{
			Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: u.URL(), Protection: coordinator.Protection{
				RateLimit: 1, MaxWait: 10 * time.Millisecond,
			}}},
		}})
		if a := httpGetDoc(t, ctx, in, u.URL()+"/a", nil); a.status != http.StatusOK {
			t.Fatalf("first get: %d; want 200 (it takes the slot)", a.status)
		}
		check(t, httpGetDoc(t, ctx, in, u.URL()+"/b", nil), http.StatusTooManyRequests, "RATE_LIMITED", 1, 2)
		if got := u.Count("/b"); got != 0 {
			t.Errorf("the refused call reached the upstream %d times", got)
		}
	})
}

// TestHTTPTenants: bearer tokens and tenants as over gRPC; invalidation
// for admins only, and seen by the next get.
func TestHTTPTenants(t *testing.T) {
	a, err := server.NewAuth(testTenants)
	if err != nil {
		t.Fatal(err)
	}
	u := fakeupstream.New(t)
	in := fleettest.Start(t, fleettest.Options{HTTP: true, ServerOptions: []server.Option{server.WithAuth(a)}, Config: coordinator.Config{
		Upstreams: []coordinator.Upstream{{Name: "a", BaseURL: u.URL() + "/a"}, {Name: "b", BaseURL: u.URL() + "/b"}},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	auth := func(v string) http.Header { return http.Header{"Authorization": {v}} }
	refused := []struct {
		name string
		hdr  http.Header
		doc  string
		want int
	}{
		{"no token", nil, "/a/x", http.StatusUnauthorized},
		{"wrong token", auth("Bearer not-a-token-of-anyone"), "/a/x", http.StatusUnauthorized},
		{"another scheme", auth("Basic " + tokenA), "/a/x", http.StatusUnauthorized},
		{"empty bearer", auth("Bearer "), "/a/x", http.StatusUnauthorized},
		{"upstream not granted", auth("Bearer " + tokenA), "/b/x", http.StatusForbidden},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			a := httpGetDoc(t, ctx, in, u.URL()+tt.doc, tt.hdr)
			checkHTTPError(t, a, tt.want)
			if tt.want == http.StatusUnauthorized && !strings.HasPrefix(a.header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("WWW-Authenticate = %q; want Bearer", a.header.Get("WWW-Authenticate"))
			}
		})
	}
	if got := u.Total(); got != 0 {
		t.Fatalf("upstream requests = %d; want 0", got)
	}
	if a := httpGetDoc(t, ctx, in, u.URL()+"/a/x", auth("bearer "+tokenA)); a.status != http.StatusOK || !bytes.Equal(a.body, u.Body("/a/x")) {
		t.Fatalf("granted get: %d %q", a.status, a.body)
	}
	inval := func(token string, body string) httpAnswer {
		return httpDo(t, ctx, in, http.MethodPost, server.HTTPInvalidatePath, nil,
			http.Header{"Authorization": {"Bearer " + token}, "Content-Type": {"application/json"}}, strings.NewReader(body))
	}
	checkHTTPError(t, inval(tokenB, `{"url": "`+u.URL()+`/b/x"}`), http.StatusForbidden) // not an admin
	checkHTTPError(t, inval(tokenA, `{"url": 1}`), http.StatusBadRequest)
	ans := inval(tokenA, `{"url": "`+u.URL()+`/a/x"}`)
	var got struct {
		Key     string `json:"key"`
		Existed bool   `json:"existed"`
	}
	// existed reports the shared cache (L2), which single-node mode has not.
	if err := json.Unmarshal(ans.body, &got); ans.status != http.StatusOK || err != nil || got.Key != u.URL()+"/a/x" {
		t.Fatalf("invalidate: %d %s; want 200 and the key", ans.status, ans.body)
	}
	if a := httpGetDoc(t, ctx, in, u.URL()+"/a/x", auth("Bearer "+tokenA)); a.header.Get(server.HTTPSourceHeader) != "upstream" {
		t.Errorf("get after invalidate: source %q; want upstream", a.header.Get(server.HTTPSourceHeader))
	}
	if got := u.Count("/a/x"); got != 2 {
		t.Errorf("upstream requests = %d; want 2 (fetched again after the invalidation)", got)
	}
}

// TestHTTPUnknownParameter: a query (or form) parameter the door does not
// know is refused with 400, naming it and saying that the url must be
// percent-encoded, since the usual cause is an upstream url's own "&"
// left unencoded, which would otherwise cut the url short without a word.
// The parameters the door knows still work, together.
func TestHTTPUnknownParameter(t *testing.T) {
	u := fakeupstream.New(t)
	in := fleettest.Start(t, fleettest.Options{HTTP: true, Config: coordinator.Config{
		Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: u.URL() + "/docs/"}},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	doc := u.URL() + "/docs/x?a=1&b=2"
	form := http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}
	refused := []struct {
		name, method, target string
		hdr                  http.Header
		body                 string
		unknown              string
	}{
		{"url not encoded", http.MethodGet, server.HTTPDocumentsPath + "?url=" + doc, nil, "", "b"},
		{"url not encoded, known parameter after", http.MethodGet, server.HTTPDocumentsPath + "?url=" + doc + "&max_age=30", nil, "", "b"},
		{"misspelt parameter", http.MethodGet, server.HTTPDocumentsPath + "?" + url.Values{"url": {doc}, "maxage": {"30"}}.Encode(), nil, "", "maxage"},
		{"parameter in another case", http.MethodGet, server.HTTPDocumentsPath + "?" + url.Values{"URL": {doc}}.Encode(), nil, "", "URL"},
		{"HEAD", http.MethodHead, server.HTTPDocumentsPath + "?url=" + doc, nil, "", "b"},
		{"invalidate query", http.MethodPost, server.HTTPInvalidatePath + "?url=" + doc, nil, "", "b"},
		{"invalidate form", http.MethodPost, server.HTTPInvalidatePath, form, "url=" + doc, "b"},
		{"invalidate max_age", http.MethodPost, server.HTTPInvalidatePath + "?" + url.Values{"url": {doc}, "max_age": {"1"}}.Encode(), nil, "", "max_age"},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			a := httpDo(t, ctx, in, tt.method, tt.target, nil, tt.hdr, strings.NewReader(tt.body))
			if tt.method == http.MethodHead {
				if a.status != http.StatusBadRequest {
					t.Errorf("status = %d; want 400", a.status)
				}
				return
			}
			eb := checkHTTPError(t, a, http.StatusBadRequest)
			if msg := eb.Error.Message; !strings.Contains(msg, strconv.Quote(tt.unknown)) || !strings.Contains(msg, "percent-encode") {
				t.Errorf("message %q; want it to name %q and say the url must be percent-encoded", msg, tt.unknown)
			}
		})
	}
	if got := u.Total(); got != 0 {
		t.Fatalf("upstream requests = %d; want 0 (refused before any I/O)", got)
	}

	// Every parameter the door knows, the url encoded: its query reaches
	// the upstream whole.
	q := url.Values{"url": {doc}, "key": {"k1"}, "max_age": {"30"}, "no_stale": {"true"}, "timeout": {"10s"}}
	a := httpDo(t, ctx, in, http.MethodGet, server.HTTPDocumentsPath, q, nil, nil)
	if a.status != http.StatusOK || a.header.Get(server.HTTPKeyHeader) != "k1" {
		t.Fatalf("get with every known parameter: status %d, key %q (%s); want 200 and key k1", a.status, a.header.Get(server.HTTPKeyHeader), a.body)
	}
	if got := u.RequestURIs(); len(got) != 1 || got[0] != "/docs/x?a=1&b=2" {
		t.Errorf("upstream request URIs = %q; want [/docs/x?a=1&b=2]", got)
	}
	for _, tt := range []struct {
		name, target string
		hdr          http.Header
		body         string
	}{
		{"invalidate query", server.HTTPInvalidatePath + "?" + url.Values{"url": {doc}, "key": {"k1"}}.Encode(), nil, ""},
		{"invalidate form", server.HTTPInvalidatePath, form, url.Values{"url": {doc}, "key": {"k1"}}.Encode()},
		{"invalidate key only", server.HTTPInvalidatePath + "?key=k1", nil, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if a := httpDo(t, ctx, in, http.MethodPost, tt.target, nil, tt.hdr, strings.NewReader(tt.body)); a.status != http.StatusOK {
				t.Errorf("status %d (%s); want 200", a.status, a.body)
			}
		})
	}
}
