// Package fakeapi serves a local stand-in for a JSON API with
// credentials, shaped like GitHub's REST API: a token check, per-token
// rate-limit headers (x-ratelimit-*), ETags and 304s, Link pagination,
// Vary: Accept, and Cache-Control: private on authenticated answers. Every
// answer names the login it was made for, so that a test can tell whose
// answer a caller got. Every request is counted by path and login.
//
// With Options.Window set it also enforces GitHub's rate limits, scaled
// down: a primary limit of Limit requests per Window per login (the core
// and search resources apart), answered 403 (or 429) with the
// x-ratelimit-* headers as GitHub sends them, and, with
// Options.MaxConcurrent, a secondary limit: past that many concurrent
// requests of one login, 403 with Retry-After. Stats counts, per login,
// what was served and refused.
//
// Endpoints (GET only; anything else 405):
//
//	/user                     {"login": …}; 401 without a token
//	/repos/{o}/{r}/issues     ?page=N&per_page=M, a JSON array, Link rel=next/prev/first/last
//	/repos/{o}/{r}/readme     Accept: application/vnd.github.raw gives text; else JSON
//	/search/issues            {"total_count": 0, "items": []}, counted against the search resource
//	/_fake/stats              the counts as JSON (not counted), for tests in other languages
package fakeapi

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Options configure an API. Zero fields take the defaults written beside
// them.
type Options struct {
	// Tokens maps a token to the login it authenticates. A request sends
	// "Authorization: Bearer <token>" or "Authorization: token <token>";
	// an unknown token is 401 Bad credentials.
	Tokens map[string]string
	// Limit is the requests each login may make per hour; anonymous
	// callers get 60 (by the client's address, as GitHub). Default: 5000.
	Limit int
	// Delay holds every answer this long, so that concurrent callers
	// overlap. Default: none.
	Delay time.Duration
	// Issues is the number of issues each repository has. Default: 75.
	Issues int

	// Window, when set, turns on GitHub's primary rate limit, scaled:
	// each login ("" anonymous, by itself) may make Limit requests per
	// Window to the core resource and SearchLimit to the search resource
	// (/search/…), counted apart. A window starts at a login's first
	// request to the resource once the last window has ended, at the start
	// of that second, so that X-RateLimit-Reset (epoch seconds, as GitHub
	// sends it) is exact. A request past the limit is answered
	// LimitStatus with X-RateLimit-Remaining: 0 and no Retry-After, as
	// GitHub answers, and is not served. Every answer carries
	// x-ratelimit-limit, -remaining, -reset, -used and -resource. Default:
	// 0, the limit of an hour that never resets (Limit a login may make
	// in all), with a Retry-After on the 403.
	Window time.Duration
	// SearchLimit is the search resource's requests per Window. Default:
	// 30.
	SearchLimit int
	// LimitStatus is the status of an answer past the primary limit:
	// http.StatusForbidden (GitHub's) or http.StatusTooManyRequests.
	// Default: 403.
	LimitStatus int
	// MaxConcurrent, when positive, is GitHub's secondary rate limit
	// (scaled): a request arriving while that many of the same login's
	// requests are being served is answered 403 with Retry-After
	// (SecondaryRetryAfter), and is neither served nor counted against
	// the primary limit. Default: 0, none.
	MaxConcurrent int
	// SecondaryRetryAfter is the Retry-After of a secondary-limit 403,
	// rounded up to whole seconds. Default: 1s (GitHub's is a minute or
	// more, unscaled).
	SecondaryRetryAfter time.Duration
	// Now is the clock of the windows and of X-RateLimit-Reset, so that
	// a test can move time instead of sleeping. Default: time.Now.
	Now func() time.Time
}

// Stats are one login's counts under the rate limits.
type Stats struct {
	// Served counts the requests answered within the limits (whatever
	// the endpoint answered: 200, 304, 404).
	Served int `json:"served"`
	// Refused403 and Refused429 count the requests refused by a limit,
	// by status; Secondary counts those the secondary limit refused (all
	// of them 403s).
	Refused403 int `json:"refused_403"`
	Refused429 int `json:"refused_429"`
	Secondary  int `json:"secondary"`
	// MaxConcurrent is the most of the login's requests served at once.
	MaxConcurrent int `json:"max_concurrent"`
	// Windows counts the primary-limit windows begun (Options.Window).
	Windows int `json:"windows"`
	// MaxWindowRequests is the most requests that arrived in one window
	// of one resource, refused ones included: the demand put on a quota
	// of Limit.
	MaxWindowRequests int `json:"max_window_requests"`
}

// window is one login's current primary-limit window on one resource.
type window struct {
	start, reset time.Time
	used         int // requests served in it
	arrived      int // requests that arrived in it, refused ones included
}

// quotaKey is a login's quota on one resource ("core", "search").
type quotaKey struct{ login, resource string }

// API is a running fake API. Its methods are safe for concurrent use.
type API struct {
	srv  *httptest.Server
	opts Options
	mu   sync.Mutex
	hits map[Hit]int    // requests, by path (with query) and login
	used map[string]int // rate-limit use, by login ("" anonymous)
	// Headers records the request headers of the last request per path.
	last map[string]http.Header

	windows  map[quotaKey]*window // the primary limit's, with Options.Window
	inFlight map[string]int       // requests being served, by login
	limits   map[string]*Stats    // by login
	// changed is closed and replaced whenever a request is admitted or
	// leaves, so that a test can wait for that instead of polling.
	changed chan struct{}
}

// Hit is one kind of request counted: its path with the query, and the
// login it was made as ("" anonymous).
type Hit struct {
	Path  string `json:"path"`
	Login string `json:"login"`
}

// Start serves an API on 127.0.0.1.
func Start(opts Options) *API {
	if opts.Limit == 0 {
		opts.Limit = 5000
	}
	if opts.Issues == 0 {
		opts.Issues = 75
	}
	if opts.SearchLimit == 0 {
		opts.SearchLimit = 30
	}
	if opts.LimitStatus == 0 {
		opts.LimitStatus = http.StatusForbidden
	}
	if opts.SecondaryRetryAfter <= 0 {
		opts.SecondaryRetryAfter = time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	a := &API{opts: opts, hits: map[Hit]int{}, used: map[string]int{}, last: map[string]http.Header{},
		windows: map[quotaKey]*window{}, inFlight: map[string]int{}, limits: map[string]*Stats{},
		changed: make(chan struct{})}
	a.srv = httptest.NewServer(http.HandlerFunc(a.serve))
	return a
}

// New starts an API closed when t ends.
func New(t testing.TB, opts Options) *API {
	a := Start(opts)
	t.Cleanup(a.Close)
	return a
}

// URL is the API's base url, without a trailing slash.
func (a *API) URL() string { return a.srv.URL }

// Close stops the API.
func (a *API) Close() { a.srv.Close() }

// Requests returns how many requests for path (with its query, as sent)
// were made as login ("" anonymous).
func (a *API) Requests(path, login string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.hits[Hit{path, login}]
}

// Total returns every request counted.
func (a *API) Total() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, c := range a.hits {
		n += c
	}
	return n
}

// Stats returns login's counts under the rate limits ("" anonymous).
func (a *API) Stats(login string) Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	if st := a.limits[login]; st != nil {
		return *st
	}
	return Stats{}
}

// LastHeader returns the headers of the last request for path.
func (a *API) LastHeader(path string) http.Header {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.last[path].Clone()
}

func (a *API) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/_fake/stats" {
		a.stats(w)
		return
	}
	login, ok := a.login(r)
	path := r.URL.RequestURI()
	a.mu.Lock()
	a.hits[Hit{path, login}]++
	a.last[r.URL.Path] = r.Header.Clone()
	a.mu.Unlock()
	limited := ok && (r.Method == http.MethodGet || r.Method == http.MethodHead) && (a.opts.Window > 0 || a.opts.MaxConcurrent > 0)
	if limited {
		if !a.enter(w, login, resourceOf(r.URL.Path)) {
			return
		}
		defer a.leave(login)
	}
	if a.opts.Delay > 0 {
		select {
		case <-time.After(a.opts.Delay):
		case <-r.Context().Done():
			return
		}
	}
	h := w.Header()
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Set-Cookie", "_fake_session=s3cr3t; Path=/; HttpOnly") // a shared cache must drop it
	h.Set("X-GitHub-Media-Type", "github.v3")
	if !ok {
		writeJSON(w, http.StatusUnauthorized, map[string]string{"message": "Bad credentials"})
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"message": "Not Found"})
		return
	}
	if a.opts.Window == 0 && !a.spend(w, login) {
		return
	}
	if login != "" {
		h.Set("Cache-Control", "private, max-age=60, s-maxage=60")
		h.Set("Vary", "Accept, Authorization, Cookie, X-GitHub-OTP")
	} else {
		h.Set("Cache-Control", "public, max-age=60, s-maxage=60")
		h.Set("Vary", "Accept")
	}
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case r.URL.Path == "/user":
		if login == "" {
			writeJSON(w, http.StatusUnauthorized, map[string]string{"message": "Requires authentication"})
			return
		}
		a.answer(w, r, map[string]any{"login": login, "viewer": login})
	case len(parts) == 4 && parts[0] == "repos" && parts[3] == "issues":
		a.issues(w, r, parts[1]+"/"+parts[2], login)
	case r.URL.Path == "/search/issues":
		a.answer(w, r, map[string]any{"total_count": 0, "incomplete_results": false, "items": []any{}})
	case len(parts) == 4 && parts[0] == "repos" && parts[3] == "readme":
		if strings.Contains(r.Header.Get("Accept"), "application/vnd.github.raw") {
			h.Set("Content-Type", "text/plain; charset=utf-8")
			a.answerBytes(w, r, []byte("# "+parts[2]+"\nread by "+viewer(login)+"\n"))
			return
		}
		a.answer(w, r, map[string]any{"name": "README.md", "encoding": "base64", "viewer": viewer(login),
			"content": base64.StdEncoding.EncodeToString([]byte("# " + parts[2] + "\n"))})
	default:
		writeJSON(w, http.StatusNotFound, map[string]string{"message": "Not Found"})
	}
}

func viewer(login string) string {
	if login == "" {
		return "anonymous"
	}
	return login
}

// login finds the request's login; false for a token that is unknown.
func (a *API) login(r *http.Request) (string, bool) {
	v := r.Header.Get("Authorization")
	if v == "" {
		return "", true
	}
	scheme, tok, _ := strings.Cut(v, " ")
	if !strings.EqualFold(scheme, "bearer") && !strings.EqualFold(scheme, "token") {
		return "", false
	}
	login, ok := a.opts.Tokens[tok]
	return login, ok
}

// spend counts a request against login's quota and sets the rate-limit
// headers; false (and a 403, as GitHub answers) when none is left.
func (a *API) spend(w http.ResponseWriter, login string) bool {
	limit := a.opts.Limit
	if login == "" {
		limit = 60
	}
	a.mu.Lock()
	used := a.used[login]
	spent := used < limit
	if spent {
		used++
		a.used[login] = used
	}
	a.mu.Unlock()
	h := w.Header()
	reset := time.Now().Add(time.Hour).Truncate(time.Hour).Unix()
	h.Set("X-RateLimit-Limit", strconv.Itoa(limit))
	h.Set("X-RateLimit-Remaining", strconv.Itoa(limit-used))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(reset, 10))
	h.Set("X-RateLimit-Used", strconv.Itoa(used))
	h.Set("X-RateLimit-Resource", "core")
	if !spent {
		h.Set("Retry-After", strconv.FormatInt(max(reset-time.Now().Unix(), 1), 10))
		writeJSON(w, http.StatusForbidden, map[string]string{"message": "API rate limit exceeded for " + viewer(login)})
		return false
	}
	return true
}

// resourceOf is the GitHub rate-limit resource a path counts against.
func resourceOf(path string) string {
	if strings.HasPrefix(path, "/search/") {
		return "search"
	}
	return "core"
}

// enter admits a request of login to resource under the secondary and
// the windowed primary limit, setting the x-ratelimit-* headers (with a
// Window); false once it has answered the refusal. An admitted request
// must leave.
func (a *API) enter(w http.ResponseWriter, login, resource string) bool {
	now := a.opts.Now()
	a.mu.Lock()
	st := a.limits[login]
	if st == nil {
		st = &Stats{}
		a.limits[login] = st
	}
	var win *window
	limit := 0
	if a.opts.Window > 0 {
		limit = a.limitOf(login, resource)
		k := quotaKey{login, resource}
		win = a.windows[k]
		if win == nil || !now.Before(win.reset) {
			start := now.Truncate(time.Second)
			win = &window{start: start, reset: start.Add(a.opts.Window)}
			a.windows[k] = win
			st.Windows++
		}
		win.arrived++
		st.MaxWindowRequests = max(st.MaxWindowRequests, win.arrived)
	}
	secondary := a.opts.MaxConcurrent > 0 && a.inFlight[login] >= a.opts.MaxConcurrent
	primary := !secondary && win != nil && win.used >= limit
	admitted := !secondary && !primary
	status := 0
	switch {
	case secondary:
		status = http.StatusForbidden
		st.Secondary++
	case primary:
		status = a.opts.LimitStatus
	default:
		a.inFlight[login]++
		st.MaxConcurrent = max(st.MaxConcurrent, a.inFlight[login])
		st.Served++
		a.signalLocked()
		if win != nil {
			win.used++
		}
	}
	switch status {
	case http.StatusForbidden:
		st.Refused403++
	case http.StatusTooManyRequests:
		st.Refused429++
	}
	var used int
	var reset time.Time
	if win != nil {
		used, reset = win.used, win.reset
	}
	a.mu.Unlock()

	h := w.Header()
	if win != nil {
		h.Set("X-RateLimit-Limit", strconv.Itoa(limit))
		h.Set("X-RateLimit-Remaining", strconv.Itoa(limit-used))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(reset.Unix(), 10))
		h.Set("X-RateLimit-Used", strconv.Itoa(used))
		h.Set("X-RateLimit-Resource", resource)
	}
	switch {
	case secondary:
		secs := int64((a.opts.SecondaryRetryAfter + time.Second - 1) / time.Second)
		h.Set("Retry-After", strconv.FormatInt(secs, 10))
		writeJSON(w, http.StatusForbidden, map[string]string{"message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try again."})
	case primary:
		writeJSON(w, status, map[string]string{"message": "API rate limit exceeded for " + viewer(login) + "."})
	}
	return admitted
}

// leave ends an admitted request of login.
func (a *API) leave(login string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.inFlight[login]--
	a.signalLocked()
}

// signalLocked wakes every waitUntil. a.mu must be held.
func (a *API) signalLocked() {
	close(a.changed)
	a.changed = make(chan struct{})
}

// waitUntil waits until cond, checked after each admission and each
// request's end, holds, or ctx ends (false).
func (a *API) waitUntil(ctx context.Context, cond func() bool) bool {
	for {
		a.mu.Lock()
		ch := a.changed // taken before cond: no change is missed
		a.mu.Unlock()
		if cond() {
			return true
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

// limitOf is the requests per window login may make to resource.
func (a *API) limitOf(login, resource string) int {
	switch {
	case login == "":
		return 60
	case resource == "search":
		return a.opts.SearchLimit
	}
	return a.opts.Limit
}

// issues answers a page of a repository's issues, with Link.
func (a *API) issues(w http.ResponseWriter, r *http.Request, repo, login string) {
	q := r.URL.Query()
	page, perPage := atoi(q.Get("page"), 1), min(atoi(q.Get("per_page"), 30), 100)
	last := max((a.opts.Issues+perPage-1)/perPage, 1)
	link := func(p int, rel string) string {
		return fmt.Sprintf(`<%s/repos/%s/issues?page=%d&per_page=%d>; rel="%s"`, a.srv.URL, repo, p, perPage, rel)
	}
	var links []string
	if page < last {
		links = append(links, link(page+1, "next"), link(last, "last"))
	}
	if page > 1 {
		links = append(links, link(1, "first"), link(page-1, "prev"))
	}
	if len(links) > 0 {
		w.Header().Set("Link", strings.Join(links, ", "))
	}
	var items []map[string]any
	for n := (page-1)*perPage + 1; n <= min(page*perPage, a.opts.Issues); n++ {
		items = append(items, map[string]any{"number": n, "title": fmt.Sprintf("Issue %d of %s", n, repo), "viewer": viewer(login)})
	}
	if items == nil {
		items = []map[string]any{}
	}
	a.answer(w, r, items)
}

func atoi(s string, def int) int {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return def
	}
	return n
}

func (a *API) answer(w http.ResponseWriter, r *http.Request, v any) {
	b, _ := json.Marshal(v)
	a.answerBytes(w, r, append(b, '\n'))
}

// answerBytes writes b with a weak ETag, or 304 to a matching
// If-None-Match.
func (a *API) answerBytes(w http.ResponseWriter, r *http.Request, b []byte) {
	sum := sha256.Sum256(b)
	etag := `W/"` + hex.EncodeToString(sum[:8]) + `"`
	w.Header().Set("ETag", etag)
	if inm := r.Header.Get("If-None-Match"); inm != "" && strings.TrimPrefix(inm, "W/") == strings.TrimPrefix(etag, "W/") {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(b)
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

// stats answers the counts as JSON: {"hits": [{"path", "login", "count"}],
// "total": N, "limits": {login: Stats}}.
func (a *API) stats(w http.ResponseWriter) {
	type row struct {
		Hit
		Count int `json:"count"`
	}
	a.mu.Lock()
	out := struct {
		Hits   []row            `json:"hits"`
		Total  int              `json:"total"`
		Limits map[string]Stats `json:"limits"` // by login
	}{Hits: []row{}, Limits: map[string]Stats{}}
	for h, c := range a.hits {
		out.Hits = append(out.Hits, row{h, c})
		out.Total += c
	}
	for login, st := range a.limits {
		out.Limits[login] = *st
	}
	a.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}
