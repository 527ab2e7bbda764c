package coordd

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/httprender"
)

// ErrNotCarried reports a request the Transport does not carry through
// coordd and has no fallback for (WithFallback): a method other than GET
// and HEAD, a request with a body, or a url outside every upstream coordd
// is configured for. The error says which.
var ErrNotCarried = errors.New("coordd: request not carried")

// Response headers the Transport adds with coordd's facts about a
// document, besides the standard Age and Cache-Control: those of coordd's
// one rendering of an answer, which its HTTP door sends too (docs/api.md,
// "One rendering").
const (
	// SourceHeader is where the document came from: l1 (the instance's
	// memory), l2 (the shared cache, or another instance's fetch) or
	// upstream (fetched for this call's flight).
	SourceHeader = httprender.SourceHeader
	// StaleHeader is "true" for a stale copy (served while it is
	// revalidated, or because the upstream failed), else "false".
	StaleHeader = httprender.StaleHeader
	// AgeHeader is how long ago coordd fetched the document from the
	// upstream, in whole seconds (as Age).
	AgeHeader = httprender.AgeHeader
	// KeyHeader is the document's cache key.
	KeyHeader = httprender.KeyHeader
	// UpstreamHeader is the name of the configured upstream.
	UpstreamHeader = httprender.UpstreamHeader
	// ErrorHeader is on the answer the Transport makes when coordd cannot
	// deliver the document: the gRPC code's name and coordd's message,
	// such as "UNAVAILABLE: coordinator: upstream unavailable: …".
	ErrorHeader = httprender.ErrorHeader
)

// PriorityHeader is the request header that sets the priority of one
// request through the Transport: "interactive" or "background" (in any
// case), as WithPriority does for Get. The Transport removes it: it goes
// neither to coordd's headers nor to a fallback (WithFallback). Any other
// value, or more than one field, fails the request. Default:
// WithDefaultPriority's. coordd's HTTP door reads the same header.
const PriorityHeader = "X-Coordd-Priority"

// TransportOption configures NewTransport.
type TransportOption func(*transport)

// WithFallback makes the Transport pass the requests it does not carry
// through coordd to rt, as they are: a method other than GET and HEAD, a
// request with a body, and a url outside every upstream coordd is
// configured for (coordd refused it with PERMISSION_DENIED before any
// upstream request). Default: none; such requests fail with ErrNotCarried.
// http.DefaultTransport sends them straight to their server, bypassing
// coordd: name it only where that is what you want.
func WithFallback(rt http.RoundTripper) TransportOption {
	return func(t *transport) { t.fallback = rt }
}

// WithCredentialHeader names the request header that carries the caller's
// own credential for the upstream, for an upstream whose credential header
// is not Authorization (say, GitLab's PRIVATE-TOKEN). Its whole value goes
// in GetOrFetchRequest.credential instead of being sent as a header.
// Default: Authorization. A Transport has one: use one per API whose
// credential header differs.
func WithCredentialHeader(name string) TransportOption {
	return func(t *transport) { t.credHeader = http.CanonicalHeaderKey(name) }
}

// WithDefaultPriority sets the priority of the requests that carry no
// PriorityHeader: Background for a Transport that only a prefetch or
// warm-up job uses. Default: none sent, which coordd takes for
// Interactive.
func WithDefaultPriority(p coorddv1.Priority) TransportOption {
	return func(t *transport) { t.priority = p }
}

// transport is the http.RoundTripper NewTransport returns.
type transport struct {
	c          *Client
	fallback   http.RoundTripper // nil: none
	credHeader string            // canonical
	priority   coorddv1.Priority // of a request without PriorityHeader
}

// NewTransport returns an http.RoundTripper that gets documents through
// coordd, so that any library taking an *http.Client reads its upstream
// through it:
//
//	hc := &http.Client{Transport: coordd.NewTransport(c)}
//
// It carries GET and HEAD requests without a body. The request's url goes
// to coordd as it is (userinfo and fragment dropped), its headers go in
// GetOrFetchRequest.headers (coordd keeps those its upstream forwards and
// drops the rest), and its Authorization header (see
// WithCredentialHeader) goes in GetOrFetchRequest.credential: the caller's
// own credential, used for this call's fetch, never stored, and never
// shared with callers holding another one. Its PriorityHeader, if any,
// goes in GetOrFetchRequest.priority (see WithDefaultPriority). A HEAD
// asks for the metadata only.
//
// The response is the upstream's, as a plain HTTP client gets it: its
// status (a 404 or a 429 is a response, not an error), its headers
// (Metadata.headers, with Content-Type, ETag, Last-Modified and
// Content-Length from the metadata), coordd's facts in SourceHeader,
// StaleHeader, AgeHeader, KeyHeader and UpstreamHeader, Age (the time
// since coordd fetched it) and coordd's Cache-Control
// (Metadata.cache_control: max-age is what coordd serves fresh), as
// coordd's HTTP door renders it. RoundTrip returns as soon as the
// metadata arrives; the body streams the chunks as they arrive. Closing the
// body cancels the call, and so does the end of the request's context.
//
// Until the metadata arrives, the Client retries as for Get (RetryPolicy)
// and its breaker fails fast while coordd is unreachable; a stream cut
// after that fails the body's Read with an error wrapping
// io.ErrUnexpectedEOF. The Client's deadline (WithTimeout) covers the whole
// call, body included, when the request's context has none.
// WithMaxBodyBytes does not apply: the body is never held whole.
//
// When coordd answers but cannot deliver the document (UNAVAILABLE: the
// upstream is down with no stale copy, or its breaker is open: 503;
// RESOURCE_EXHAUSTED: no rate-limit slot before the deadline: 429;
// DEADLINE_EXCEEDED that is not the request's own: 504), the response is
// the one coordd's HTTP door gives: Retry-After on a 429 or 503 (the
// status's RetryInfo delay in whole seconds, rounded up; 1 without one),
// ErrorHeader, and a JSON body {"message": …, "error": {"code", "status",
// "reason", "message", "retry_after_seconds"}}, so that code checking the
// status behaves as it does against the upstream.
//
// Errors: when no coordd answers, RoundTrip fails with an error wrapping
// ErrUnreachable (ErrCircuitOpen while failing fast) that is a net.Error,
// as a network error of net/http's own transport is. A request it does
// not carry fails with ErrNotCarried, or goes to the fallback
// (WithFallback): so does one coordd refuses with the reason
// OUTSIDE_UPSTREAMS or CALLER_CREDENTIALS_REFUSED (a google.rpc.ErrorInfo
// detail; never its message). The end of the request's context returns
// its error. Any other refusal of coordd (INVALID_ARGUMENT,
// UNAUTHENTICATED, PERMISSION_DENIED for an upstream not granted,
// FAILED_PRECONDITION for a body over the upstream's limit) is an error
// wrapping its gRPC status.
//
// Each call carries the W3C trace context of the request context's span,
// if any. The Transport is safe for concurrent use; it holds nothing of
// its own to close (close the Client).
func NewTransport(c *Client, opts ...TransportOption) http.RoundTripper {
	t := &transport{c: c, credHeader: "Authorization"}
	for _, opt := range opts {
		opt(t)
	}
	return t
}

// RoundTrip implements http.RoundTripper.
func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	p, err := t.priorityOf(req)
	if err != nil {
		if req.Body != nil {
			req.Body.Close() // RoundTrip closes the body, even on errors
		}
		return nil, fmt.Errorf("coordd: %s %s: %w", req.Method, redacted(req), err)
	}
	if why := notCarried(req); why != "" {
		if t.fallback != nil {
			return t.fallback.RoundTrip(withoutPriority(req))
		}
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, fmt.Errorf("%w: %s %s: %s (WithFallback names a transport for it)", ErrNotCarried, req.Method, redacted(req), why)
	}
	g := t.request(req)
	g.Priority = p
	s, err := t.c.open(req.Context(), g)
	if err != nil {
		return t.failed(req, err)
	}
	return httpResponse(req, s), nil
}

// priorityOf is the priority req asks for with PriorityHeader, or the
// Transport's default.
func (t *transport) priorityOf(req *http.Request) (coorddv1.Priority, error) {
	var vs []string
	for name, v := range req.Header {
		if http.CanonicalHeaderKey(name) == PriorityHeader { // a key set by hand may not be canonical
			vs = append(vs, v...)
		}
	}
	switch {
	case len(vs) == 0:
		return t.priority, nil
	case len(vs) > 1:
		return 0, fmt.Errorf("%s: %d fields; send one", PriorityHeader, len(vs))
	}
	switch strings.ToLower(strings.TrimSpace(vs[0])) {
	case "interactive":
		return Interactive, nil
	case "background":
		return Background, nil
	}
	return 0, fmt.Errorf("%s %.64q: want interactive or background", PriorityHeader, vs[0])
}

// withoutPriority is req without PriorityHeader, for a fallback: a copy if
// it has one, since RoundTrip must not change its request.
func withoutPriority(req *http.Request) *http.Request {
	var r *http.Request
	for name := range req.Header {
		if http.CanonicalHeaderKey(name) == PriorityHeader {
			if r == nil {
				r = req.Clone(req.Context())
			}
			delete(r.Header, name)
		}
	}
	if r == nil {
		return req
	}
	return r
}

// notCarried says why req cannot go through coordd, or "" if it can.
func notCarried(req *http.Request) string {
	switch {
	case req.Method != "" && req.Method != http.MethodGet && req.Method != http.MethodHead:
		return "only GET and HEAD are carried through coordd"
	case req.Body != nil && req.Body != http.NoBody, req.ContentLength > 0:
		return "a request with a body is not carried through coordd"
	}
	return ""
}

// urlOf is req's url as coordd gets it: without userinfo (which
// http.Client has already moved into Authorization) and fragment.
func urlOf(req *http.Request) string {
	u := *req.URL
	u.User = nil
	u.Fragment, u.RawFragment = "", ""
	return u.String()
}

// redacted is req's url for an error message, its password hidden.
func redacted(req *http.Request) string {
	if req.URL == nil {
		return ""
	}
	return req.URL.Redacted()
}

// request is the GetOrFetchRequest for req: every header but the
// credential's, in a stable order, and the credential on its own.
func (t *transport) request(req *http.Request) *coorddv1.GetOrFetchRequest {
	g := &coorddv1.GetOrFetchRequest{Url: urlOf(req), Head: req.Method == http.MethodHead}
	names := make([]string, 0, len(req.Header))
	for name := range req.Header {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		vs := req.Header[name]
		if http.CanonicalHeaderKey(name) == PriorityHeader {
			continue // the Transport's own; priorityOf reads it
		}
		if http.CanonicalHeaderKey(name) == t.credHeader {
			if len(vs) > 0 && g.Credential == "" {
				g.Credential = vs[0]
			}
			continue
		}
		for _, v := range vs {
			g.Headers = append(g.Headers, &coorddv1.Header{Name: name, Value: v})
		}
	}
	return g
}

// failed turns the error of a call that delivered no metadata into
// RoundTrip's results.
func (t *transport) failed(req *http.Request, err error) (*http.Response, error) {
	if ctxErr := req.Context().Err(); ctxErr != nil {
		return nil, ctxErr
	}
	if errors.Is(err, ErrUnreachable) {
		return nil, &netError{err}
	}
	st, _ := status.FromError(err)
	e := httprender.FromStatus(st)
	switch {
	case httprender.Answered(e.Code):
		return errorResponse(req, e), nil
	case httprender.NotCarried(e.Reason):
		if t.fallback != nil {
			return t.fallback.RoundTrip(withoutPriority(req))
		}
		return nil, fmt.Errorf("%w: %s %s: coordd does not carry it (WithFallback names a transport for it): %w", ErrNotCarried, req.Method, redacted(req), err)
	}
	return nil, fmt.Errorf("coordd: %s %s: %w", req.Method, redacted(req), err)
}

// httpResponse is the http.Response for s, the stream of req: coordd's
// one rendering of a document (httprender.SetDocument).
func httpResponse(req *http.Request, s *stream) *http.Response {
	md := s.md
	h := make(http.Header, len(md.GetHeaders())+12)
	for _, f := range md.GetHeaders() {
		if name := http.CanonicalHeaderKey(f.GetName()); !httprender.Owned(name) || name == "Cache-Control" && md.GetCacheControl() == "" {
			h.Add(f.GetName(), f.GetValue()) // the upstream's Cache-Control from a coordd that renders none
		}
	}
	code := httprender.SetDocument(h, httprender.FromMetadata(md))
	res := &http.Response{
		Status:        strconv.Itoa(code) + " " + http.StatusText(code),
		StatusCode:    code,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          s,
		ContentLength: md.GetSize(),
		Request:       req,
	}
	if req.Method == http.MethodHead {
		res.Body = http.NoBody
	}
	return res
}

// errorResponse is the response for e, an error coordd answered that says
// it cannot deliver the document now: coordd's one rendering of an error
// (httprender.SetError).
func errorResponse(req *http.Request, e httprender.Error) *http.Response {
	h := http.Header{}
	code, body := httprender.SetError(h, e, 0)
	res := &http.Response{
		Status:        strconv.Itoa(code) + " " + http.StatusText(code),
		StatusCode:    code,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          http.NoBody,
		ContentLength: int64(len(body)),
		Request:       req,
	}
	if req.Method != http.MethodHead {
		res.Body = readCloser{bytes.NewReader(body)}
	}
	return res
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

// netError is the Transport's error when no coordd answered. It wraps
// ErrUnreachable and is a net.Error, as the errors of net/http's own
// transport for a refused or cut connection are, so that code telling
// network failures apart finds one.
type netError struct{ err error }

func (e *netError) Error() string { return e.err.Error() }
func (e *netError) Unwrap() error { return e.err }

// Timeout reports whether nothing came back before the deadline.
func (e *netError) Timeout() bool { return status.Code(e.err) == codes.DeadlineExceeded }

// Temporary is true: coordd may be back by the next call. (Deprecated in
// net.Error, still part of it.)
func (e *netError) Temporary() bool { return true }
