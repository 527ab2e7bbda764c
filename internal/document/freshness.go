package document

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Freshness is what an upstream's configuration says of its documents'
// lifetimes: the defaults and the bounds put on the upstream's own
// Cache-Control.
type Freshness struct {
	TTL      time.Duration // fresh lifetime without Cache-Control
	StaleTTL time.Duration // how long past the fresh lifetime a copy stays usable stale
	// MinTTL and MaxTTL bound a positive fresh lifetime that Cache-Control
	// sets.
	MinTTL, MaxTTL time.Duration
	// Private says that the copy is cached for one credential scope only
	// (see ID), where an answer marked private (RFC 9111 5.2.2.7) may be
	// stored: the scope is the one user the upstream answered.
	Private bool
}

// Lifetime returns how long a 2xx answer (or a 304 revalidating one) with
// header h, received at now, stays fresh and then usable stale, what may be
// done with it once stale, and whether it may be stored at all. The
// upstream's Cache-Control decides when it says:
//
//   - no-store, and Vary: * (no later request can be known to match):
//     delivered but not stored.
//
//   - private: delivered but not stored, unless the copy is Private to
//     one credential scope.
//
//   - no-cache (unqualified), or a zero s-maxage, else max-age: fresh for
//     0, so revalidated before every use; kept for the stale window only
//     to be revalidated with a conditional request, and served stale only
//     instead of an upstream error (RevalidateBeforeUse).
//
//   - a positive s-maxage, else max-age: the fresh lifetime, within
//     [MinTTL, MaxTTL]. Otherwise the upstream's TTL applies.
//
//   - must-revalidate or proxy-revalidate: never served stale
//     (RevalidateStrictly); still kept for the stale window, to be
//     revalidated with a conditional request.
//
//   - stale-while-revalidate=N, stale-if-error=N (RFC 5861): each ends its
//     own stale-serving window N seconds after the fresh lifetime, within
//     the stale window. Without them, both last the whole stale window.
//
// The stale window is StaleTTL after the fresh lifetime; a copy whose
// window is empty is not stored.
func (u Freshness) Lifetime(h http.Header, now time.Time) (l Lifetime, store bool) {
	cc := parseCacheControl(h.Values("Cache-Control"))
	if cc.noStore || (cc.private && !u.Private) || varyAll(h.Values("Vary")) {
		return Lifetime{Fresh: now, Stale: now}, false
	}
	ttl := u.TTL
	switch {
	case cc.noCache || (cc.hasAge && cc.age == 0):
		ttl, l.Revalidation = 0, RevalidateBeforeUse
	case cc.hasAge:
		ttl = min(max(cc.age, u.MinTTL), u.MaxTTL)
	}
	if cc.mustRevalidate {
		l.Revalidation = RevalidateStrictly
	}
	l.Fresh, l.Stale = now.Add(ttl), now.Add(ttl+u.StaleTTL)
	if cc.hasSWR {
		l.WhileRevalidate = l.Fresh.Add(min(cc.swr, u.StaleTTL))
	}
	if cc.hasSIE {
		l.IfError = l.Fresh.Add(min(cc.sie, u.StaleTTL))
	}
	return l, l.Stale.After(now)
}

// Lifetime is when a copy stops being fresh, usable stale, and served
// stale (see Document).
type Lifetime struct {
	Fresh, Stale             time.Time
	WhileRevalidate, IfError time.Time // zero: until Stale
	Revalidation             Revalidation
}

// Apply gives d the lifetime l.
func (l Lifetime) Apply(d *Document) {
	d.FreshUntil, d.StaleUntil, d.Revalidation = l.Fresh, l.Stale, l.Revalidation
	d.WhileRevalidateUntil, d.IfErrorUntil = l.WhileRevalidate, l.IfError
}

// cacheControl is what a shared cache reads from Cache-Control.
type cacheControl struct {
	age            time.Duration // s-maxage, else max-age, when hasAge
	hasAge         bool
	noStore        bool          // no-store
	private        bool          // private (unqualified or not)
	noCache        bool          // unqualified no-cache
	mustRevalidate bool          // must-revalidate or proxy-revalidate
	swr, sie       time.Duration // stale-while-revalidate, stale-if-error, when hasSWR, hasSIE
	hasSWR, hasSIE bool
}

// parseCacheControl reads the directives that matter to a shared cache
// from Cache-Control header lines.
func parseCacheControl(lines []string) cacheControl {
	var cc cacheControl
	shared := false // s-maxage seen: it overrides max-age
	for _, line := range lines {
		for _, dir := range strings.Split(line, ",") {
			name, val, hasVal := strings.Cut(strings.TrimSpace(dir), "=")
			name = strings.ToLower(strings.TrimSpace(name))
			val = strings.Trim(strings.TrimSpace(val), `"`)
			switch name {
			case "no-store":
				cc.noStore = true
			case "private":
				cc.private = true
			case "no-cache":
				// no-cache="Set-Cookie" only forbids reusing the listed
				// header fields, none of which coordd keeps.
				cc.noCache = cc.noCache || !hasVal || val == ""
			case "must-revalidate", "proxy-revalidate":
				cc.mustRevalidate = true
			case "s-maxage", "max-age":
				secs, ok := seconds(val)
				if !ok || (shared && name == "max-age") {
					continue
				}
				cc.age, cc.hasAge = secs, true
				shared = shared || name == "s-maxage"
			case "stale-while-revalidate":
				if secs, ok := seconds(val); ok {
					cc.swr, cc.hasSWR = secs, true
				}
			case "stale-if-error":
				if secs, ok := seconds(val); ok {
					cc.sie, cc.hasSIE = secs, true
				}
			}
		}
	}
	return cc
}

// seconds parses a delta-seconds value, capped at 2^33 s (about 272
// years) so that it fits a Duration.
func seconds(val string) (time.Duration, bool) {
	secs, err := strconv.ParseInt(val, 10, 64)
	if err != nil || secs < 0 {
		return 0, false
	}
	return time.Duration(min(secs, int64(1<<33))) * time.Second, true
}

// varyAll reports whether Vary lists "*".
func varyAll(lines []string) bool {
	for _, line := range lines {
		for f := range strings.SplitSeq(line, ",") {
			if strings.TrimSpace(f) == "*" {
				return true
			}
		}
	}
	return false
}
