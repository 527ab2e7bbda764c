package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/secret"
	"github.com/coordd/coordd/internal/testing/fakeapi"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/redistest"
	"github.com/coordd/coordd/internal/upstream"
	"github.com/coordd/coordd/server"
)

// Tokens of TestCredentialScopes: tenants' tokens for coordd, and the
// fake API's tokens (the credentials coordd or callers send upstream).
const (
	credTokA = "cred-team-a-token-0123456789"
	credTokB = "cred-team-b-token-0123456789"
	credTokC = "cred-team-c-token-0123456789"
	credTokD = "cred-team-d-token-0123456789"

	apiShared = "api-shared-0123456789" // the upstream's credential: login shared-bot
	apiCarol  = "api-carol-0123456789"  // team-c's own: carol
	apiXavier = "api-xavier-0123456789" // a caller's: xavier
	apiYvonne = "api-yvonne-0123456789" // another caller's: yvonne
)

type credEnv struct {
	api       *fakeapi.API
	instances []*fleettest.Instance
}

// startCredEnv runs n instances sharing one Redis in front of a fake API:
// upstream "gh" sends the shared credential, forwards Accept and accepts
// callers' credentials; upstream "plain" (the same API under /repos/)
// accepts none. team-c binds its own credential for gh.
func startCredEnv(t *testing.T, n int) *credEnv {
	t.Helper()
	api := fakeapi.New(t, fakeapi.Options{Delay: 20 * time.Millisecond, Tokens: map[string]string{
		apiShared: "shared-bot", apiCarol: "carol", apiXavier: "xavier", apiYvonne: "yvonne",
	}})
	t.Setenv("CRED_TEST_SHARED", "Bearer "+apiShared)
	t.Setenv("CRED_TEST_CAROL", "token "+apiCarol)
	carol := &upstream.Credential{ValueEnv: "CRED_TEST_CAROL"}
	if err := carol.Load("tenants[2].credentials.gh", nil); err != nil {
		t.Fatal(err)
	}
	a, err := server.NewAuth([]server.Tenant{
		{Name: "team-a", Tokens: []string{credTokA}, Admin: true},
		{Name: "team-b", Tokens: []string{credTokB}},
		{Name: "team-c", Tokens: []string{credTokC}, Credentials: map[string]*upstream.Credential{"gh": carol}, Admin: true},
		{Name: "team-d", Tokens: []string{credTokD}},
	})
	if err != nil {
		t.Fatal(err)
	}
	rd := redistest.Start(t)
	env := &credEnv{api: api}
	for range n {
		cfg := coordinator.Config{
			CredentialScopeKey: secret.New("scope-key-for-tests-0123456789"),
			Upstreams: []coordinator.Upstream{
				{Name: "gh", BaseURL: api.URL() + "/", Credential: &upstream.Credential{ValueEnv: "CRED_TEST_SHARED"},
					RequestHeaders: map[string]string{"User-Agent": "coordd-test"}, ForwardHeaders: []string{"Accept"}, CallerCredentials: true},
			},
		}
		countPerCall(&cfg)
		env.instances = append(env.instances, fleettest.Start(t, fleettest.Options{
			RedisURL: rd.URL(), Config: cfg, ServerOptions: []server.Option{server.WithAuth(a)}, HTTP: true,
		}))
	}
	return env
}

func (env *credEnv) client(t *testing.T, i int, token string) coorddv1.CoordinatorServiceClient {
	return env.instances[i].Dial(t, grpc.WithPerRPCCredentials(bearer(token)))
}

// viewerOf is the login an answer of the fake API was made for.
func viewerOf(t *testing.T, body []byte) string {
	t.Helper()
	var v struct {
		Viewer string `json:"viewer"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	return v.Viewer
}

func metaHeader(md *coorddv1.Metadata, name string) string {
	for _, h := range md.GetHeaders() {
		if h.GetName() == name {
			return h.GetValue()
		}
	}
	return ""
}

// TestCredentialScopes: callers whose fetches carry the same credential
// (the upstream's, shared by two tenants; a tenant's own; a caller's own)
// make one upstream request together, across three instances, and no
// caller ever gets an answer made for another credential.
func TestCredentialScopes(t *testing.T) {
	env := startCredEnv(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	u := env.api.URL() + "/user"
	type kind struct {
		name, token, credential, want string
	}
	kinds := []kind{
		{"team-a, the upstream's credential", credTokA, "", "shared-bot"},
		{"team-b, the upstream's credential", credTokB, "", "shared-bot"},
		{"team-c, its own credential", credTokC, "", "carol"},
		{"team-d, caller credential x", credTokD, "Bearer " + apiXavier, "xavier"},
		{"team-a, caller credential y", credTokA, "token " + apiYvonne, "yvonne"},
	}
	const perInstance = 10
	var wg sync.WaitGroup
	errs := make(chan error, len(kinds)*perInstance*len(env.instances))
	for _, k := range kinds {
		for i := range env.instances {
			c := env.client(t, i, k.token)
			for range perInstance {
				wg.Add(1)
				go func() {
					defer wg.Done()
					d, err := fleettest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: u, Credential: k.credential,
						Headers: []*coorddv1.Header{{Name: "user-agent", Value: "some-client/1.0"}, {Name: "Accept", Value: "*/*"}}})
					switch {
					case err != nil:
						errs <- fmt.Errorf("%s: %v", k.name, err)
					case d.Meta.GetStatusCode() != 200:
						errs <- fmt.Errorf("%s: status %d", k.name, d.Meta.GetStatusCode())
					case viewerOf(t, d.Body) != k.want:
						errs <- fmt.Errorf("%s: got %s's answer; want %s's", k.name, viewerOf(t, d.Body), k.want)
					case !d.Meta.GetPrivate() || metaHeader(d.Meta, "X-Ratelimit-Remaining") == "" || metaHeader(d.Meta, "Set-Cookie") != "":
						errs <- fmt.Errorf("%s: private %v, headers %v; want private, the rate-limit headers and no Set-Cookie", k.name, d.Meta.GetPrivate(), d.Meta.GetHeaders())
					}
				}()
			}
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for login, want := range map[string]int{"shared-bot": 1, "carol": 1, "xavier": 1, "yvonne": 1} {
		if got := env.api.Requests("/user", login); got != want {
			t.Errorf("upstream requests as %s = %d; want %d", login, got, want)
		}
	}
	if got := env.api.Total(); got != 4 {
		t.Errorf("upstream requests = %d; want 4 (one per credential)", got)
	}
	if h := env.api.LastHeader("/user"); h.Get("User-Agent") != "coordd-test" || h.Get("Accept") != "" {
		t.Errorf("upstream got User-Agent %q, Accept %q; want the configured one and no Accept (*/* is none)", h.Get("User-Agent"), h.Get("Accept"))
	}

	// Invalidate removes only the copy its own credential names: team-a's
	// of the shared copy leaves carol's.
	if _, err := env.client(t, 0, credTokA).Invalidate(ctx, &coorddv1.InvalidateRequest{Url: u}); err != nil {
		t.Fatal(err)
	}
	for i := range env.instances {
		d, err := fleettest.Get(ctx, env.client(t, i, credTokC), &coorddv1.GetOrFetchRequest{Url: u})
		if err != nil || viewerOf(t, d.Body) != "carol" || d.Meta.GetSource() == coorddv1.Source_SOURCE_UPSTREAM {
			t.Fatalf("carol on instance %d after team-a's Invalidate: %v, source %v; want her cached copy", i, err, d.GetMeta().GetSource())
		}
	}
	d, err := fleettest.Get(ctx, env.client(t, 0, credTokB), &coorddv1.GetOrFetchRequest{Url: u})
	if err != nil || viewerOf(t, d.Body) != "shared-bot" || d.Meta.GetSource() != coorddv1.Source_SOURCE_UPSTREAM {
		t.Fatalf("team-b after team-a invalidated the shared copy: %v, source %v; want a new fetch", err, d.GetMeta().GetSource())
	}
	if got := env.api.Requests("/user", "shared-bot"); got != 2 {
		t.Errorf("requests as shared-bot = %d; want 2", got)
	}
}

// TestRequestVariants: a forwarded Accept makes a variant of its own, the
// upstream's headers (Link, rate limits) reach the caller, and a 304
// revalidation keeps them.
func TestRequestVariants(t *testing.T) {
	env := startCredEnv(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	readme := env.api.URL() + "/repos/o/r/readme"
	raw := &coorddv1.GetOrFetchRequest{Url: readme, Headers: []*coorddv1.Header{{Name: "accept", Value: "application/vnd.github.raw"}}}
	js := &coorddv1.GetOrFetchRequest{Url: readme, Headers: []*coorddv1.Header{{Name: "Accept", Value: "application/json"}}}
	for i := range env.instances {
		c := env.client(t, i, credTokB)
		dr, err := fleettest.Get(ctx, c, raw)
		if err != nil || !strings.HasPrefix(string(dr.Body), "# r\n") || dr.Meta.GetContentType() != "text/plain; charset=utf-8" {
			t.Fatalf("instance %d, raw: %v, %q, %q", i, err, dr.GetMeta().GetContentType(), dr.Body)
		}
		dj, err := fleettest.Get(ctx, c, js)
		if err != nil || viewerOf(t, dj.Body) != "shared-bot" {
			t.Fatalf("instance %d, json: %v, %v", i, err, dj)
		}
	}
	if got := env.api.Total(); got != 2 {
		t.Errorf("upstream requests = %d; want 2 (one per Accept)", got)
	}
	// HEAD: the metadata of the cached GET, no body.
	h, err := fleettest.Get(ctx, env.client(t, 1, credTokB), &coorddv1.GetOrFetchRequest{Url: readme, Head: true, Headers: js.Headers})
	if err == nil || h.GetMeta().GetSize() == 0 || h.Chunks != 0 {
		// fleettest.Get checks that the body has the metadata's size: a
		// HEAD's does not.
		t.Fatalf("head: %v, size %d, %d chunks; want the size and no chunk", err, h.GetMeta().GetSize(), h.Chunks)
	}
	if got := env.api.Total(); got != 2 {
		t.Errorf("upstream requests after HEAD = %d; want 2", got)
	}
	issues := env.api.URL() + "/repos/o/r/issues?per_page=30"
	d, err := fleettest.Get(ctx, env.client(t, 0, credTokB), &coorddv1.GetOrFetchRequest{Url: issues})
	if err != nil {
		t.Fatal(err)
	}
	if link := metaHeader(d.Meta, "Link"); !strings.Contains(link, `page=2&per_page=30>; rel="next"`) {
		t.Errorf("Link = %q; want a next page", link)
	}
	if metaHeader(d.Meta, "Cache-Control") != "private, max-age=60, s-maxage=60" || metaHeader(d.Meta, "X-Ratelimit-Resource") != "core" {
		t.Errorf("headers %v: want the upstream's Cache-Control and rate-limit headers", d.Meta.GetHeaders())
	}
}

// TestCredentialRefusals: a caller credential where the upstream takes
// none, or a forwarded header that is not a header value, is refused
// before any upstream request, and the error quotes neither.
func TestCredentialRefusals(t *testing.T) {
	env := startCredEnv(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := env.client(t, 0, credTokB)
	u := env.api.URL() + "/user"
	for name, tc := range map[string]struct {
		req  *coorddv1.GetOrFetchRequest
		want codes.Code
	}{
		"credential with LF": {&coorddv1.GetOrFetchRequest{Url: u, Credential: "Bearer secret-value\r\nX-Evil: 1"}, codes.InvalidArgument},
		"accept with NUL":    {&coorddv1.GetOrFetchRequest{Url: u, Headers: []*coorddv1.Header{{Name: "Accept", Value: "secret-value\x00"}}}, codes.InvalidArgument},
		"accept over 1 KiB":  {&coorddv1.GetOrFetchRequest{Url: u, Headers: []*coorddv1.Header{{Name: "Accept", Value: "secret-value" + strings.Repeat("x", 1100)}}}, codes.InvalidArgument},
		"bad header name":    {&coorddv1.GetOrFetchRequest{Url: u, Headers: []*coorddv1.Header{{Name: "Bad Name", Value: "1"}}}, codes.InvalidArgument},
	} {
		_, err := fleettest.Get(ctx, c, tc.req)
		if status.Code(err) != tc.want || strings.Contains(err.Error(), "secret-value") {
			t.Errorf("%s: %v; want %v without the value", name, err, tc.want)
		}
	}
	if got := env.api.Total(); got != 0 {
		t.Errorf("upstream requests = %d; want 0", got)
	}
}

// TestHTTPDoorCredentials: the HTTP door takes a caller's credential in
// X-Coordd-Credential, passes the upstream's headers on (never
// Set-Cookie) and sends a Cache-Control matching what coordd serves.
func TestHTTPDoorCredentials(t *testing.T) {
	env := startCredEnv(t, 1)
	get := func(cred string) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, env.instances[0].HTTPURL+server.HTTPDocumentsPath+"?url="+env.api.URL()+"/repos/o/r/issues", nil)
		req.Header.Set("Authorization", "Bearer "+credTokD)
		if cred != "" {
			req.Header.Set(server.HTTPCredentialHeader, cred)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	for _, tc := range []struct{ cred, want string }{{"", "shared-bot"}, {"Bearer " + apiXavier, "xavier"}, {"Bearer " + apiXavier, "xavier"}} {
		resp, body := get(tc.cred)
		var items []struct {
			Viewer string `json:"viewer"`
		}
		if err := json.Unmarshal(body, &items); err != nil || len(items) == 0 || items[0].Viewer != tc.want {
			t.Fatalf("credential %q: %d %q; want %s's issues", tc.cred, resp.StatusCode, body, tc.want)
		}
		h := resp.Header
		if cc := h.Get("Cache-Control"); cc != "private, max-age=60" || h.Get("Link") == "" || h.Get("X-Ratelimit-Limit") == "" || h.Get("Set-Cookie") != "" || h.Get("Age") == "" {
			t.Errorf("credential %q: headers %v; want Cache-Control private, max-age=60, Link, X-RateLimit-*, Age and no Set-Cookie", tc.cred, h)
		}
	}
	if got := env.api.Total(); got != 2 {
		t.Errorf("upstream requests = %d; want 2", got)
	}
}
