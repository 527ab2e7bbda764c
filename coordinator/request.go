package coordinator

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/coordd/coordd/internal/secret"
	"github.com/coordd/coordd/internal/upstream"
)

// Request is what a caller asks for: a url, an optional cache key, its
// request headers and its own credential. See ResolveRequest.
type Request struct {
	URL string
	Key string // optional cache key; default: the canonical url
	// Header holds the caller's request headers. Only those its upstream
	// forwards (Upstream.ForwardHeaders) are kept, normalised, sent
	// upstream and made part of the cache id; the rest are dropped.
	Header http.Header
	// Credential is the caller's own credential for the upstream, sent in
	// its CredentialHeader for this call's fetch and never stored. An
	// upstream without CallerCredentials refuses it (ErrForbidden).
	Credential secret.Value
}

// credential is the credential a Target's fetch sends.
type credential struct {
	header string
	value  secret.Value
}

// credentialFor is the credential a call of scope s with the caller's
// own credential own sends to up: own, else the tenant's for up, else
// up's, else none.
func credentialFor(s Scope, up *Upstream, own secret.Value) credential {
	switch {
	case !own.IsZero():
		return credential{up.CredentialHeader(), own}
	case s.Credentials[up.Name] != nil:
		c := s.Credentials[up.Name] // loaded: its Header is set
		return credential{c.Header, c.Value()}
	case up.Credential != nil:
		return credential{up.CredentialHeader(), up.Credential.Value()}
	}
	return credential{}
}

// credentialKind says whose credential credentialFor picks, for a status
// page: "caller", "tenant NAME" or "upstream".
func credentialKind(s Scope, up *Upstream, own secret.Value) string {
	switch {
	case !own.IsZero():
		return "caller"
	case s.Credentials[up.Name] != nil:
		return "tenant " + s.Tenant
	}
	return "upstream"
}

// forwarded keeps the headers of h that up forwards, normalised: values
// trimmed and joined with ", ", and an Accept of "*/*" dropped (RFC 9110
// 12.5.1: no Accept means any), so that clients that differ only in such
// defaults share a document. A forwarded value that is not UTF-8, holds a
// control character or is over 1 KiB is ErrInvalidArgument.
func forwarded(up *Upstream, h http.Header) (http.Header, error) {
	var out http.Header
	for name, vs := range h {
		canon := http.CanonicalHeaderKey(name)
		if !up.Forwards(canon) {
			continue
		}
		parts := make([]string, 0, len(vs))
		for _, s := range vs {
			if s = strings.TrimSpace(s); s != "" {
				parts = append(parts, s)
			}
		}
		val := strings.Join(parts, ", ")
		if err := upstream.CheckHeaderValue(val); err != nil {
			return nil, invalid("header %s %v", canon, err)
		}
		if val == "" || (canon == "Accept" && val == "*/*") {
			continue
		}
		if out == nil {
			out = http.Header{}
		}
		out[canon] = []string{val}
	}
	return out, nil
}

// variantID names the forwarded headers h in a cache id: "v/" and a keyed
// hash of them (keyed as scope ids are: an operator may forward a header
// that carries something secret), "" for none.
func (k scopeKey) variantID(h http.Header) string {
	if h == nil {
		return ""
	}
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	slices.Sort(names)
	m := hmac.New(sha256.New, k)
	for _, name := range names {
		fmt.Fprintf(m, "%s: %s\n", name, h[name][0])
	}
	return "v/" + base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:12])
}

// scopeKey keys the credential scope ids (Config.CredentialScopeKey, or
// one drawn at start in single-node mode).
type scopeKey []byte

func newScopeKey(v secret.Value) scopeKey {
	if !v.IsZero() {
		return scopeKey(v.Reveal())
	}
	k := make([]byte, 32)
	_, _ = rand.Read(k) // never fails (crypto/rand)
	return k
}

// scopeID is the credential scope of cred at up: "s/" and a keyed hash
// (HMAC-SHA256 under the fleet-wide key) of the upstream, the header and
// the value, so that every instance finds the same id and Redis holds
// nothing a token can be found from without the key. "" without a
// credential.
func (k scopeKey) scopeID(up *Upstream, cred credential) string {
	if cred.value.IsZero() {
		return ""
	}
	m := hmac.New(sha256.New, k)
	m.Write([]byte(up.Name))
	m.Write([]byte{0})
	m.Write([]byte(cred.header))
	m.Write([]byte{0})
	m.Write([]byte(cred.value.Reveal()))
	return "s/" + base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:16])
}

// scope joins a credential scope id and a variant id into a Document's
// Scope.
func joinScope(cred, v string) string {
	switch {
	case cred == "":
		return v
	case v == "":
		return cred
	}
	return cred + "/" + v
}

// header is what t's fetch sends besides the upstream's request_headers:
// the forwarded headers and the credential. Built per fetch, so that the
// credential is never held in a plain http.Header longer than that.
func (t Target) header() http.Header {
	if t.fwd == nil && t.cred.value.IsZero() {
		return nil
	}
	h := make(http.Header, len(t.fwd)+1)
	for name, vs := range t.fwd {
		h[name] = vs
	}
	if !t.cred.value.IsZero() {
		h.Set(t.cred.header, t.cred.value.Reveal())
	}
	return h
}
