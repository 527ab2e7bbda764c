package coordinator

import (
	"errors"
	"slices"
	"testing"
)

func TestResolveIn(t *testing.T) {
	c := newTestCoordinator(t, Config{Upstreams: []Upstream{
		{Name: "mdn", BaseURL: "https://developer.mozilla.org"},
		{Name: "local", BaseURL: "http://127.0.0.1:8080/docs/"},
	}})
	const mdnURL = "https://developer.mozilla.org/a"
	tests := []struct {
		name   string
		scope  Scope
		url    string
		key    string
		want   error
		wantID string
	}{
		{name: "default tenant keeps today's ids", url: mdnURL, wantID: mdnURL},
		{name: "default tenant custom key", url: mdnURL, key: "k", wantID: "key/mdn/k"},
		{name: "tenants share a url's id", scope: Scope{Tenant: "team-a"}, url: mdnURL, wantID: mdnURL},
		{name: "tenant custom key", scope: Scope{Tenant: "team-a"}, url: mdnURL, key: "k", wantID: "t/team-a/key/mdn/k"},
		{name: "granted", scope: Scope{Tenant: "b", Upstreams: []string{"mdn"}}, url: mdnURL, wantID: mdnURL},
		{name: "not granted", scope: Scope{Tenant: "b", Upstreams: []string{"local"}}, url: mdnURL, want: ErrForbidden},
		{name: "granted none", scope: Scope{Tenant: "b", Upstreams: []string{}}, url: mdnURL, want: ErrForbidden},
		{name: "outside every upstream", scope: Scope{Tenant: "b"}, url: "https://evil.example/", want: ErrForbidden},
		{name: "tenant with slash", scope: Scope{Tenant: "a/key"}, url: mdnURL, want: ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := c.ResolveIn(tt.scope, tt.url, tt.key)
			if tt.want != nil {
				if !errors.Is(err, tt.want) {
					t.Fatalf("ResolveIn(%+v, %q, %q) error = %v; want %v", tt.scope, tt.url, tt.key, err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatalf("ResolveIn: %v", err)
			}
			if got.id != tt.wantID || got.Tenant() != tt.scope.Tenant {
				t.Errorf("id, tenant = %q, %q; want %q, %q", got.id, got.Tenant(), tt.wantID, tt.scope.Tenant)
			}
		})
	}
}

// TestScopeServes: a document filled for one tenant's custom key never
// answers for another tenant's target of the same url and key; a url's
// document, the upstream's answer to it, answers every tenant.
func TestScopeServes(t *testing.T) {
	c := newTestCoordinator(t, Config{Upstreams: []Upstream{{Name: "mdn", BaseURL: "https://developer.mozilla.org"}}})
	const u = "https://developer.mozilla.org/a"
	a, _ := c.ResolveIn(Scope{Tenant: "a"}, u, "")
	b, _ := c.ResolveIn(Scope{Tenant: "b"}, u, "")
	if d := (&Document{Key: a.Key, URL: a.URL, Upstream: "mdn", Tenant: a.docTenant()}); !b.serves(d) || a.flightKey() != b.flightKey() {
		t.Errorf("tenant a's document of a url does not serve tenant b, or their flights differ")
	}
	for _, key := range []string{"k"} {
		a, _ := c.ResolveIn(Scope{Tenant: "a"}, u, key)
		b, _ := c.ResolveIn(Scope{Tenant: "b"}, u, key)
		def, _ := c.ResolveIn(Scope{}, u, key)
		d := &Document{Key: a.Key, URL: a.URL, Upstream: "mdn", Tenant: "a"}
		if !a.serves(d) {
			t.Errorf("key %q: tenant a's document does not serve tenant a", key)
		}
		if b.serves(d) || def.serves(d) {
			t.Errorf("key %q: tenant a's document serves tenant b (%v) or the default tenant (%v); want neither", key, b.serves(d), def.serves(d))
		}
		if a.id == b.id || a.id == def.id || a.flightKey() == b.flightKey() {
			t.Errorf("key %q: ids %q, %q, %q; want three distinct", key, a.id, b.id, def.id)
		}
	}
}

func TestResolveInvalidationIn(t *testing.T) {
	c := newTestCoordinator(t, Config{Upstreams: []Upstream{
		{Name: "mdn", BaseURL: "https://developer.mozilla.org"},
		{Name: "local", BaseURL: "http://127.0.0.1:8080/docs/"},
	}})
	tests := []struct {
		name     string
		scope    Scope
		url, key string
		want     error
		wantIDs  []string
	}{
		{name: "key in every upstream", scope: Scope{Tenant: "a"}, key: "k", wantIDs: []string{"t/a/key/mdn/k", "t/a/key/local/k"}},
		{name: "key in granted upstreams only", scope: Scope{Tenant: "a", Upstreams: []string{"local"}}, key: "k", wantIDs: []string{"t/a/key/local/k"}},
		{name: "key with no upstream granted", scope: Scope{Tenant: "a", Upstreams: []string{}}, key: "k", want: ErrForbidden},
		{name: "url not granted", scope: Scope{Tenant: "a", Upstreams: []string{"local"}}, url: "https://developer.mozilla.org/a", want: ErrForbidden},
		{name: "url-shaped key not granted", scope: Scope{Tenant: "a", Upstreams: []string{"local"}}, key: "https://developer.mozilla.org/a", want: ErrForbidden},
		{name: "url granted", scope: Scope{Tenant: "a", Upstreams: []string{"mdn"}}, url: "https://developer.mozilla.org/a", wantIDs: []string{"https://developer.mozilla.org/a"}},
		{name: "default tenant", key: "k", wantIDs: []string{"key/mdn/k", "key/local/k"}},
		{name: "bad tenant", scope: Scope{Tenant: "../x"}, key: "k", want: ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts, err := c.ResolveInvalidationIn(tt.scope, Request{URL: tt.url, Key: tt.key})
			if tt.want != nil {
				if !errors.Is(err, tt.want) {
					t.Fatalf("error = %v; want %v", err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, tg := range ts {
				ids = append(ids, tg.id)
			}
			if !slices.Equal(ids, tt.wantIDs) {
				t.Errorf("ids = %q; want %q", ids, tt.wantIDs)
			}
		})
	}
}
