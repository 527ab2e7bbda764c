// Package fakeapi serves a local stand-in for a JSON API with
// credentials, shaped like GitHub's REST API: a token check, per-token
// rate-limit headers (x-ratelimit-*), ETags and 304s, Link pagination,
// Vary: Accept, and Cache-Control: private on authenticated answers. Every
// answer names the login it was made for, so that a test can tell whose
// answer a caller got. Every request is counted by path and login.
//
// Endpoints (GET only; anything else 405):
//
//	/user                     {"login": …}; 401 without a token
//	/repos/{o}/{r}/issues     ?page=N&per_page=M, a JSON array, Link rel=next/prev/first/last
//	/repos/{o}/{r}/readme     Accept: application/vnd.github.raw gives text; else JSON
//	/_fake/stats              the counts as JSON (not counted), for tests in other languages
package fakeapi

import (
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
}

// API is a running fake API. Its methods are safe for concurrent use.
type API struct {
	srv  *httptest.Server
	opts Options
	mu   sync.Mutex
	hits map[Hit]int    // requests, by path (with query) and login
	used map[string]int // rate-limit use, by login ("" anonymous)
	// Headers records the request headers of the last request per path.
	last map[string]http.Header
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
	a := &API{opts: opts, hits: map[Hit]int{}, used: map[string]int{}, last: map[string]http.Header{}}
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
	if !a.spend(w, login) {
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

// stats answers the counts as JSON: {"hits": [{"path", "login", "count"}], "total": N}.
func (a *API) stats(w http.ResponseWriter) {
	type row struct {
		Hit
		Count int `json:"count"`
	}
	a.mu.Lock()
	out := struct {
		Hits  []row `json:"hits"`
		Total int   `json:"total"`
	}{Hits: []row{}}
	for h, c := range a.hits {
		out.Hits = append(out.Hits, row{h, c})
		out.Total += c
	}
	a.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}
