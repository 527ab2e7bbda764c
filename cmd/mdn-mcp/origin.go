package main

import (
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strings"
)

// originRE is an origin as a browser serializes it: scheme://host[:port],
// with no path, query or user information.
var originRE = regexp.MustCompile(`^https?://([a-z0-9.-]+|\[[0-9a-f:.]+\])(:[0-9]{1,5})?$`)

// parseOrigins reads --allowed-origins: a comma-separated list of exact
// origins such as https://app.example or http://localhost:3000. Each is
// lowercased and loses a default port (:80 for http, :443 for https), as a
// browser sends it. An empty list admits no Origin.
func parseOrigins(list string) (map[string]bool, error) {
	allowed := make(map[string]bool)
	for o := range strings.SplitSeq(list, ",") {
		o = strings.ToLower(strings.TrimSpace(o))
		if o == "" {
			continue
		}
		if !originRE.MatchString(o) {
			return nil, fmt.Errorf("--allowed-origins: %q is not an origin: want scheme://host[:port], such as https://app.example, with no path", o)
		}
		if strings.HasPrefix(o, "https:") {
			o = strings.TrimSuffix(o, ":443")
		} else {
			o = strings.TrimSuffix(o, ":80")
		}
		allowed[o] = true
	}
	return allowed, nil
}

// requireOrigin answers 403 to a request whose Origin header is present and
// neither one of allowed (exact match) nor the server's own loopback origin
// (sameLoopbackOrigin), and passes the rest on: a request with no Origin
// comes from no browser, and DNS rebinding needs a browser. An empty
// Origin and "null" (sandboxed frames, file: pages) are refused.
//
// Hand-rolled rather than http.CrossOriginProtection (which the go-sdk's
// StreamableHTTPOptions also takes): that admits any Origin whose host
// equals the Host header, and any request with Sec-Fetch-Site: same-origin,
// which is exactly what a DNS-rebinding page sends, and it exempts GET.
func requireOrigin(allowed map[string]bool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if origins := r.Header.Values("Origin"); len(origins) > 0 && (len(origins) > 1 || !allowed[origins[0]] && !sameLoopbackOrigin(origins[0], r.Host)) {
			http.Error(w, "mdn-mcp: Origin not allowed (see --allowed-origins)", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// sameLoopbackOrigin reports whether origin is http://HOST for the request's
// Host header, and that names a loopback address (localhost, 127.0.0.0/8,
// [::1]): a page the server itself would have served, as the MCP
// conformance suite's DNS-rebinding scenario expects to be admitted. A
// rebinding page cannot send it: its Host and Origin carry the attacker's
// name, never a loopback one.
func sameLoopbackOrigin(origin, host string) bool {
	if origin != "http://"+host {
		return false
	}
	name, _, err := net.SplitHostPort(host)
	if err != nil {
		name = strings.Trim(host, "[]")
	}
	ip := net.ParseIP(name)
	return name == "localhost" || ip != nil && ip.IsLoopback()
}
