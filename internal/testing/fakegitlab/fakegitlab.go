// Package fakegitlab is a GitLab REST API (v4) on loopback, as much of it
// as the reference GitLab MCP server (@modelcontextprotocol/server-gitlab)
// calls in the gateway's tests: file contents and issue creation. It
// counts every request by route and token, and can hold requests until
// released.
package fakegitlab

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// API is a running fake.
type API struct {
	URL string // the API base, such as http://127.0.0.1:PORT/api/v4

	mu       sync.Mutex
	files    map[string]int // "token path" -> requests
	issues   atomic.Int64
	requests atomic.Int64
	hold     chan struct{} // non-nil: requests wait for it to close
	opt      Options
	window   atomic.Int64 // the second of the rate limit's window
	inWindow atomic.Int64
	limited  atomic.Int64
}

// Options shape an API.
type Options struct {
	// RateLimit, when positive, answers 429 (Retry-After: 1) to requests
	// past that many in one second, as GitLab's limits do.
	RateLimit int
	// Latency is how long each answer takes.
	Latency time.Duration
}

// TB is what Start needs of a test (or of a benchmark's host).
type TB interface{ Cleanup(func()) }

// Start starts an API, stopped when t ends.
func Start(t TB, opts ...Options) *API {
	a := &API{files: map[string]int{}}
	if len(opts) > 0 {
		a.opt = opts[0]
	}
	srv := httptest.NewServer(http.HandlerFunc(a.serve))
	t.Cleanup(srv.Close)
	a.URL = srv.URL + "/api/v4"
	return a
}

// Hold makes every request wait, once counted, until the returned
// function is called.
func (a *API) Hold() (release func()) {
	ch := make(chan struct{})
	a.mu.Lock()
	a.hold = ch
	a.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}

// Files returns how many file requests were made in all.
func (a *API) Files() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, c := range a.files {
		n += c
	}
	return n
}

// FilesBy returns how many file requests carried token.
func (a *API) FilesBy(token string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for k, c := range a.files {
		if strings.HasPrefix(k, token+" ") {
			n += c
		}
	}
	return n
}

// Issues returns how many issues were created.
func (a *API) Issues() int { return int(a.issues.Load()) }

// Requests returns how many requests reached the API.
func (a *API) Requests() int { return int(a.requests.Load()) }

// Owner is the name the API gives the holder of token in what it
// answers: a caller can tell whose answer it got.
func Owner(token string) string {
	s := sha256.Sum256([]byte(token))
	return "user-" + hex.EncodeToString(s[:4])
}

// wait waits for a hold to end; false if the request ended first.
func (a *API) wait(r *http.Request) bool {
	a.mu.Lock()
	hold := a.hold
	a.mu.Unlock()
	if hold == nil {
		return true
	}
	select {
	case <-hold:
		return true
	case <-r.Context().Done():
		return false
	}
}

// Limited returns how many requests were answered 429.
func (a *API) Limited() int { return int(a.limited.Load()) }

func (a *API) serve(w http.ResponseWriter, r *http.Request) {
	a.requests.Add(1)
	if a.opt.RateLimit > 0 {
		sec := time.Now().Unix()
		if a.window.Swap(sec) != sec {
			a.inWindow.Store(0)
		}
		if a.inWindow.Add(1) > int64(a.opt.RateLimit) {
			a.limited.Add(1)
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"message":"429 Too Many Requests"}`, http.StatusTooManyRequests)
			return
		}
	}
	if a.opt.Latency > 0 {
		time.Sleep(a.opt.Latency)
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		http.Error(w, `{"message":"401 Unauthorized"}`, http.StatusUnauthorized)
		return
	}
	path := strings.TrimPrefix(r.URL.EscapedPath(), "/api/v4")
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == http.MethodGet && strings.Contains(path, "/repository/files/"):
		_, file, _ := strings.Cut(path, "/repository/files/")
		a.mu.Lock()
		a.files[tok+" "+file]++
		a.mu.Unlock()
		if !a.wait(r) {
			return
		}
		content := "contents of " + file + " for " + Owner(tok) + "\n"
		_ = json.NewEncoder(w).Encode(map[string]any{
			"file_name": file, "file_path": file, "size": len(content), "encoding": "base64",
			"content": base64.StdEncoding.EncodeToString([]byte(content)), "content_sha256": "0",
			"ref": r.URL.Query().Get("ref"), "blob_id": "b", "last_commit_id": "c",
		})
	case r.Method == http.MethodPost && strings.HasSuffix(path, "/issues"):
		n := a.issues.Add(1)
		if !a.wait(r) {
			return
		}
		var in struct {
			Title       string `json:"title"`
			Description string `json:"description"`
		}
		_ = json.NewDecoder(r.Body).Decode(&in)
		user := map[string]any{"username": Owner(tok), "id": 1, "name": Owner(tok), "avatar_url": "", "web_url": ""}
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]any{
			"id": n, "iid": n, "project_id": 1, "title": in.Title, "description": in.Description, "state": "opened",
			"author": user, "assignees": []any{}, "labels": []any{}, "milestone": nil,
			"created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z", "closed_at": nil, "web_url": "",
		})
	default:
		http.Error(w, `{"message":"404 Not Found"}`, http.StatusNotFound)
	}
}
