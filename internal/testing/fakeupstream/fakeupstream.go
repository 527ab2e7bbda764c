// Package fakeupstream serves a local stand-in for the documentation
// upstream (developer.mozilla.org) that misbehaves on command.
//
// An Upstream is an httptest.Server on 127.0.0.1. By default every path
// answers 200 with a deterministic HTML body derived from the path (see
// Body) and an ETag. Tests script other answers per path, or for all paths,
// with Behavior values: error statuses, Retry-After headers, delays, hangs,
// redirects, connection resets and 304s for conditional requests. Every
// request is recorded, so tests can assert how often and when the upstream
// was hit and with which headers.
package fakeupstream

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// AllPaths, passed as the path to Set, SetSequence, SetCycle, FailEvery and
// Clear, scripts every path that has no script of its own.
const AllPaths = "*"

// DefaultSize is the length in bytes of the default body of a path.
const DefaultSize = 1024

// Behavior describes how the upstream answers one request. The zero value
// answers like the default: 200, Body(path), Content-Type
// text/html; charset=utf-8, and an ETag.
//
// A Behavior is applied in this order: Delay, Block, Reset, Handler, then
// the response described by the remaining fields. If the request's context
// ends (the client gave up) during Delay or Block, nothing is written; if
// the Upstream is closed, the connection is dropped without an answer.
type Behavior struct {
	// Status is the response status code. Default: 200.
	Status int
	// Body is the response body. Default: SizedBody(path, Size) if Size > 0;
	// otherwise Body(path) for a 2xx status, or the status text (e.g.
	// "Service Unavailable\n") for any other. Statuses that forbid a body
	// (1xx, 204, 304) send none.
	Body []byte
	// Size, when positive and Body is nil, makes the body SizedBody(path, Size).
	Size int
	// Header is added to the response, replacing the defaults of the same
	// name (Content-Type, ETag, Content-Length). Use it for Retry-After,
	// Location, Cache-Control and the like.
	Header http.Header
	// ETag is sent as the ETag header of a 2xx response, quotes included.
	// Default: a strong tag derived from the body (see Upstream.ETag).
	ETag string
	// Conditional makes a 2xx response honour If-None-Match: a request
	// whose If-None-Match matches the ETag (weak comparison, or "*") gets
	// 304 Not Modified with the ETag and no body. It is still counted.
	Conditional bool
	// Delay holds the response back this long.
	Delay time.Duration
	// Block, if non-nil, holds the response until Block is closed, then
	// answers as the other fields say. Hang uses a channel never closed.
	Block <-chan struct{}
	// Reset answers by resetting the TCP connection (hijack, SO_LINGER 0,
	// close) without writing a response: the client gets a network error.
	Reset bool
	// Handler, if non-nil, serves the request after Delay and Block; the
	// remaining fields are then ignored.
	Handler http.Handler
}

// Status returns a Behavior answering with code and its default body.
func Status(code int) Behavior {
	return Behavior{Status: code}
}

// Redirect returns a Behavior answering 302 Found with Location: to.
func Redirect(to string) Behavior {
	return Behavior{Status: http.StatusFound, Header: http.Header{"Location": {to}}}
}

// Hang returns a Behavior that never answers: the handler waits until the
// client gives up (its request context ends) or the Upstream is closed.
func Hang() Behavior {
	return Behavior{Block: make(chan struct{})}
}

// ResetConnection returns a Behavior that resets the connection instead of
// answering. Note that Go's http.Transport retries an idempotent request
// once if it fails on a reused keep-alive connection, so one client call
// may be counted twice and consume two steps of a sequence.
func ResetConnection() Behavior {
	return Behavior{Reset: true}
}

// WithHeader returns a copy of b with value added to the response header
// key, e.g. Status(429).WithHeader("Retry-After", "1"). b is not modified.
func (b Behavior) WithHeader(key, value string) Behavior {
	h := b.Header.Clone()
	if h == nil {
		h = http.Header{}
	}
	h.Add(key, value)
	b.Header = h
	return b
}

// script is the behaviour programmed for one path (or AllPaths).
type script struct {
	steps []Behavior
	cycle bool           // after the last step, start again; otherwise the last step repeats
	pos   map[string]int // requests served so far, per request path
}

// next returns the behaviour for the next request to path and advances.
func (s *script) next(path string) Behavior {
	n := s.pos[path]
	s.pos[path] = n + 1
	switch {
	case s.cycle:
		return s.steps[n%len(s.steps)]
	case n < len(s.steps):
		return s.steps[n]
	default:
		return s.steps[len(s.steps)-1]
	}
}

// Upstream is a fake documentation server. All its methods are safe for
// concurrent use, including while requests are being served.
//
// Requests are matched, counted and recorded by URL path alone (decoded, as
// net/http gives it); the query string is ignored. RequestURIs has each
// request's target as sent, escapes and query included.
type Upstream struct {
	srv       *httptest.Server
	closing   chan struct{} // closed by Close to release blocked handlers
	closeOnce sync.Once

	mu      sync.Mutex // protects the fields below
	scripts map[string]*script
	total   int
	counts  map[string]int
	times   map[string][]time.Time
	headers map[string]http.Header
	uris    []string      // every request's RequestURI, in arrival order
	arrived chan struct{} // closed and replaced on every request, to wake WaitCount
}

// New starts an Upstream on a free 127.0.0.1 port. It is closed when t ends.
func New(t testing.TB) *Upstream {
	t.Helper()
	u := &Upstream{
		closing: make(chan struct{}),
		scripts: make(map[string]*script),
		counts:  make(map[string]int),
		times:   make(map[string][]time.Time),
		headers: make(map[string]http.Header),
		arrived: make(chan struct{}),
	}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serveHTTP))
	t.Cleanup(u.Close)
	return u
}

// URL returns the base URL, e.g. "http://127.0.0.1:41234", with no
// trailing slash.
func (u *Upstream) URL() string {
	return u.srv.URL
}

// Client returns a new *http.Client for the Upstream, which the caller may
// adjust (Timeout, CheckRedirect). All such clients share one Transport,
// whose idle connections Close closes.
func (u *Upstream) Client() *http.Client {
	c := *u.srv.Client()
	return &c
}

// Close shuts the Upstream down: blocked and delayed handlers return
// without answering, open connections are closed, and later connections
// are refused, as for an upstream that went away. It waits for handlers to
// finish. Calling it again is a no-op.
func (u *Upstream) Close() {
	u.closeOnce.Do(func() {
		close(u.closing)
		u.srv.CloseClientConnections()
		u.srv.Close()
	})
}

// Set makes every request to path answer as b, replacing any script.
func (u *Upstream) Set(path string, b Behavior) {
	u.SetSequence(path, []Behavior{b})
}

// SetSequence scripts path: the n-th request from now (counted per request
// path, also under AllPaths) gets steps[n-1], and once the steps run out the
// last one repeats. For "429 twice, then 200":
//
//	u.SetSequence(p, []fakeupstream.Behavior{
//		fakeupstream.Status(429).WithHeader("Retry-After", "1"),
//		fakeupstream.Status(429).WithHeader("Retry-After", "1"),
//		{},
//	})
//
// An empty steps is the same as Clear(path). The slice is copied.
func (u *Upstream) SetSequence(path string, steps []Behavior) {
	u.setScript(path, steps, false)
}

// SetCycle scripts path like SetSequence, except that after the last step
// the steps start again: SetCycle(p, []Behavior{Status(503), {}}) fails
// every other request, deterministically.
func (u *Upstream) SetCycle(path string, steps []Behavior) {
	u.setScript(path, steps, true)
}

// FailEvery makes every n-th request to path from now (the n-th, 2n-th, ...)
// answer as fail and the others as the default. FailEvery(p, 2, Status(503))
// fails half the requests; FailEvery(p, 1, ...) fails all. It panics if
// n < 1.
func (u *Upstream) FailEvery(path string, n int, fail Behavior) {
	if n < 1 {
		panic("fakeupstream: FailEvery with n < 1")
	}
	steps := make([]Behavior, n)
	steps[n-1] = fail
	u.SetCycle(path, steps)
}

// Clear removes path's script, so it answers as the AllPaths script, or as
// the default if there is none. Clear(AllPaths) removes the AllPaths script.
func (u *Upstream) Clear(path string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.scripts, path)
}

func (u *Upstream) setScript(path string, steps []Behavior, cycle bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(steps) == 0 {
		delete(u.scripts, path)
		return
	}
	u.scripts[path] = &script{
		steps: append([]Behavior(nil), steps...),
		cycle: cycle,
		pos:   make(map[string]int),
	}
}

// Reset forgets every recorded request and rewinds every script to its
// first step. Scripts themselves are kept.
func (u *Upstream) Reset() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.total = 0
	clear(u.counts)
	clear(u.times)
	clear(u.headers)
	u.uris = nil
	for _, s := range u.scripts {
		clear(s.pos)
	}
}

// Count returns how many requests for path have arrived, whatever their
// outcome (304s, resets and hangs included).
func (u *Upstream) Count(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.counts[path]
}

// Total returns how many requests have arrived, for all paths.
func (u *Upstream) Total() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.total
}

// Paths returns the paths requested so far, sorted.
func (u *Upstream) Paths() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	paths := make([]string, 0, len(u.counts))
	for p := range u.counts {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	return paths
}

// RequestURIs returns the request target of every request so far, as sent
// on the wire (r.RequestURI: escapes as the client wrote them, query
// included), in arrival order. The slice is a copy.
func (u *Upstream) RequestURIs() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.uris...)
}

// Times returns the arrival time of each request for path, oldest first.
// The slice is a copy.
func (u *Upstream) Times(path string) []time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]time.Time(nil), u.times[path]...)
}

// Arrivals returns when every request for a path starting with prefix
// reached u, sorted.
func (u *Upstream) Arrivals(prefix string) []time.Time {
	var ts []time.Time
	for _, p := range u.Paths() {
		if strings.HasPrefix(p, prefix) {
			ts = append(ts, u.Times(p)...)
		}
	}
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	return ts
}

// ArrivalJitter is how far an admitted request's arrival at the fake
// upstream may drift from its slot on a loaded 2-core machine (goroutine
// scheduling, the race detector, a new connection's handshake): rate
// checks count arrivals in windows this much shorter than the second the
// limit is defined over. 100ms was not enough: beside stress-ng,
// TestRateLimitAcrossInstances saw 32-35 arrivals of 30/s slots in a 900ms
// window, delayed requests bunching with on-time ones. A limit that is not
// shared, or not applied, still shows at least twice the rate in 750ms.
const ArrivalJitter = 250 * time.Millisecond

// MaxInWindow returns the most of ts (sorted) that fall in any half-open
// window [t, t+w).
func MaxInWindow(ts []time.Time, w time.Duration) int {
	most, j := 0, 0
	for i := range ts {
		for j < len(ts) && ts[j].Sub(ts[i]) < w {
			j++
		}
		most = max(most, j-i)
	}
	return most
}

// LastHeader returns the request header of the latest request for path, or
// nil if there was none. It is a copy.
func (u *Upstream) LastHeader(path string) http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.headers[path].Clone()
}

// WaitCount blocks until at least n requests for path have arrived (been
// recorded, before their Behavior runs) or ctx ends, in which case it
// returns ctx.Err(). Use it instead of sleeping to know a request is in
// flight, e.g. held by Block.
func (u *Upstream) WaitCount(ctx context.Context, path string, n int) error {
	for {
		u.mu.Lock()
		got, arrived := u.counts[path], u.arrived
		u.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-arrived:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Body returns the default body of path: SizedBody(path, DefaultSize).
func (u *Upstream) Body(path string) []byte {
	return SizedBody(path, DefaultSize)
}

// ETag returns the ETag sent with the default body of path.
func (u *Upstream) ETag(path string) string {
	return etagOf(u.Body(path))
}

// SizedBody returns the deterministic body of exactly n bytes that path
// gets for Behavior.Size n: the line "doc:<path>\n" repeated and cut at n.
func SizedBody(path string, n int) []byte {
	if n <= 0 {
		return []byte{}
	}
	line := "doc:" + path + "\n"
	return []byte(strings.Repeat(line, n/len(line)+1)[:n])
}

// etagOf returns a strong ETag derived from body.
func etagOf(body []byte) string {
	sum := sha256.Sum256(body)
	return `"` + hex.EncodeToString(sum[:8]) + `"`
}

func (u *Upstream) serveHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	u.mu.Lock()
	u.total++
	u.counts[path]++
	u.times[path] = append(u.times[path], time.Now())
	u.headers[path] = r.Header.Clone()
	u.uris = append(u.uris, r.RequestURI)
	var b Behavior
	if s := u.scripts[path]; s != nil {
		b = s.next(path)
	} else if s := u.scripts[AllPaths]; s != nil {
		b = s.next(path)
	}
	close(u.arrived)
	u.arrived = make(chan struct{})
	u.mu.Unlock()

	ctx := r.Context()
	if b.Delay > 0 {
		t := time.NewTimer(b.Delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		case <-u.closing:
			t.Stop()
			panic(http.ErrAbortHandler) // drop the connection without answering
		}
	}
	if b.Block != nil {
		select {
		case <-b.Block:
		case <-ctx.Done():
			return
		case <-u.closing:
			panic(http.ErrAbortHandler) // drop the connection without answering
		}
	}
	if b.Reset {
		resetConn(w)
		return
	}
	if b.Handler != nil {
		b.Handler.ServeHTTP(w, r)
		return
	}
	u.respond(w, r, path, b)
}

// respond writes the response b describes.
func (u *Upstream) respond(w http.ResponseWriter, r *http.Request, path string, b Behavior) {
	status := b.Status
	if status == 0 {
		status = http.StatusOK
	}
	ok := status >= 200 && status < 300
	body := b.Body
	switch {
	case body != nil:
	case b.Size > 0:
		body = SizedBody(path, b.Size)
	case ok:
		body = u.Body(path)
	default:
		body = []byte(http.StatusText(status) + "\n")
	}
	if !bodyAllowed(status) {
		body = nil
	}

	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	if ok {
		etag := b.ETag
		if etag == "" {
			etag = etagOf(body)
		}
		h.Set("ETag", etag)
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	for k, vs := range b.Header {
		h.Del(k)
		for _, v := range vs {
			h.Add(k, v)
		}
	}
	if ok && b.Conditional && etagMatch(r.Header.Values("If-None-Match"), h.Get("ETag")) {
		h.Del("Content-Type")
		h.Del("Content-Length")
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.WriteHeader(status)
	if r.Method != http.MethodHead && len(body) > 0 {
		_, _ = w.Write(body)
	}
}

// bodyAllowed reports whether a response with status may carry a body.
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// etagMatch reports whether an If-None-Match header matches etag, using
// the weak comparison RFC 9110 prescribes for If-None-Match.
func etagMatch(inm []string, etag string) bool {
	if etag == "" {
		return false
	}
	for _, line := range inm {
		for _, c := range strings.Split(line, ",") {
			c = strings.TrimSpace(c)
			if c == "*" || (c != "" && strings.TrimPrefix(c, "W/") == strings.TrimPrefix(etag, "W/")) {
				return true
			}
		}
	}
	return false
}

// resetConn closes the request's connection with SO_LINGER 0, so the
// client reads a TCP RST rather than a clean EOF.
func resetConn(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler) // not HTTP/1: abort the stream instead
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}
