package coordd_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-github/v75/github"

	coordd "github.com/coordd/coordd/clients/go"
	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/secret"
	"github.com/coordd/coordd/internal/testing/enginetest"
	"github.com/coordd/coordd/internal/testing/fakeapi"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/redistest"
)

// The fake API's tokens, and the logins they authenticate.
const (
	tokAlice = "ghp_alice_0123456789"
	tokBob   = "ghp_bob_0123456789"
)

// ghEnv is coordd instances sharing one Redis in front of a fake GitHub
// API (upstream "gh", taking callers' own credentials), and an upstream
// "down" whose server is gone.
type ghEnv struct {
	api       *fakeapi.API
	instances []*fleettest.Instance
	downURL   string // the base url of upstream "down"
	gate      *gate  // holds the fake API's answers
}

// gate holds upstream requests for a path until it opens.
type gate struct {
	next http.RoundTripper

	mu   sync.Mutex // protects held
	held map[string]chan struct{}
}

// hold makes requests for path wait until the returned func is called.
func (g *gate) hold(path string) (open func()) {
	ch := make(chan struct{})
	g.mu.Lock()
	g.held[path] = ch
	g.mu.Unlock()
	return sync.OnceFunc(func() {
		g.mu.Lock()
		delete(g.held, path)
		g.mu.Unlock()
		close(ch)
	})
}

func (g *gate) RoundTrip(req *http.Request) (*http.Response, error) {
	g.mu.Lock()
	ch := g.held[req.URL.Path]
	g.mu.Unlock()
	if ch != nil {
		select {
		case <-ch:
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
	}
	return g.next.RoundTrip(req)
}

func startGitHubEnv(t *testing.T, n int) *ghEnv {
	t.Helper()
	rd := redistest.Start(t) // skips under -short
	api := fakeapi.New(t, fakeapi.Options{Tokens: map[string]string{tokAlice: "alice", tokBob: "bob"}})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + lis.Addr().String() + "/"
	lis.Close()
	env := &ghEnv{api: api, downURL: down, gate: &gate{next: direct(t), held: map[string]chan struct{}{}}}
	for range n {
		cfg := coordinator.Config{
			CredentialScopeKey: secret.New("scope-key-for-tests-0123456789"),
			Upstreams: []coordinator.Upstream{
				{Name: "gh", BaseURL: api.URL() + "/", ForwardHeaders: []string{"Accept"}, CallerCredentials: true},
				{Name: "down", BaseURL: down, CallerCredentials: true},
			},
		}
		for i := range cfg.Upstreams {
			// One upstream request per fetch, and no breaker: the counts
			// below are per call.
			cfg.Upstreams[i].Protection.Retry.MaxAttempts = 1
			cfg.Upstreams[i].Protection.Breaker = coordinator.BreakerPolicy{FailureThreshold: -1, FailureRate: -1}
		}
		env.instances = append(env.instances, fleettest.Start(t, fleettest.Options{RedisURL: rd.URL(), Config: cfg, Transport: env.gate}))
	}
	return env
}

// httpClient is an *http.Client through instance i.
func (env *ghEnv) httpClient(t *testing.T, i int, topts ...coordd.TransportOption) *http.Client {
	t.Helper()
	c := dial(t, env.instances[i].Addr, coordd.WithRetryPolicy(quickRetries(2)))
	return &http.Client{Transport: coordd.NewTransport(c, topts...)}
}

// github is an unmodified go-github client through hc, authenticated with
// tok, whose API is at base.
func githubClient(t *testing.T, hc *http.Client, base, tok string) *github.Client {
	t.Helper()
	gh := github.NewClient(hc).WithAuthToken(tok)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	gh.BaseURL = u
	return gh
}

// TestGitHubThroughTransport: go-github, as it is, reads the fake GitHub
// API through NewTransport: 3 instances × 30 concurrent identical calls
// make one upstream request per credential and every caller gets its own
// credential's answer; pagination follows Link; a 404 is go-github's
// *ErrorResponse; an upstream that is down is a 503 with Retry-After;
// POST fails with ErrNotCarried or goes to the fallback; HEAD has headers
// and no body.
func TestGitHubThroughTransport(t *testing.T) {
	env := startGitHubEnv(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := env.api.URL() + "/"

	t.Run("one fetch per credential", func(t *testing.T) {
		const perInstance = 30
		logins := map[string]string{tokAlice: "alice", tokBob: "bob"}
		callers := perInstance * len(env.instances) * len(logins)
		// The fake API holds its answers until every caller waits in a
		// flight on some instance, so the calls are concurrent in fact.
		open := env.gate.hold("/user")
		defer open()
		cs := make([]*coordinator.Coordinator, len(env.instances))
		for i, in := range env.instances {
			cs[i] = in.Coordinator
		}
		joined := make(chan error, 1)
		go func() {
			defer open()
			joined <- enginetest.AwaitJoined(ctx, base+"user", callers, cs...)
		}()

		var wg sync.WaitGroup
		errs := make(chan error, callers)
		sources := make(chan string, callers)
		for tok, login := range logins {
			for i := range env.instances {
				gh := githubClient(t, env.httpClient(t, i), base, tok)
				for range perInstance {
					wg.Go(func() {
						user, res, err := gh.Users.Get(ctx, "")
						switch {
						case err != nil:
							errs <- fmt.Errorf("%s on instance %d: %v", login, i, err)
						case user.GetLogin() != login:
							errs <- fmt.Errorf("%s on instance %d got %s's answer", login, i, user.GetLogin())
						case res.Rate.Limit != 5000 || res.Header.Get("Cache-Control") == "":
							errs <- fmt.Errorf("%s: rate %+v, headers %v; want the upstream's headers", login, res.Rate, res.Header)
						default:
							sources <- res.Header.Get(coordd.SourceHeader)
						}
					})
				}
			}
		}
		wg.Wait()
		close(errs)
		close(sources)
		for err := range errs {
			t.Error(err)
		}
		if err := <-joined; err != nil {
			t.Errorf("the callers never all joined a flight: %v", err)
		}
		count := map[string]int{}
		for s := range sources {
			count[s]++
		}
		if count["upstream"] < 2 || count["upstream"]+count["l2"] != callers {
			t.Errorf("sources %v; want upstream for each credential's fetching instance, l2 for the rest", count)
		}
		for _, login := range logins {
			if got := env.api.Requests("/user", login); got != 1 {
				t.Errorf("upstream requests as %s = %d; want 1", login, got)
			}
		}
		if got := env.api.Total(); got != 2 {
			t.Errorf("upstream requests = %d; want 2, one per credential", got)
		}
	})

	t.Run("pagination follows Link", func(t *testing.T) {
		for i := range env.instances {
			gh := githubClient(t, env.httpClient(t, i), base, tokAlice)
			opts := &github.IssueListByRepoOptions{ListOptions: github.ListOptions{PerPage: 30}}
			var numbers []int
			pages := 0
			for {
				issues, res, err := gh.Issues.ListByRepo(ctx, "o", "r", opts)
				if err != nil {
					t.Fatalf("instance %d, page %d: %v", i, opts.ListOptions.Page, err)
				}
				pages++
				for _, is := range issues {
					numbers = append(numbers, is.GetNumber())
				}
				if res.NextPage == 0 {
					break
				}
				opts.ListOptions.Page = res.NextPage
			}
			want := make([]int, 75)
			for n := range want {
				want[n] = n + 1
			}
			if pages != 3 || !slices.Equal(numbers, want) {
				t.Errorf("instance %d: %d pages, issues %v; want 3 pages of issues 1 to 75", i, pages, numbers)
			}
		}
		for _, path := range []string{"/repos/o/r/issues?per_page=30", "/repos/o/r/issues?page=2&per_page=30", "/repos/o/r/issues?page=3&per_page=30"} {
			if got := env.api.Requests(path, "alice"); got != 1 {
				t.Errorf("upstream requests for %s = %d; want 1 (three instances, one fetch)", path, got)
			}
		}
	})

	t.Run("404 is a response", func(t *testing.T) {
		gh := githubClient(t, env.httpClient(t, 0), base, tokBob)
		_, res, err := gh.Users.Get(ctx, "nobody")
		var er *github.ErrorResponse
		if !errors.As(err, &er) || er.Response.StatusCode != 404 || er.Message != "Not Found" || res.StatusCode != 404 {
			t.Errorf("err = %#v; want go-github's *ErrorResponse for a 404 Not Found", err)
		}
		var ue *url.Error
		if errors.As(err, &ue) {
			t.Errorf("err = %v: a transport error; want a response", err)
		}
	})

	t.Run("upstream down is a 503", func(t *testing.T) {
		gh := githubClient(t, env.httpClient(t, 1), env.downURL, tokBob)
		_, res, err := gh.Users.Get(ctx, "")
		var er *github.ErrorResponse
		if !errors.As(err, &er) || res == nil || res.StatusCode != 503 {
			t.Fatalf("err = %v; want go-github's *ErrorResponse for a 503", err)
		}
		if secs, perr := strconv.Atoi(res.Header.Get("Retry-After")); perr != nil || secs < 1 {
			t.Errorf("Retry-After %q; want whole seconds", res.Header.Get("Retry-After"))
		}
		if e := res.Header.Get(coordd.ErrorHeader); !strings.HasPrefix(e, "UNAVAILABLE: ") || !strings.HasPrefix(er.Message, "coordd: UNAVAILABLE: ") {
			t.Errorf("%s %q, message %q; want coordd's UNAVAILABLE", coordd.ErrorHeader, e, er.Message)
		}
	})

	t.Run("POST", func(t *testing.T) {
		before := env.api.Total()
		gh := githubClient(t, env.httpClient(t, 2), base, tokBob)
		_, _, err := gh.Issues.Create(ctx, "o", "r", &github.IssueRequest{Title: github.Ptr("new")})
		if !errors.Is(err, coordd.ErrNotCarried) || !strings.Contains(err.Error(), "only GET and HEAD") {
			t.Errorf("err = %v; want ErrNotCarried saying why", err)
		}
		if got := env.api.Total(); got != before {
			t.Errorf("upstream requests %d → %d; want none", before, got)
		}

		// With a fallback, the POST reaches the API through it, with its
		// credential: the fake API answers 405 to bob.
		fb := &countingRT{next: direct(t)}
		gh = githubClient(t, env.httpClient(t, 2, coordd.WithFallback(fb)), base, tokBob)
		_, res, err := gh.Issues.Create(ctx, "o", "r", &github.IssueRequest{Title: github.Ptr("new")})
		var er *github.ErrorResponse
		if !errors.As(err, &er) || res.StatusCode != 405 || fb.n.Load() != 1 {
			t.Errorf("err = %v, %d fallback requests; want the API's 405 through the fallback", err, fb.n.Load())
		}
		if got := env.api.Requests("/repos/o/r/issues", "bob"); got != 1 {
			t.Errorf("POSTs reaching the API as bob = %d; want 1", got)
		}
	})

	t.Run("outside every upstream", func(t *testing.T) {
		elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintln(w, `{"login": "elsewhere"}`)
		}))
		defer elsewhere.Close()
		gh := githubClient(t, env.httpClient(t, 0), elsewhere.URL+"/", tokBob)
		if _, _, err := gh.Users.Get(ctx, ""); !errors.Is(err, coordd.ErrNotCarried) || !strings.Contains(err.Error(), "outside every configured upstream") {
			t.Errorf("err = %v; want ErrNotCarried for a url outside every upstream", err)
		}
		gh = githubClient(t, env.httpClient(t, 0, coordd.WithFallback(direct(t))), elsewhere.URL+"/", tokBob)
		if user, _, err := gh.Users.Get(ctx, ""); err != nil || user.GetLogin() != "elsewhere" {
			t.Errorf("with a fallback: %v, %v; want the other server's answer", user, err)
		}
	})

	t.Run("HEAD", func(t *testing.T) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodHead, base+"user", nil)
		req.Header.Set("Authorization", "Bearer "+tokAlice)
		req.Header.Set("Accept", "application/vnd.github.v3+json") // go-github's: the variant cached above
		res, err := env.httpClient(t, 1).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil || len(body) != 0 {
			t.Errorf("body %q, %v; want none", body, err)
		}
		if res.StatusCode != 200 || res.ContentLength <= 0 || !strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") ||
			res.Header.Get("Etag") == "" || res.Header.Get(coordd.SourceHeader) == "" {
			t.Errorf("%d, length %d, headers %v; want 200 with the GET's headers", res.StatusCode, res.ContentLength, res.Header)
		}
		if got := env.api.Requests("/user", "alice"); got != 1 {
			t.Errorf("upstream requests as alice = %d; want still 1 (HEAD is served from the cache)", got)
		}
	})
}

// direct is a transport of net/http's own, its idle connections closed
// when the test ends.
func direct(t *testing.T) http.RoundTripper {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// countingRT counts the requests it passes to next.
type countingRT struct {
	next http.RoundTripper
	n    atomic.Int64
}

func (c *countingRT) RoundTrip(req *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(req)
}

// TestGitHubCoorddUnreachable: with no coordd to answer, go-github gets
// the transport's error, as for a network error: a *url.Error wrapping
// ErrUnreachable.
func TestGitHubCoorddUnreachable(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	c := dial(t, addr, coordd.WithRetryPolicy(quickRetries(2)), coordd.WithDialOptions(fastReconnect))
	gh := githubClient(t, &http.Client{Transport: coordd.NewTransport(c)}, "https://api.github.example/", tokAlice)
	_, res, err := gh.Users.Get(context.Background(), "")
	var ue *url.Error
	if !errors.As(err, &ue) || !errors.Is(err, coordd.ErrUnreachable) {
		t.Errorf("err = %v; want a *url.Error wrapping ErrUnreachable", err)
	}
	if res != nil {
		t.Errorf("response %v; want none", res)
	}
}
