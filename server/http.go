package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/document"
	"github.com/coordd/coordd/internal/httprender"
	"github.com/coordd/coordd/internal/logctx"
	"github.com/coordd/coordd/internal/requestid"
	"github.com/coordd/coordd/internal/secret"
)

// The HTTP door: plain HTTP for callers that cannot hold a gRPC stream
// (shell scripts, PHP or Ruby MCP servers, edge runtimes with only fetch).
//
// It is a small handler over the same Server rather than a transcoder
// (connectrpc's vanguard, grpc-gateway) in front of the gRPC service: a
// transcoder answers a server stream with a stream of JSON messages, the
// body base64-encoded and copied per caller, where an HTTP caller wants the
// document itself with its Content-Type, ETag and a 304; and it would need
// google.api.http annotations in the proto. Here an HTTP call is one
// coordinator.Get, joining the same flight as gRPC callers of the document,
// and its body is written from the document's shared buffer.

// Paths of the HTTP door.
const (
	// HTTPDocumentsPath serves GET (and HEAD)
	// ?url=…[&key=…][&max_age=…][&no_stale=1][&timeout=…][&priority=background].
	HTTPDocumentsPath = "/v1/documents"
	// HTTPInvalidatePath serves POST, with url and/or key as query or form
	// parameters, or as a JSON object.
	HTTPInvalidatePath = "/v1/invalidate"
)

// Response headers of the HTTP door besides the standard ones.
const (
	// HTTPSourceHeader tells where a document came from: l1, l2 or
	// upstream; HTTPStaleHeader whether the copy is stale. Only answers
	// carrying a document have them; coordd's own errors do not. The
	// door's fields are those of coordd's one rendering (httprender).
	HTTPSourceHeader = httprender.SourceHeader
	HTTPStaleHeader  = httprender.StaleHeader
	// HTTPKeyHeader is the document's cache key.
	HTTPKeyHeader = httprender.KeyHeader
	// HTTPRequestIDHeader is the call's request id, as RequestIDHeader
	// over gRPC.
	HTTPRequestIDHeader = "X-Request-Id"
	// HTTPCredentialHeader carries a caller's own credential for the
	// upstream (GetOrFetchRequest.credential): Authorization is the
	// tenant's token at this door.
	HTTPCredentialHeader = "X-Coordd-Credential"
	// HTTPPriorityHeader is the call's priority
	// (GetOrFetchRequest.priority): "interactive" (the default) or
	// "background", as the priority parameter says it, for a caller that
	// can set a header more easily than a parameter.
	HTTPPriorityHeader = "X-Coordd-Priority"
)

// doorSets reports whether the door sets the response header name itself,
// never copying the upstream's: the rendering's own fields, and the door's.
func doorSets(name string) bool {
	switch name {
	case "X-Content-Type-Options", HTTPRequestIDHeader, "Connection", "Date":
		return true
	}
	return httprender.Owned(name)
}

// cacheControl is the Cache-Control coordd gives d (Metadata.cache_control, and the door's), so that a
// cache between it and the caller keeps d no longer than coordd serves
// it fresh: max-age is d's fresh lifetime (with Age, what is left of it),
// private when d is one credential scope's, and no-cache or
// must-revalidate as d's Revalidation says. A copy that was never fresh,
// or is not stored, is no-store.
func cacheControl(d *document.Document, private bool) string {
	life := d.FreshUntil.Sub(d.FetchedAt)
	if life <= 0 || !d.StaleUntil.After(d.FetchedAt) {
		if private {
			return "private, no-store"
		}
		return "no-store"
	}
	cc := "max-age=" + strconv.FormatInt(int64(life/time.Second), 10)
	if private {
		cc = "private, " + cc
	}
	switch d.Revalidation {
	case document.RevalidateBeforeUse:
		cc += ", no-cache"
	case document.RevalidateStrictly:
		cc += ", must-revalidate"
	}
	return cc
}

// maxInvalidateBody bounds the body of an invalidation request.
const maxInvalidateBody = 8 << 10

// The parameters of the door's paths. Any other is refused (readParams):
// most often it is the tail of a url whose own query was not
// percent-encoded, "?url=https://h/p?a=1&b=2", which would otherwise lose
// its "&b=2" without a word and fetch another document.
var (
	documentsParams  = []string{"url", "key", "max_age", "no_stale", "timeout", "priority"}
	invalidateParams = []string{"url", "key"}
)

// httpDoor serves the HTTP door for a Server. It shares the gRPC server's
// cap on calls in progress and its call log.
type httpDoor struct {
	s     *Server
	limit *callLimit
	calls *callLogger
	cfg   Config // with defaults filled in
}

// HTTPHandler returns the HTTP door: GET /v1/documents and POST
// /v1/invalidate over the same Server, tenants, call cap and call log as
// g. Serve it over TLS with the gRPC listener's configuration where that
// has TLS. See docs/api.md ("HTTP, for anything that has no gRPC") for the
// protocol.
func (g *GRPC) HTTPHandler() http.Handler { return g.door }

func (h *httpDoor) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	start := time.Now()
	w := &statusWriter{ResponseWriter: rw}
	id := r.Header.Get(HTTPRequestIDHeader)
	if !validRequestID(id) {
		id = requestid.New()
	}
	ctx := logctx.New(r.Context(), "request_id", id)
	w.Header().Set(HTTPRequestIDHeader, id)
	// An answer given before the body is read closes the connection, and
	// net/http's drain of the unread rest (which has no deadline) ends at
	// once: a caller that announces a body and stalls holds no socket past
	// its answer. readBody, having read the body, keeps the connection.
	unread := r.Body
	if r.ContentLength != 0 {
		w.Header().Set("Connection", "close")
		defer func() {
			if r.Body == unread {
				_ = responseController(ctx, w).SetReadDeadline(time.Now())
			}
		}()
	}
	var method string
	var err error
	switch {
	case len(r.TransferEncoding) > 0:
		// RFC 9112 6.3: a request with Transfer-Encoding and
		// Content-Length may be a smuggled one, read one way here and
		// another by a proxy in front that reuses the connection. The
		// door's bodies are small JSON or forms with a Content-Length, so
		// any Transfer-Encoding is refused, and the connection with it.
		w.Header().Set("Connection", "close")
		method = "unknown"
		err = httpError(http.StatusBadRequest, codes.InvalidArgument, "Transfer-Encoding is not accepted; send the body with a Content-Length")
	case r.URL.Path == HTTPDocumentsPath:
		method = "GetOrFetch"
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			err = httpError(http.StatusMethodNotAllowed, codes.Unimplemented, "method %s not allowed; use GET", r.Method)
			break
		}
		err = h.serve(ctx, method, w, r, nil, h.get)
	case r.URL.Path == HTTPInvalidatePath:
		method = "Invalidate"
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			err = httpError(http.StatusMethodNotAllowed, codes.Unimplemented, "method %s not allowed; use POST", r.Method)
			break
		}
		err = h.serve(ctx, method, w, r, h.readBody, h.invalidate)
	default:
		method = "unknown"
		err = httpError(http.StatusNotFound, codes.NotFound, "no such path %q; see %s and %s", r.URL.Path, HTTPDocumentsPath, HTTPInvalidatePath)
	}
	code := codes.OK
	if err != nil {
		code = writeError(w, err)
	}
	h.finished(ctx, r, method, start, w.status, code, err)
}

// serve authenticates the caller, reads the request's body with read
// (nil: none) within Config.HTTPBodyTimeout, and only then runs handle
// under the call cap, as the gRPC interceptors do: a caller without a
// token, or one that stalls its body, never holds a slot.
func (h *httpDoor) serve(ctx context.Context, method string, w http.ResponseWriter, r *http.Request,
	read func(context.Context, http.ResponseWriter, *http.Request) error,
	handle func(context.Context, http.ResponseWriter, *http.Request, *principal) error) error {
	p, err := h.s.httpPrincipal(r)
	if err != nil {
		return err
	}
	if read != nil {
		if err := read(ctx, w, r); err != nil {
			return err
		}
	}
	release, err := h.limit.acquire(limitedPrefix + method)
	if err != nil {
		return err
	}
	defer release()
	return handle(ctx, w, r, p)
}

// readBody reads r's body, at most maxInvalidateBody bytes, within
// Config.HTTPBodyTimeout, and puts it back as a buffer. A body announced
// over the bound is 413 before any of it is read; one that does not arrive
// in time is 408. Either closes the connection (ServeHTTP).
func (h *httpDoor) readBody(ctx context.Context, w http.ResponseWriter, r *http.Request) error {
	if r.ContentLength > maxInvalidateBody {
		// Announced over the bound: refused before a byte of it is read.
		return httpError(http.StatusRequestEntityTooLarge, codes.InvalidArgument, "the body is over %d bytes", maxInvalidateBody)
	}
	rc := responseController(ctx, w)
	deadline := rc.SetReadDeadline(time.Now().Add(h.cfg.HTTPBodyTimeout)) == nil
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxInvalidateBody))
	if deadline && err == nil {
		// On an error the deadline stays: net/http discards what is left
		// of a body after the handler, and must not wait for it forever.
		_ = rc.SetReadDeadline(time.Time{})
	}
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return httpError(http.StatusRequestEntityTooLarge, codes.InvalidArgument, "the body is over %d bytes", maxInvalidateBody)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return httpError(http.StatusRequestTimeout, codes.DeadlineExceeded, "the body did not arrive within %v", h.cfg.HTTPBodyTimeout)
	case err != nil:
		return httpError(http.StatusBadRequest, codes.InvalidArgument, "the body could not be read: %v", err)
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	w.Header().Del("Connection") // read whole: the connection may serve the next request
	return nil
}

// get answers GET /v1/documents.
func (h *httpDoor) get(ctx context.Context, w http.ResponseWriter, r *http.Request, p *principal) error {
	q, err := readParams("query", r.URL.RawQuery, documentsParams)
	if err != nil {
		return err
	}
	opt, timeout, err := httpGetOptions(q, r.Header)
	if err != nil {
		return err
	}
	if len(r.Header) > maxRequestHeaders {
		return status.Errorf(codes.InvalidArgument, "headers: %d; at most %d", len(r.Header), maxRequestHeaders)
	}
	t, err := h.s.c.ResolveRequest(p.scope, coordinator.Request{
		URL: q.Get("url"), Key: q.Get("key"), Header: r.Header,
		Credential: secret.New(r.Header.Get(HTTPCredentialHeader)),
	})
	if err != nil {
		return toStatus(err)
	}
	logctx.Add(ctx, "key", t.Key)
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	res, err := h.s.c.Get(ctx, t, opt)
	if err != nil {
		return toStatus(callerGone(ctx, err))
	}
	d := res.Doc
	hd := w.Header()
	for _, f := range d.Header {
		if !doorSets(f.Name) {
			hd[f.Name] = append(hd[f.Name], f.Value)
		}
	}
	code := httprender.SetDocument(hd, documentOf(res, t.Private(), h.s.c.Now()))
	// The door's own, for a browser: the upstream's type, never a sniffed one.
	hd.Set("X-Content-Type-Options", "nosniff")
	if d.ContentType == "" {
		hd.Set("Content-Type", "application/octet-stream")
	}
	if code/100 == 2 && d.ETag != "" && etagMatches(r.Header.Values("If-None-Match"), d.ETag) {
		hd.Del("Content-Type")
		hd.Del("Content-Length")
		w.WriteHeader(http.StatusNotModified)
		return nil
	}
	w.WriteHeader(code)
	if r.Method != http.MethodHead {
		// The document's shared body, never copied for this caller: a write
		// past net/http's buffer goes straight to the connection. A failed
		// write means the caller is gone.
		_, _ = w.Write(d.Body)
	}
	return nil
}

// documentOf is what coordd says of res's document at now: what
// metadataPB says, without building the message (a test holds the two
// together).
func documentOf(res *coordinator.Result, private bool, now time.Time) httprender.Document {
	d := res.Doc
	return httprender.Document{
		StatusCode: d.StatusCode, ContentType: d.ContentType, ETag: d.ETag, LastModified: d.LastModified,
		Size: int64(len(d.Body)), Age: d.Age(now), Source: httprender.SourceName(sourcePB(res.Source)), Stale: res.Stale,
		Key: d.Key, Upstream: d.Upstream, CacheControl: cacheControl(d, private),
	}
}

// invalidate answers POST /v1/invalidate.
// Its body has been read by readBody.
func (h *httpDoor) invalidate(ctx context.Context, w http.ResponseWriter, r *http.Request, p *principal) error {
	q, err := readParams("query", r.URL.RawQuery, invalidateParams)
	if err != nil {
		return err
	}
	rawURL, key := q.Get("url"), q.Get("key")
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch ct {
	case "application/json":
		var body struct {
			URL string `json:"url"`
			Key string `json:"key"`
		}
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&body); err != nil {
			return status.Errorf(codes.InvalidArgument, "body does not decode as {\"url\": …, \"key\": …}: %v", err)
		}
		rawURL, key = orString(body.URL, rawURL), orString(body.Key, key)
	case "application/x-www-form-urlencoded":
		b, err := io.ReadAll(r.Body) // read and bounded by readBody
		if err != nil {
			return status.Errorf(codes.InvalidArgument, "form does not decode: %v", err)
		}
		f, err := readParams("form", string(b), invalidateParams)
		if err != nil {
			return err
		}
		rawURL, key = orString(f.Get("url"), rawURL), orString(f.Get("key"), key)
	}
	resp, err := h.s.invalidate(ctx, p, coordinator.Request{URL: rawURL, Key: key, Header: r.Header, Credential: secret.New(r.Header.Get(HTTPCredentialHeader))})
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, struct {
		Key     string `json:"key"`
		Existed bool   `json:"existed"`
	}{resp.GetKey(), resp.GetExisted()})
}

// httpGetOptions is the engine's GetOptions for a GET's parameters q and
// headers h (max_age, no_stale and priority, the last from the parameter
// or HTTPPriorityHeader), and its timeout. A value that does not parse is
// INVALID_ARGUMENT, and so are a parameter and a header that disagree on
// the priority.
func httpGetOptions(q url.Values, h http.Header) (opt coordinator.GetOptions, timeout time.Duration, err error) {
	if opt.MaxAge, err = httpDuration(q, "max_age"); err != nil {
		return opt, 0, err
	}
	if timeout, err = httpDuration(q, "timeout"); err != nil {
		return opt, 0, err
	}
	if v := q.Get("no_stale"); v != "" {
		if opt.NoStale, err = strconv.ParseBool(v); err != nil {
			return opt, 0, status.Errorf(codes.InvalidArgument, "no_stale %q must be true or false", v)
		}
	}
	opt.Background, err = httpPriority(q.Get("priority"), h.Values(HTTPPriorityHeader))
	return opt, timeout, err
}

// httpPriority reports whether a GET whose priority parameter is param
// and whose HTTPPriorityHeader fields are hdr is a background call.
// "interactive" and "background" (in any case) are the values; none is
// interactive.
func httpPriority(param string, hdr []string) (bool, error) {
	const want = `must be "interactive" or "background"`
	if len(hdr) > 1 {
		return false, status.Errorf(codes.InvalidArgument, "%s: %d fields; send one", HTTPPriorityHeader, len(hdr))
	}
	parse := func(where, v string) (string, error) {
		switch p := strings.ToLower(strings.TrimSpace(v)); p {
		case "", "interactive", "background":
			return p, nil
		}
		return "", status.Errorf(codes.InvalidArgument, "%s %.64q %s", where, v, want)
	}
	p, err := parse("priority", param)
	if err != nil {
		return false, err
	}
	if len(hdr) == 1 {
		hp, err := parse(HTTPPriorityHeader, hdr[0])
		if err != nil {
			return false, err
		}
		if p != "" && hp != "" && p != hp {
			return false, status.Errorf(codes.InvalidArgument, "the priority parameter says %q and %s says %q: send one", p, HTTPPriorityHeader, hp)
		}
		if p == "" {
			p = hp
		}
	}
	return p == "background", nil
}

// readParams parses raw, a query or a form body, whose parameters must
// all be among known: an unknown one, or one that does not parse, is
// INVALID_ARGUMENT, naming it and saying that the url must be
// percent-encoded.
func readParams(where, raw string, known []string) (url.Values, error) {
	const encode = "percent-encode the url, its own ? and & included " +
		"(curl -G --data-urlencode url=…, encodeURIComponent): left as it is, its query is cut at its first &"
	q, err := url.ParseQuery(raw)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "the %s does not parse (%v): %s", where, err, encode)
	}
	var unknown []string
	for name := range q {
		if !slices.Contains(known, name) {
			unknown = append(unknown, strconv.Quote(name))
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return nil, status.Errorf(codes.InvalidArgument, "unknown %s parameter %s (known: %s): %s",
			where, strings.Join(unknown, ", "), strings.Join(known, ", "), encode)
	}
	return q, nil
}

func orString(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// httpPrincipal authenticates an HTTP call by its "Authorization: Bearer"
// header, as the gRPC interceptor does its metadata, with the same
// refusals.
func (s *Server) httpPrincipal(r *http.Request) (*principal, error) {
	if s.auth == nil {
		return s.openPrincipal(), nil
	}
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "bearer") || token == "" {
		return nil, status.Error(codes.Unauthenticated, errNoHTTPToken)
	}
	p, ok := s.auth.authenticate(token)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "the bearer token is not valid")
	}
	return p, nil
}

// httpDuration reads parameter name of q: whole seconds ("30"), as HTTP's
// max-age, or a Go duration ("1m30s"). Absent: 0. Negative or malformed:
// INVALID_ARGUMENT.
func httpDuration(q map[string][]string, name string) (time.Duration, error) {
	vs := q[name]
	if len(vs) == 0 || vs[0] == "" {
		return 0, nil
	}
	v := vs[0]
	var d time.Duration
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n > math.MaxInt64/int64(time.Second) {
			n = math.MaxInt64 / int64(time.Second)
		}
		d = time.Duration(n) * time.Second
	} else if d, err = time.ParseDuration(v); err != nil {
		return 0, status.Errorf(codes.InvalidArgument, "%s %q must be whole seconds or a duration such as 1m30s", name, v)
	}
	if d < 0 {
		return 0, status.Errorf(codes.InvalidArgument, "%s %q must not be negative", name, v)
	}
	return d, nil
}

// etagMatches applies If-None-Match's weak comparison (RFC 9110 13.1.2):
// any listed tag equal to etag once W/ is dropped, or "*".
func etagMatches(inm []string, etag string) bool {
	want := strings.TrimPrefix(etag, "W/")
	for _, v := range inm {
		for tag := range strings.SplitSeq(v, ",") {
			tag = strings.TrimSpace(tag)
			if tag == "*" || strings.TrimPrefix(tag, "W/") == want {
				return true
			}
		}
	}
	return false
}

// doorError is an error of the door itself (a path or method it does not
// serve), with its HTTP status.
type doorError struct {
	status int
	code   codes.Code
	msg    string
}

func (e *doorError) Error() string { return e.msg }

func httpError(httpStatus int, code codes.Code, format string, args ...any) error {
	return &doorError{status: httpStatus, code: code, msg: fmt.Sprintf(format, args...)}
}

// writeError writes err as coordd's one rendering of an error
// (httprender.SetError: the status, Retry-After, X-Coordd-Error and the
// JSON body) and returns its gRPC code for the call log. A doorError
// keeps its own status.
func writeError(w http.ResponseWriter, err error) codes.Code {
	var de *doorError
	var e httprender.Error
	httpStatus := 0
	if errors.As(err, &de) {
		httpStatus, e = de.status, httprender.Error{Code: de.code, Message: de.msg}
	} else {
		e = httprender.FromStatus(status.Convert(err))
	}
	httpStatus, body := httprender.SetError(w.Header(), e, httpStatus)
	w.WriteHeader(httpStatus)
	_, _ = w.Write(body)
	return e.Code
}

func writeJSON(w http.ResponseWriter, httpStatus int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(httpStatus)
	_, err = w.Write(append(b, '\n'))
	return err
}

// finished logs the call's line as the gRPC interceptors do: the same
// message, level and rate limit, with the gRPC code the call would have
// had (grpc.code) and the HTTP method, path and status.
func (h *httpDoor) finished(ctx context.Context, r *http.Request, method string, start time.Time, httpStatus int, code codes.Code, err error) {
	lvl := callLevel(code)
	if !h.calls.enabled(ctx, lvl) {
		return
	}
	fields := []any{
		"protocol", "http", "http.method", r.Method, "http.path", r.URL.Path,
		"http.status", httpStatus,
		"grpc.service", coorddv1.CoordinatorService_ServiceDesc.ServiceName, "grpc.method", method,
		"grpc.start_time", start.Format(time.RFC3339), "grpc.code", code.String(),
		"grpc.time_ms", float64(time.Since(start).Microseconds()) / 1000,
		"peer.address", r.RemoteAddr,
	}
	if err != nil {
		fields = append(fields, "grpc.error", err.Error())
	}
	h.calls.Log(ctx, lvl, "finished call", fields...)
}

// statusWriter records the status written, for the call log.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
