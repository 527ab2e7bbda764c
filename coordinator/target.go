package coordinator

import (
	"fmt"
	"net"
	"net/url"
	"path"
	"strings"
	"unicode/utf8"
)

// Input limits, checked before any I/O.
const (
	MaxURLBytes = 2048 // longest url accepted
	MaxKeyBytes = 512  // longest cache key accepted
)

// Target is a validated request: the canonical url, its cache key, the
// upstream it belongs to and the tenant it is cached for. Build one with
// Coordinator.ResolveIn.
type Target struct {
	URL      string // canonical url; empty for an invalidation by key
	Key      string // cache key: the caller's, or URL
	id       string // cache id (see cacheID and scopedID)
	tenant   string // Scope.Tenant
	upstream *Upstream
}

// Upstream returns the name of the target's upstream.
func (t Target) Upstream() string { return t.upstream.Name }

// Tenant returns the tenant the target is cached for; "" is the default.
func (t Target) Tenant() string { return t.tenant }

// Resolve is ResolveIn for the zero Scope: the default tenant, every
// upstream.
func (c *Coordinator) Resolve(rawURL, key string) (Target, error) {
	return c.ResolveIn(Scope{}, rawURL, key)
}

// ResolveIn validates rawURL and key and finds the upstream rawURL belongs
// to, which s must grant. It does no I/O. Errors wrap ErrInvalidArgument or
// ErrForbidden (outside every upstream, or an upstream s does not grant).
func (c *Coordinator) ResolveIn(s Scope, rawURL, key string) (Target, error) {
	if err := s.validate(); err != nil {
		return Target{}, err
	}
	u, err := canonicalURL(rawURL)
	if err != nil {
		return Target{}, err
	}
	if err := checkKey(key); err != nil {
		return Target{}, err
	}
	up := c.match(u)
	if up == nil {
		return Target{}, fmt.Errorf("%w: url %s is outside every configured upstream", ErrForbidden, u.Redacted())
	}
	if !s.grants(up.Name) {
		return Target{}, notGranted(s, up.Name)
	}
	t := Target{URL: u.String(), Key: key, tenant: s.Tenant, upstream: up}
	if t.Key == "" {
		t.Key = t.URL
	}
	t.id = scopedID(s.Tenant, cacheID(up.Name, t.URL, t.Key))
	return t, nil
}

// ResolveInvalidation is ResolveInvalidationIn for the zero Scope.
func (c *Coordinator) ResolveInvalidation(rawURL, key string) ([]Target, error) {
	return c.ResolveInvalidationIn(Scope{}, rawURL, key)
}

// ResolveInvalidationIn validates what an Invalidate names and returns the
// targets it removes, in s's namespace. It does no I/O; errors wrap
// ErrInvalidArgument or ErrForbidden. A url (with an optional key) names
// one document of the url's upstream, which s must grant. A key alone that
// is an absolute url is resolved as that url, so that it is held to the
// upstreams' allow-list and to s; any other key alone names that custom key
// in every upstream s grants, each its own namespace (ErrForbidden if s
// grants none).
func (c *Coordinator) ResolveInvalidationIn(s Scope, rawURL, key string) ([]Target, error) {
	switch {
	case rawURL != "":
		t, err := c.ResolveIn(s, rawURL, key)
		if err != nil {
			return nil, err
		}
		return []Target{t}, nil
	case key == "":
		return nil, invalid("url and key are empty")
	case strings.HasPrefix(strings.ToLower(key), "http://") || strings.HasPrefix(strings.ToLower(key), "https://"):
		t, err := c.ResolveIn(s, key, "")
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
		if s.grants(up.Name) {
			ts = append(ts, Target{Key: key, id: scopedID(s.Tenant, cacheID(up.Name, "", key)), tenant: s.Tenant, upstream: up})
		}
	}
	if len(ts) == 0 {
		return nil, fmt.Errorf("%w: tenant %q is granted no upstream", ErrForbidden, s.Tenant)
	}
	return ts, nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}

func hasControl(s string) bool {
	for i := 0; i < len(s); i++ {
		if b := s[i]; b < 0x20 || b == 0x7f {
			return true
		}
	}
	return false
}

func checkKey(key string) error {
	switch {
	case len(key) > MaxKeyBytes:
		return invalid("key is %d bytes; the limit is %d", len(key), MaxKeyBytes)
	case hasControl(key):
		return invalid("key contains control characters")
	case !utf8.ValidString(key):
		return invalid("key is not valid UTF-8")
	}
	return nil
}

// canonicalURL validates raw and returns its canonical form: lower-case
// scheme and host, no default port, dot segments resolved, no fragment,
// query parameters sorted. The canonical form is what coordd sends
// upstream, byte for byte, and what the upstream's base path is checked
// against.
//
// It refuses paths that servers are known to read differently from
// path.Clean, so that the path checked is the path served: backslashes,
// raw or escaped (some servers take them for /); escaped /, . and %
// (%2F, %2E, %25, in any case: a server that decodes them after resolving
// dot segments, or decodes twice, would climb out of the base path); ".;"
// and "..;" segments, and any "." or ".." segment carrying ";parameters"
// (Tomcat and others drop the parameters and then resolve the dot
// segment); and control characters, even escaped.
func canonicalURL(raw string) (*url.URL, error) {
	switch {
	case raw == "":
		return nil, invalid("url is empty")
	case len(raw) > MaxURLBytes:
		return nil, invalid("url is %d bytes; the limit is %d", len(raw), MaxURLBytes)
	case hasControl(raw):
		return nil, invalid("url contains control characters")
	case !utf8.ValidString(raw):
		return nil, invalid("url is not valid UTF-8")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, invalid("url does not parse: %v", err.(*url.Error).Err)
	}
	if !u.IsAbs() || u.Host == "" || u.Opaque != "" {
		return nil, invalid("url %q is not absolute", raw)
	}
	u.Scheme = strings.ToLower(u.Scheme)
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, invalid("url scheme %q is not http or https", u.Scheme)
	}
	if u.User != nil {
		return nil, invalid("url must not contain userinfo")
	}
	if u.Port() != "" {
		if _, err := net.LookupPort("tcp", u.Port()); err != nil {
			return nil, invalid("url port %q is not a port", u.Port())
		}
	}
	u.Host = canonicalHost(u.Scheme, u.Host)
	u.Fragment, u.RawFragment = "", ""
	if err := checkPath(u); err != nil {
		return nil, err
	}
	p := u.Path
	if p == "" {
		p = "/"
	}
	clean := path.Clean(p)
	if strings.HasSuffix(p, "/") && clean != "/" {
		clean += "/"
	}
	u.Path, u.RawPath = clean, ""
	if u.RawQuery != "" {
		q, err := url.ParseQuery(u.RawQuery)
		if err != nil {
			return nil, invalid("url query does not parse: %v", err)
		}
		u.RawQuery = q.Encode()
	}
	u.ForceQuery = false
	return u, nil
}

// escapedPathTricks are the escapes refused in a url's path, upper case.
var escapedPathTricks = []string{"%2F", "%2E", "%25", "%5C"}

// checkPath refuses the path tricks canonicalURL documents, in u as parsed.
func checkPath(u *url.URL) error {
	// RawPath holds the path as written whenever it differs from the
	// default encoding of Path; otherwise that encoding is what was written.
	raw := u.RawPath
	if raw == "" {
		raw = u.EscapedPath()
	}
	up := strings.ToUpper(raw)
	for _, e := range escapedPathTricks {
		if strings.Contains(up, e) {
			return invalid("url path must not contain the escape %s (escaped /, ., %% or \\)", e)
		}
	}
	switch {
	case strings.Contains(u.Path, `\`):
		return invalid("url path must not contain a backslash")
	case hasControl(u.Path):
		return invalid("url path contains control characters, escaped")
	}
	for seg := range strings.SplitSeq(u.Path, "/") {
		if name, _, params := strings.Cut(seg, ";"); params && (name == "." || name == "..") {
			return invalid("url path must not contain a %q segment", seg)
		}
	}
	return nil
}

func canonicalHost(scheme, host string) string {
	host = strings.ToLower(host)
	if h, p, err := net.SplitHostPort(host); err == nil {
		if (scheme == "http" && p == "80") || (scheme == "https" && p == "443") {
			if strings.Contains(h, ":") {
				return "[" + h + "]"
			}
			return h
		}
	}
	return host
}

// match returns the upstream u belongs to: same scheme and host, and a path
// under the upstream's base path, segment by segment (see within).
func (c *Coordinator) match(u *url.URL) *Upstream {
	for i := range c.cfg.Upstreams {
		up := &c.cfg.Upstreams[i]
		if within(up, u) {
			return up
		}
	}
	return nil
}

// within reports whether the canonical u is inside up: same scheme and
// host, and a path under the base path, segment by segment. A base path
// ending in "/" (https://h/docs/) admits that directory and what is under
// it (/docs/, /docs/x), not /docs; one without (https://h/docs) admits
// /docs itself too. /docsevil is never under /docs.
func within(up *Upstream, u *url.URL) bool {
	b := up.base
	if u.Scheme != b.Scheme || u.Host != b.Host {
		return false
	}
	if strings.HasSuffix(b.Path, "/") {
		return strings.HasPrefix(u.Path, b.Path)
	}
	return u.Path == b.Path || strings.HasPrefix(u.Path, b.Path+"/")
}
