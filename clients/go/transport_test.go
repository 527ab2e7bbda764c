package coordd_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	coordd "github.com/coordd/coordd/clients/go"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
)

// signalWait bounds a wait for a signal that should come at once; it only
// turns a hang into a failure.
const signalWait = 10 * time.Second

// await fails t unless ch is closed within signalWait.
func await(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(signalWait):
		t.Fatalf("gave up after %v waiting for %s", signalWait, what)
	}
}

// viaCoordd returns an *http.Client whose requests go through the coordd
// at addr.
func viaCoordd(t *testing.T, addr string, copts []coordd.Option, topts ...coordd.TransportOption) *http.Client {
	t.Helper()
	return &http.Client{Transport: coordd.NewTransport(dial(t, addr, copts...), topts...)}
}

func mdEvent(md *coorddv1.Metadata) *coorddv1.GetOrFetchResponse {
	return &coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Metadata{Metadata: md}}
}

func chunkEvent(data string) *coorddv1.GetOrFetchResponse {
	return &coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Chunk{Chunk: &coorddv1.Chunk{Data: []byte(data)}}}
}

func send(st grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse], evs ...*coorddv1.GetOrFetchResponse) error {
	for _, ev := range evs {
		if err := st.Send(ev); err != nil {
			return err
		}
	}
	return nil
}

// events is a step that sends evs and ends the stream.
func events(evs ...*coorddv1.GetOrFetchResponse) step {
	return func(st grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse]) error { return send(st, evs...) }
}

// failStatus answers with st.
func failStatus(st *status.Status) step {
	return func(grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse]) error { return st.Err() }
}

func retryIn(code codes.Code, msg string, d time.Duration) *status.Status {
	st, err := status.New(code, msg).WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
	if err != nil {
		panic(err)
	}
	return st
}

func get(t *testing.T, hc *http.Client, ctx context.Context, method, u string, h http.Header) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range h {
		req.Header[k] = vs
	}
	return hc.Do(req)
}

// spanContext is a context holding a sampled span, as a traced program's
// has, and the traceparent that carries it.
func spanContext(t *testing.T) (context.Context, string) {
	t.Helper()
	tid, err := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	if err != nil {
		t.Fatal(err)
	}
	sid, err := trace.SpanIDFromHex("00f067aa0ba902b7")
	if err != nil {
		t.Fatal(err)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
	return trace.ContextWithSpanContext(context.Background(), sc), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
}

// TestTransportRequest: the url goes without userinfo and fragment, the
// headers go in headers, Authorization goes in credential alone (or the
// header WithCredentialHeader names), HEAD asks for the metadata only, and
// the span's traceparent goes along, from the transport and from Get.
func TestTransportRequest(t *testing.T) {
	f := startFake(t, events(mdEvent(&coorddv1.Metadata{StatusCode: 200, Size: 2}), chunkEvent("ok")))
	hc := viaCoordd(t, f.addr, nil)
	ctx, traceparent := spanContext(t)

	res, err := get(t, hc, ctx, http.MethodGet, "https://docs.example/a/b?q=1&p=2#frag",
		http.Header{"Authorization": {"Bearer tok-1"}, "Accept": {"application/json"}, "X-Multi": {"one", "two"}})
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || string(body) != "ok" {
		t.Fatalf("body %q, %v; want ok", body, err)
	}
	call := f.last.Load()
	var headers []string
	for _, h := range call.req.GetHeaders() {
		headers = append(headers, h.GetName()+": "+h.GetValue())
	}
	if want := []string{"Accept: application/json", "X-Multi: one", "X-Multi: two"}; !slices.Equal(headers, want) {
		t.Errorf("headers %q; want %q (no Authorization)", headers, want)
	}
	if got := call.req.GetUrl(); got != "https://docs.example/a/b?q=1&p=2" {
		t.Errorf("url %q; want it without the fragment", got)
	}
	if got := call.req.GetCredential(); got != "Bearer tok-1" {
		t.Errorf("credential %q; want the Authorization value", got)
	}
	if call.req.GetHead() {
		t.Error("head set for a GET")
	}
	if got := call.md.Get("traceparent"); !slices.Equal(got, []string{traceparent}) {
		t.Errorf("traceparent %q; want %q", got, traceparent)
	}

	// Userinfo: http.Client turns it into Basic credentials; coordd gets
	// the url without it.
	res, err = get(t, hc, context.Background(), http.MethodHead, "https://user:pw@docs.example/a", nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	call = f.last.Load()
	if call.req.GetUrl() != "https://docs.example/a" || call.req.GetCredential() != "Basic dXNlcjpwdw==" || !call.req.GetHead() {
		t.Errorf("url %q, credential %q, head %v; want no userinfo, Basic credentials, head", call.req.GetUrl(), call.req.GetCredential(), call.req.GetHead())
	}
	if got := call.md.Get("traceparent"); got != nil {
		t.Errorf("traceparent %q without a span; want none", got)
	}

	// Another credential header.
	hc = viaCoordd(t, f.addr, nil, coordd.WithCredentialHeader("private-token"))
	res, err = get(t, hc, context.Background(), http.MethodGet, "https://docs.example/a",
		http.Header{"Private-Token": {"glpat-1"}, "Authorization": {"Bearer other"}})
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	call = f.last.Load()
	if call.req.GetCredential() != "glpat-1" || len(call.req.GetHeaders()) != 1 || call.req.GetHeaders()[0].GetName() != "Authorization" {
		t.Errorf("credential %q, headers %v; want PRIVATE-TOKEN's value as the credential, Authorization as a header", call.req.GetCredential(), call.req.GetHeaders())
	}

	// Get carries the span too.
	c := dial(t, f.addr)
	if _, err := c.Get(ctx, "https://docs.example/a"); err != nil {
		t.Fatal(err)
	}
	if got := f.last.Load().md.Get("traceparent"); !slices.Equal(got, []string{traceparent}) {
		t.Errorf("Get: traceparent %q; want %q", got, traceparent)
	}
}

// TestTransportResponse: the upstream's status and headers, coordd's facts,
// and the metadata's fields over the headers' fields of the same name
// (as coordd's door renders them; an Age from the upstream is dropped by
// coordd and, from an older one, replaced).
func TestTransportResponse(t *testing.T) {
	md := &coorddv1.Metadata{
		StatusCode: 404, Size: 9, ContentType: "application/json", Etag: `"e1"`, LastModified: "Mon, 02 Jan 2006 15:04:05 GMT",
		Source: coorddv1.Source_SOURCE_L2, Stale: true, Age: durationpb.New(61500 * time.Millisecond), Upstream: "gh",
		Headers: []*coorddv1.Header{{Name: "Link", Value: `<https://x/2>; rel="next"`}, {Name: "Content-Type", Value: "application/json; charset=utf-8"},
			{Name: "X-Ratelimit-Remaining", Value: "4999"}, {Name: "Age", Value: "3"}},
	}
	f := startFake(t, events(mdEvent(md), chunkEvent("not "), chunkEvent("found")))
	res, err := get(t, viaCoordd(t, f.addr, nil), context.Background(), http.MethodGet, "https://docs.example/nope", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || string(body) != "not found" {
		t.Fatalf("body %q, %v", body, err)
	}
	if res.StatusCode != 404 || res.Status != "404 Not Found" || res.ContentLength != 9 {
		t.Errorf("status %d %q, length %d; want 404 Not Found, 9", res.StatusCode, res.Status, res.ContentLength)
	}
	for name, want := range map[string]string{
		"Link": `<https://x/2>; rel="next"`, "Content-Type": "application/json", "X-Ratelimit-Remaining": "4999",
		"Etag": `"e1"`, "Last-Modified": "Mon, 02 Jan 2006 15:04:05 GMT", "Content-Length": "9", "Age": "61",
		coordd.SourceHeader: "l2", coordd.StaleHeader: "true", coordd.AgeHeader: "61", coordd.UpstreamHeader: "gh",
	} {
		if got := res.Header.Values(name); len(got) != 1 || got[0] != want {
			t.Errorf("%s: %q; want %q", name, got, want)
		}
	}
}

// TestTransportStreamsBody: RoundTrip returns once the metadata is in,
// the body's first chunk reads before coordd has sent the next, and
// closing the body cancels the call.
func TestTransportStreamsBody(t *testing.T) {
	more := make(chan struct{})
	defer func() {
		select {
		case <-more:
		default:
			close(more)
		}
	}()
	cancelled := make(chan struct{})
	f := startFake(t,
		func(st grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse]) error {
			if err := send(st, mdEvent(&coorddv1.Metadata{StatusCode: 200, Size: 8}), chunkEvent("abcd")); err != nil {
				return err
			}
			select {
			case <-more:
			case <-st.Context().Done():
				return st.Context().Err()
			}
			return send(st, chunkEvent("efgh"))
		},
		func(st grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse]) error {
			if err := send(st, mdEvent(&coorddv1.Metadata{StatusCode: 200, Size: 8}), chunkEvent("abcd")); err != nil {
				return err
			}
			<-st.Context().Done()
			close(cancelled)
			return st.Context().Err()
		})
	hc := viaCoordd(t, f.addr, nil)

	res, err := get(t, hc, context.Background(), http.MethodGet, "https://docs.example/slow", nil)
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 4)
	if _, err := io.ReadFull(res.Body, first); err != nil || string(first) != "abcd" {
		t.Fatalf("first chunk %q, %v; want abcd while coordd holds the rest", first, err)
	}
	close(more)
	rest, err := io.ReadAll(res.Body)
	if err != nil || string(rest) != "efgh" {
		t.Fatalf("rest %q, %v; want efgh", rest, err)
	}
	res.Body.Close()

	res, err = get(t, hc, context.Background(), http.MethodGet, "https://docs.example/slow", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(res.Body, first); err != nil {
		t.Fatal(err)
	}
	// A Read waiting for the next chunk (or starting after Close) ends
	// with Close.
	readErr := make(chan error, 1)
	go func() {
		_, err := res.Body.Read(make([]byte, 4))
		readErr <- err
	}()
	res.Body.Close()
	await(t, cancelled, "coordd to see the call cancelled by Body.Close")
	select {
	case err := <-readErr:
		if err == nil {
			t.Error("a Read concurrent with Close succeeded")
		}
	case <-time.After(signalWait):
		t.Fatal("a Read waiting for a chunk did not return on Close")
	}
	if _, err := res.Body.Read(first); err == nil {
		t.Error("Read after Close succeeded")
	}
}

// TestTransportContext: the end of the request's context cancels the call,
// before the metadata (RoundTrip returns the context's error) and during
// the body (Read does).
func TestTransportContext(t *testing.T) {
	var started, gone [2]chan struct{}
	for i := range 2 {
		started[i], gone[i] = make(chan struct{}), make(chan struct{})
	}
	f := startFake(t,
		func(st grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse]) error {
			close(started[0])
			<-st.Context().Done()
			close(gone[0])
			return st.Context().Err()
		},
		func(st grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse]) error {
			if err := send(st, mdEvent(&coorddv1.Metadata{StatusCode: 200, Size: 8}), chunkEvent("abcd")); err != nil {
				return err
			}
			close(started[1])
			<-st.Context().Done()
			close(gone[1])
			return st.Context().Err()
		})
	hc := viaCoordd(t, f.addr, nil)

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		res, err := get(t, hc, ctx, http.MethodGet, "https://docs.example/wait", nil)
		if err == nil {
			res.Body.Close()
		}
		errc <- err
	}()
	await(t, started[0], "the call to reach coordd")
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("RoundTrip: %v; want context.Canceled", err)
	}
	await(t, gone[0], "coordd to see the call cancelled")

	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	res, err := get(t, hc, ctx, http.MethodGet, "https://docs.example/wait", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	await(t, started[1], "the first chunk to be sent")
	cancel()
	_, err = io.ReadAll(res.Body)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Read after cancel: %v; want context.Canceled", err)
	}
	await(t, gone[1], "coordd to see the call cancelled")
}

// TestTransportRetries: an attempt that fails before the metadata is
// retried; a stream cut after it fails the body's Read, unretried.
func TestTransportRetries(t *testing.T) {
	f := startFake(t, fail(codes.Unavailable), events(mdEvent(&coorddv1.Metadata{StatusCode: 200, Size: 2}), chunkEvent("ok")))
	hc := viaCoordd(t, f.addr, []coordd.Option{coordd.WithRetryPolicy(quickRetries(3))})
	res, err := get(t, hc, context.Background(), http.MethodGet, "https://docs.example/x", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || string(body) != "ok" || f.calls.Load() != 2 {
		t.Errorf("body %q, %v after %d attempts; want ok after 2", body, err, f.calls.Load())
	}

	f.script(cutAfter("0123456789", 4))
	res, err = get(t, hc, context.Background(), http.MethodGet, "https://docs.example/x", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err = io.ReadAll(res.Body)
	res.Body.Close()
	if !errors.Is(err, io.ErrUnexpectedEOF) || status.Code(err) != codes.Unavailable || string(body) != "0123" {
		t.Errorf("cut stream: %q, %v; want 0123, then an error wrapping io.ErrUnexpectedEOF and UNAVAILABLE", body, err)
	}
	if n := f.calls.Load(); n != 1 {
		t.Errorf("attempts = %d; want 1 (nothing retried after the metadata)", n)
	}
}

// TestTransportBadStream: a body shorter or longer than the metadata says
// fails Read with ErrBadStream.
func TestTransportBadStream(t *testing.T) {
	for name, tc := range map[string]struct {
		step step
		want []error
	}{
		"short":          {events(mdEvent(&coorddv1.Metadata{StatusCode: 200, Size: 10}), chunkEvent("abcd")), []error{coordd.ErrBadStream, io.ErrUnexpectedEOF}},
		"long":           {events(mdEvent(&coorddv1.Metadata{StatusCode: 200, Size: 2}), chunkEvent("abcd")), []error{coordd.ErrBadStream}},
		"second meta":    {events(mdEvent(&coorddv1.Metadata{StatusCode: 200, Size: 2}), mdEvent(&coorddv1.Metadata{})), []error{coordd.ErrBadStream}},
		"no metadata":    {events(), []error{coordd.ErrBadStream}},
		"chunk too soon": {events(chunkEvent("ab"), mdEvent(&coorddv1.Metadata{StatusCode: 200, Size: 2})), []error{coordd.ErrBadStream}},
	} {
		t.Run(name, func(t *testing.T) {
			f := startFake(t, tc.step)
			res, err := get(t, viaCoordd(t, f.addr, nil), context.Background(), http.MethodGet, "https://docs.example/x", nil)
			if err == nil {
				_, err = io.ReadAll(res.Body)
				res.Body.Close()
			}
			for _, want := range tc.want {
				if !errors.Is(err, want) {
					t.Errorf("err = %v; want one wrapping %v", err, want)
				}
			}
		})
	}
}

// TestTransportUnavailable: what coordd cannot deliver now is an answer
// (503, 429 or 504) with X-Coordd-Error, and Retry-After on a 503 or 429;
// its other refusals are errors (testdata/http-rendering has every row).
func TestTransportUnavailable(t *testing.T) {
	f := startFake(t)
	hc := viaCoordd(t, f.addr, []coordd.Option{coordd.WithRetryPolicy(coordd.RetryPolicy{MaxAttempts: 1})})
	for _, tc := range []struct {
		name       string
		st         *status.Status
		code       int
		retryAfter string
		wantErr    string // X-Coordd-Error
	}{
		{"upstream down", status.New(codes.Unavailable, "coordinator: upstream unavailable: dial tcp: refused\r\nX-Evil: 1"), 503, "1",
			"UNAVAILABLE: coordinator: upstream unavailable: dial tcp: refused  X-Evil: 1"},
		{"breaker open", retryIn(codes.Unavailable, "coordinator: breaker open", 4*time.Second), 503, "4", "UNAVAILABLE: coordinator: breaker open"},
		{"rate limited", retryIn(codes.ResourceExhausted, "coordinator: rate limited", 1200*time.Millisecond), 429, "2", "RESOURCE_EXHAUSTED: coordinator: rate limited"},
		{"deadline", status.New(codes.DeadlineExceeded, "coordinator: waited too long"), 504, "", "DEADLINE_EXCEEDED: coordinator: waited too long"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.script(failStatus(tc.st))
			for _, method := range []string{http.MethodGet, http.MethodHead} {
				res, err := get(t, hc, context.Background(), method, "https://docs.example/x", nil)
				if err != nil {
					t.Fatalf("%s: %v; want a %d", method, err, tc.code)
				}
				body, _ := io.ReadAll(res.Body)
				res.Body.Close()
				if res.StatusCode != tc.code || res.Header.Get("Retry-After") != tc.retryAfter || res.Header.Get(coordd.ErrorHeader) != tc.wantErr {
					t.Errorf("%s: %d, Retry-After %q, %s %q; want %d, %q, %q", method, res.StatusCode, res.Header.Get("Retry-After"),
						coordd.ErrorHeader, res.Header.Get(coordd.ErrorHeader), tc.code, tc.retryAfter, tc.wantErr)
				}
				if method == http.MethodHead {
					if len(body) != 0 {
						t.Errorf("HEAD: body %q; want none", body)
					}
					continue
				}
				var e struct {
					Message string `json:"message"`
					Error   struct {
						Code       int    `json:"code"`
						Status     string `json:"status"`
						RetryAfter int    `json:"retry_after_seconds"`
					} `json:"error"`
				}
				if err := json.Unmarshal(body, &e); err != nil || e.Error.Code != tc.code || e.Message == "" || e.Error.Status == "" || (e.Error.RetryAfter < 1) != (tc.retryAfter == "") {
					t.Errorf("body %s (%v); want the JSON error", body, err)
				}
			}
		})
	}

	f.script(fail(codes.InvalidArgument))
	_, err := get(t, hc, context.Background(), http.MethodGet, "https://docs.example/x", nil)
	if status.Code(err) != codes.InvalidArgument || errors.Is(err, coordd.ErrNotCarried) {
		t.Errorf("INVALID_ARGUMENT: %v; want an error with its status", err)
	}
	f.script(fail(codes.PermissionDenied))
	_, err = get(t, hc, context.Background(), http.MethodGet, "https://docs.example/x", nil)
	if status.Code(err) != codes.PermissionDenied || errors.Is(err, coordd.ErrNotCarried) {
		t.Errorf("PERMISSION_DENIED: %v; want an error with its status", err)
	}
}

// recordingRT is a fallback that records what it gets and answers 299.
type recordingRT struct {
	n    atomic.Int64
	last atomic.Pointer[string] // method, url and body of the latest request
}

func (r *recordingRT) RoundTrip(req *http.Request) (*http.Response, error) {
	r.n.Add(1)
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		req.Body.Close()
	}
	s := req.Method + " " + req.URL.String() + " " + string(body)
	r.last.Store(&s)
	return &http.Response{StatusCode: 299, Status: "299 fallback", Body: http.NoBody, Header: http.Header{}, Request: req}, nil
}

// TestTransportNotCarried: a method other than GET and HEAD, a body, or a
// url outside every upstream fails with ErrNotCarried, without a call to
// coordd for the first two, or goes to the fallback as it is.
func TestTransportNotCarried(t *testing.T) {
	outside, _ := status.New(codes.PermissionDenied, "coordinator: forbidden: url https://elsewhere.example/ is outside every configured upstream").
		WithDetails(&errdetails.ErrorInfo{Reason: "OUTSIDE_UPSTREAMS", Domain: "coordd"})
	f := startFake(t, failStatus(outside))
	fb := &recordingRT{}
	plain := viaCoordd(t, f.addr, nil)
	withFallback := viaCoordd(t, f.addr, nil, coordd.WithFallback(fb))
	for _, tc := range []struct {
		name, method, url, body string
		calls                   int64
	}{
		{"POST", http.MethodPost, "https://docs.example/x", "{}", 0},
		{"DELETE", http.MethodDelete, "https://docs.example/x", "", 0},
		{"GET with a body", http.MethodGet, "https://docs.example/x", "q", 0},
		{"outside every upstream", http.MethodGet, "https://elsewhere.example/", "", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			newReq := func() (*http.Request, *closeTracker) {
				var rd io.ReadCloser
				ct := &closeTracker{}
				if tc.body != "" {
					ct.Reader = strings.NewReader(tc.body)
					rd = ct
				}
				req, err := http.NewRequest(tc.method, tc.url, rd)
				if err != nil {
					t.Fatal(err)
				}
				return req, ct
			}
			f.calls.Store(0)
			req, ct := newReq()
			_, err := plain.Do(req)
			if !errors.Is(err, coordd.ErrNotCarried) || !strings.Contains(err.Error(), "WithFallback") {
				t.Errorf("err = %v; want ErrNotCarried, naming WithFallback", err)
			}
			if tc.body != "" && !ct.closed.Load() {
				t.Error("the request's body was not closed")
			}
			if got := f.calls.Load(); got != tc.calls {
				t.Errorf("calls to coordd = %d; want %d", got, tc.calls)
			}

			req, _ = newReq()
			res, err := withFallback.Do(req)
			if err != nil || res.StatusCode != 299 {
				t.Fatalf("with a fallback: %v, %v; want the fallback's 299", res, err)
			}
			res.Body.Close()
			if want := tc.method + " " + tc.url + " " + tc.body; *fb.last.Load() != want {
				t.Errorf("the fallback got %q; want %q", *fb.last.Load(), want)
			}
		})
	}
}

type closeTracker struct {
	io.Reader
	closed atomic.Bool
}

func (c *closeTracker) Close() error {
	c.closed.Store(true)
	return nil
}

// TestTransportUnreachable: with no coordd to answer, RoundTrip fails as
// net/http does for a network error: an error wrapping ErrUnreachable,
// which is a net.Error; http.Client wraps it in a *url.Error.
func TestTransportUnreachable(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	rt := coordd.NewTransport(dial(t, addr, coordd.WithRetryPolicy(coordd.RetryPolicy{MaxAttempts: 1}), coordd.WithDialOptions(fastReconnect)))
	req, _ := http.NewRequest(http.MethodGet, "https://docs.example/x", nil)
	res, err := rt.RoundTrip(req)
	var ne net.Error
	if res != nil || !errors.Is(err, coordd.ErrUnreachable) || !errors.As(err, &ne) {
		t.Fatalf("RoundTrip = %v, %v; want an error wrapping ErrUnreachable that is a net.Error", res, err)
	}
	_, err = (&http.Client{Transport: rt}).Do(req)
	var ue *url.Error
	if !errors.As(err, &ue) || !errors.Is(err, coordd.ErrUnreachable) {
		t.Errorf("http.Client: %v; want a *url.Error wrapping ErrUnreachable", err)
	}
}

// TestTransportPriority: PriorityHeader sets a request's priority and is
// never sent on, to coordd or to the fallback; WithDefaultPriority sets
// that of requests without it; a value it does not know fails the request
// before any call.
func TestTransportPriority(t *testing.T) {
	f := startFake(t, events(mdEvent(&coorddv1.Metadata{StatusCode: 200, Size: 2}), chunkEvent("ok")))
	var fellBack atomic.Pointer[http.Request]
	fallback := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		fellBack.Store(r)
		return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
	})
	plain := viaCoordd(t, f.addr, nil, coordd.WithFallback(fallback))
	warm := viaCoordd(t, f.addr, nil, coordd.WithDefaultPriority(coordd.Background))
	tests := []struct {
		name string
		hc   *http.Client
		h    http.Header
		want coorddv1.Priority
	}{
		{"no header", plain, nil, coorddv1.Priority_PRIORITY_UNSPECIFIED},
		{"background", plain, http.Header{coordd.PriorityHeader: {"background"}}, coordd.Background},
		{"interactive", plain, http.Header{coordd.PriorityHeader: {"interactive"}}, coordd.Interactive},
		{"another case", plain, http.Header{coordd.PriorityHeader: {" Background"}}, coordd.Background},
		{"not canonical", plain, http.Header{"x-coordd-priority": {"background"}}, coordd.Background},
		{"default background", warm, nil, coordd.Background},
		{"header over the default", warm, http.Header{coordd.PriorityHeader: {"interactive"}}, coordd.Interactive},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{"Accept": {"text/plain"}}
			for k, v := range tc.h {
				h[k] = v
			}
			res, err := get(t, tc.hc, context.Background(), http.MethodGet, "https://docs.example/p", h)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			req := f.last.Load().req
			if got := req.GetPriority(); got != tc.want {
				t.Errorf("priority %v; want %v", got, tc.want)
			}
			for _, hd := range req.GetHeaders() {
				if http.CanonicalHeaderKey(hd.GetName()) == coordd.PriorityHeader {
					t.Errorf("%s sent to coordd as a header: %q", coordd.PriorityHeader, hd.GetValue())
				}
			}
		})
	}

	// Refused before any call.
	calls := f.calls.Load()
	for _, h := range []http.Header{
		{coordd.PriorityHeader: {"urgent"}},
		{coordd.PriorityHeader: {"background", "background"}},
	} {
		if _, err := get(t, plain, context.Background(), http.MethodGet, "https://docs.example/p", h); err == nil || !strings.Contains(err.Error(), coordd.PriorityHeader) {
			t.Errorf("%v: err = %v; want an error naming %s", h, err, coordd.PriorityHeader)
		}
	}
	if got := f.calls.Load(); got != calls {
		t.Errorf("%d calls reached coordd; want none", got-calls)
	}

	// A request the fallback gets loses the header, and the caller's
	// request is left as it was.
	req, err := http.NewRequest(http.MethodPost, "https://docs.example/p", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(coordd.PriorityHeader, "background")
	res, err := plain.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if r := fellBack.Load(); r == nil || r.Header.Get(coordd.PriorityHeader) != "" {
		t.Errorf("the fallback got %v; want the request without %s", r, coordd.PriorityHeader)
	}
	if req.Header.Get(coordd.PriorityHeader) != "background" {
		t.Errorf("the caller's request lost its %s", coordd.PriorityHeader)
	}
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
