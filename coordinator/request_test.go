package coordinator

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/coordd/coordd/internal/secret"
	"github.com/coordd/coordd/internal/upstream"
)

// TestResolveRequestScopes: callers with the same credential (the
// upstream's, a tenant's or their own) and the same forwarded headers
// share a cache id, across tenants; any other credential or variant gets
// an id of its own; no id, nor any error, holds a credential.
func TestResolveRequestScopes(t *testing.T) {
	const (
		upCanary     = "Bearer up-canary-0123456789abcdef"
		tenantCanary = "Bearer tenant-canary-0123456789abcdef"
		callerX      = "Bearer caller-x-0123456789abcdef"
		callerY      = "Bearer caller-y-0123456789abcdef"
	)
	t.Setenv("GH_TOKEN_TEST", upCanary)
	t.Setenv("TENANT_TOKEN_TEST", tenantCanary)
	tenantCred := &upstream.Credential{ValueEnv: "TENANT_TOKEN_TEST"}
	if err := tenantCred.Load("tenants[0].credentials.gh", nil); err != nil {
		t.Fatal(err)
	}
	c := newTestCoordinator(t, Config{
		CredentialScopeKey: secret.New("fleet-key-0123456789abcdef"),
		Upstreams: []Upstream{
			{Name: "gh", BaseURL: "https://api.github.test/", Credential: &upstream.Credential{ValueEnv: "GH_TOKEN_TEST"},
				ForwardHeaders: []string{"accept", "X-GitHub-Api-Version"}, CallerCredentials: true},
			{Name: "open", BaseURL: "https://open.test/"},
		},
	})
	const u = "https://api.github.test/user"
	resolve := func(s Scope, r Request) Target {
		t.Helper()
		r.URL = u
		tg, err := c.ResolveRequest(s, r)
		if err != nil {
			t.Fatalf("ResolveRequest(%v, %+v): %v", s, r, err)
		}
		return tg
	}
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Add(kv[i], kv[i+1])
		}
		return h
	}
	base := resolve(Scope{}, Request{})
	withTenant := Scope{Tenant: "b", Credentials: map[string]*upstream.Credential{"gh": tenantCred}}
	same := map[string]Target{
		"another tenant, the upstream's credential": resolve(Scope{Tenant: "a"}, Request{}),
		"non-forwarded headers dropped":             resolve(Scope{}, Request{Header: hdr("User-Agent", "x", "Accept-Encoding", "br", "X-Other", "1")}),
		"Accept */* is no Accept":                   resolve(Scope{}, Request{Header: hdr("Accept", " */* ")}),
	}
	for name, tg := range same {
		if tg.id != base.id || tg.flightKey() != base.flightKey() {
			t.Errorf("%s: id %q; want %q", name, tg.id, base.id)
		}
	}
	distinct := map[string]Target{
		"the upstream's credential": base,
		"tenant's own credential":   resolve(withTenant, Request{}),
		"caller credential x":       resolve(Scope{}, Request{Credential: secret.New(callerX)}),
		"caller credential y":       resolve(Scope{}, Request{Credential: secret.New(callerY)}),
		"accept json":               resolve(Scope{}, Request{Header: hdr("Accept", "application/json")}),
		"accept raw":                resolve(Scope{}, Request{Header: hdr("accept", "application/vnd.github.raw")}),
		"api version":               resolve(Scope{}, Request{Header: hdr("X-Github-Api-Version", "2022-11-28")}),
	}
	seen := map[string]string{}
	for name, tg := range distinct {
		if other, ok := seen[tg.id]; ok {
			t.Errorf("%s and %s share id %q", name, other, tg.id)
		}
		seen[tg.id] = name
		for _, canary := range []string{upCanary, tenantCanary, callerX, callerY, "canary", "caller-"} {
			if strings.Contains(tg.id, canary) {
				t.Errorf("%s: id %q holds a credential", name, tg.id)
			}
		}
		if !tg.Private() || !strings.HasPrefix(tg.id, "s/") {
			t.Errorf("%s: id %q, private %v; want a credential scope", name, tg.id, tg.Private())
		}
	}
	if x2 := resolve(Scope{Tenant: "c"}, Request{Credential: secret.New(callerX)}); x2.id != distinct["caller credential x"].id {
		t.Errorf("the same caller credential in another tenant: id %q; want %q", x2.id, distinct["caller credential x"].id)
	}
	// What each fetch sends.
	for name, tc := range map[string]struct {
		tg   Target
		want string
	}{
		"upstream's": {base, upCanary}, "tenant's": {distinct["tenant's own credential"], tenantCanary},
		"caller's": {distinct["caller credential x"], callerX},
	} {
		if got := tc.tg.header().Get("Authorization"); got != tc.want {
			t.Errorf("%s credential: fetch sends Authorization %q; want %q", name, got, tc.want)
		}
	}
	if got := distinct["accept raw"].header().Get("Accept"); got != "application/vnd.github.raw" {
		t.Errorf("forwarded Accept = %q", got)
	}
	// Refusals, before any I/O, never quoting a credential or header value.
	for name, tc := range map[string]struct {
		r    Request
		want error
	}{
		"caller credential, upstream refuses": {Request{URL: "https://open.test/a", Credential: secret.New(callerX)}, ErrForbidden},
		"credential with LF":                  {Request{URL: u, Credential: secret.New("Bearer a\nX-Evil: 1")}, ErrInvalidArgument},
		"forwarded value with NUL":            {Request{URL: u, Header: hdr("Accept", "a\x00secret-value")}, ErrInvalidArgument},
		"forwarded value not UTF-8":           {Request{URL: u, Header: hdr("Accept", "secret-value\xff")}, ErrInvalidArgument},
		"forwarded value over 1 KiB":          {Request{URL: u, Header: hdr("Accept", "secret-value"+strings.Repeat("a", 1100))}, ErrInvalidArgument},
	} {
		_, err := c.ResolveRequest(Scope{}, tc.r)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: error %v; want %v", name, err, tc.want)
			continue
		}
		if msg := err.Error(); strings.Contains(msg, "caller-x") || strings.Contains(msg, "secret-value") || strings.Contains(msg, "X-Evil") {
			t.Errorf("%s: error %q quotes the value", name, msg)
		}
	}
	// A non-forwarded header is dropped whatever it holds.
	if _, err := c.ResolveRequest(Scope{}, Request{URL: u, Header: hdr("X-Other", "a\x00b")}); err != nil {
		t.Errorf("a bad non-forwarded header: %v; want it dropped", err)
	}
	// Invalidate names the same scope as the Get.
	ts, err := c.ResolveInvalidationIn(Scope{}, Request{URL: u, Credential: secret.New(callerX)})
	if err != nil || len(ts) != 1 || ts[0].id != distinct["caller credential x"].id {
		t.Errorf("ResolveInvalidationIn with caller credential x = %v, %v; want id %q", ts, err, distinct["caller credential x"].id)
	}
}

// TestScopeKeyRequiredWithRedis: with Redis, a credential needs the
// fleet-wide key: instances drawing their own would never share a copy.
func TestNeedsScopeKey(t *testing.T) {
	cfg := Config{Upstreams: []Upstream{{Name: "gh", BaseURL: "https://api.github.test/", CallerCredentials: true}}}
	if !cfg.NeedsScopeKey() {
		t.Error("caller_credentials: NeedsScopeKey = false")
	}
	if (&Config{Upstreams: []Upstream{{Name: "x", BaseURL: "https://x.test/"}}}).NeedsScopeKey() {
		t.Error("no credential: NeedsScopeKey = true")
	}
	short := Config{CredentialScopeKey: secret.New("short")}
	short.setDefaults()
	if err := short.validate(); err == nil || strings.Contains(err.Error(), "short\"") {
		t.Errorf("a 5-byte key: %v; want refused without quoting it", err)
	}
}
