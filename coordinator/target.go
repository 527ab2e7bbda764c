package coordinator

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/coordd/coordd/internal/document"
	"github.com/coordd/coordd/internal/upstream"
)

// Input limits, checked before any I/O.
const (
	MaxURLBytes = upstream.MaxURLBytes // longest url accepted
	MaxKeyBytes = 512                  // longest cache key accepted
)

// Target is a validated request: the canonical url, its cache key, the
// upstream it belongs to and the tenant it is cached for. Build one with
// Coordinator.ResolveIn.
type Target struct {
	URL      string // canonical url; empty for an invalidation by key
	Key      string // cache key: the caller's, or URL
	id       string // cache id (see document.ID)
	tenant   string // Scope.Tenant
	upstream *Upstream
	scope    string      // Document.Scope: credential scope and variant
	scoped   bool        // a credential is sent: the copy is this scope's only
	cred     credential  // sent upstream; zero: none
	fwd      http.Header // forwarded headers, normalised; nil: none
	sid      string      // credential scope id ("" none): whose quota the fetch spends
	credKind string      // whose credential: "upstream", "tenant NAME", "caller"
	weight   int         // Scope.Weight
}

// Private reports whether t's document is cached for its credential
// scope only: a credential is sent upstream.
func (t Target) Private() bool { return t.scoped }

// Upstream returns the name of the target's upstream.
func (t Target) Upstream() string { return t.upstream.Name }

// Tenant returns the tenant the target is cached for; "" is the default.
func (t Target) Tenant() string { return t.tenant }

// Resolve is ResolveIn for the zero Scope: the default tenant, every
// upstream.
func (c *Coordinator) Resolve(rawURL, key string) (Target, error) {
	return c.ResolveIn(Scope{}, rawURL, key)
}

// ResolveIn is ResolveRequest for a url and key alone.
func (c *Coordinator) ResolveIn(s Scope, rawURL, key string) (Target, error) {
	return c.ResolveRequest(s, Request{URL: rawURL, Key: key})
}

// ResolveRequest validates r and finds the upstream its url belongs to,
// which s must grant, the credential its fetch sends (r's own, else the
// tenant's for that upstream, else the upstream's) and the headers it
// forwards. It does no I/O. Errors wrap ErrInvalidArgument or ErrForbidden
// (outside every upstream, an upstream s does not grant, or a caller's
// credential that the upstream does not accept); none quotes a credential.
func (c *Coordinator) ResolveRequest(s Scope, r Request) (Target, error) {
	if err := s.validate(); err != nil {
		return Target{}, err
	}
	canon, up, err := c.canonical(r.URL)
	if err != nil {
		return Target{}, err
	}
	if err := checkKey(r.Key); err != nil {
		return Target{}, err
	}
	if up == nil {
		return Target{}, outside(canon)
	}
	if !s.grants(up.Name) {
		return Target{}, notGranted(s, up.Name)
	}
	t := Target{URL: canon, Key: r.Key, tenant: s.Tenant, upstream: up, weight: s.Weight}
	if t.Key == "" {
		t.Key = t.URL
	}
	if err := c.scopeTarget(&t, s, r); err != nil {
		return Target{}, err
	}
	return t, nil
}

// scopeTarget gives t (its url, key and upstream set) the credential,
// forwarded headers and cache id that r asks for in s.
func (c *Coordinator) scopeTarget(t *Target, s Scope, r Request) error {
	up := t.upstream
	if !r.Credential.IsZero() {
		if !up.CallerCredentials {
			return ofKind(fmt.Errorf("%w: upstream %q does not accept caller credentials", ErrForbidden, up.Name), ErrCallerCredentialsRefused)
		}
		if err := upstream.CheckCredential(r.Credential.Reveal()); err != nil {
			return invalid("credential %v", err)
		}
	}
	fwd, err := forwarded(up, r.Header)
	if err != nil {
		return err
	}
	t.cred = credentialFor(s, up, r.Credential)
	t.fwd = fwd
	sid := c.scopeKey.scopeID(up, t.cred)
	t.scoped, t.sid = sid != "", sid
	if t.scoped {
		t.credKind = credentialKind(s, up, r.Credential)
	}
	t.scope = joinScope(sid, c.scopeKey.variantID(fwd))
	t.id = document.ID(s.Tenant, t.scope, up.Name, t.URL, t.Key)
	return nil
}

// docTenant is the tenant a Document of t records: t's for a custom key,
// "" for a url, whose id no tenant owns (see document.ID).
func (t Target) docTenant() string {
	if t.Key != t.URL {
		return t.tenant
	}
	return ""
}

// ResolveInvalidationIn validates what an Invalidate names and returns the
// targets it removes, in s's namespace. It does no I/O; errors wrap
// ErrInvalidArgument or ErrForbidden. A url (with an optional key) names
// one document of the url's upstream, which s must grant. A key alone that
// is an absolute url is resolved as that url, so that it is held to the
// upstreams' allow-list and to s; any other key alone names that custom key
// in every upstream s grants, each its own namespace (ErrForbidden if s
// grants none). r's headers and credential name the variant and credential
// scope removed, as ResolveRequest finds them for a Get.
func (c *Coordinator) ResolveInvalidationIn(s Scope, r Request) ([]Target, error) {
	rawURL, key := r.URL, r.Key
	switch {
	case rawURL != "":
		t, err := c.ResolveRequest(s, r)
		if err != nil {
			return nil, err
		}
		return []Target{t}, nil
	case key == "":
		return nil, invalid("url and key are empty")
	case strings.HasPrefix(strings.ToLower(key), "http://") || strings.HasPrefix(strings.ToLower(key), "https://"):
		t, err := c.ResolveRequest(s, Request{URL: key, Header: r.Header, Credential: r.Credential})
		if err != nil {
			return nil, err
		}
		return []Target{t}, nil
	}
	if err := s.validate(); err != nil {
		return nil, err
	}
	if err := checkKey(key); err != nil {
		return nil, err
	}
	var ts []Target
	for i := range c.cfg.Upstreams {
		up := &c.cfg.Upstreams[i]
		if !s.grants(up.Name) {
			continue
		}
		t := Target{Key: key, tenant: s.Tenant, upstream: up}
		if err := c.scopeTarget(&t, s, r); err != nil {
			if errors.Is(err, ErrForbidden) {
				continue // a caller credential this upstream refuses names nothing in it
			}
			return nil, err
		}
		ts = append(ts, t)
	}
	if len(ts) == 0 {
		return nil, ofKind(fmt.Errorf("%w: tenant %q is granted no upstream", ErrForbidden, s.Tenant), ErrNotGranted)
	}
	return ts, nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}

func checkKey(key string) error { return upstream.CheckText("key", key, MaxKeyBytes) }

// match returns the upstream u belongs to: same scheme and host, and a path
// under the upstream's base path, segment by segment (see within).
func (c *Coordinator) match(u *url.URL) *Upstream {
	for i := range c.cfg.Upstreams {
		up := &c.cfg.Upstreams[i]
		if upstream.Contains(up, u) {
			return up
		}
	}
	return nil
}

// A document is cached, locked and announced under its cache id (see
// document.ID), in its tenant's namespace.

// flightKey identifies t's flight in this instance: one per id and url, so
// that callers of one key with different urls never share a fetch.
func (t Target) flightKey() string { return t.id + "\n" + t.URL }

// serves reports whether d answers for t: the same id and the same url.
func (t Target) serves(d *document.Document) bool {
	return d != nil && d.URL == t.URL && d.ID() == t.id
}
