package upstream

import (
	"fmt"
	"net"
	"net/url"
	"path"
	"strings"
	"unicode/utf8"
)

// MaxURLBytes is the longest url CanonicalURL accepts.
const MaxURLBytes = 2048

// CanonicalURL validates raw and returns its canonical form: lower-case
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
func CanonicalURL(raw string) (*url.URL, error) {
	if raw == "" {
		return nil, invalid("url is empty")
	}
	if err := CheckText("url", raw, MaxURLBytes); err != nil {
		return nil, err
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

// checkPath refuses the path tricks CanonicalURL documents, in u as parsed.
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

// Contains reports whether the canonical u is inside up (a function, as
// SetDefaults): same scheme and
// host, and a path under the base path, segment by segment. A base path
// ending in "/" (https://h/docs/) admits that directory and what is under
// it (/docs/, /docs/x), not /docs; one without (https://h/docs) admits
// /docs itself too. /docsevil is never under /docs.
func Contains(up *Config, u *url.URL) bool {
	b := up.base
	if u.Scheme != b.Scheme || u.Host != b.Host {
		return false
	}
	if strings.HasSuffix(b.Path, "/") {
		return strings.HasPrefix(u.Path, b.Path)
	}
	return u.Path == b.Path || strings.HasPrefix(u.Path, b.Path+"/")
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}

// CheckText refuses s, a caller's what ("url", "key"), when it is longer
// than limit bytes, holds control characters or is not UTF-8: the checks
// every caller-given string passes before any I/O.
func CheckText(what, s string, limit int) error {
	switch {
	case len(s) > limit:
		return invalid("%s is %d bytes; the limit is %d", what, len(s), limit)
	case hasControl(s):
		return invalid("%s contains control characters", what)
	case !utf8.ValidString(s):
		return invalid("%s is not valid UTF-8", what)
	}
	return nil
}

func hasControl(s string) bool {
	for i := 0; i < len(s); i++ {
		if b := s[i]; b < 0x20 || b == 0x7f {
			return true
		}
	}
	return false
}
