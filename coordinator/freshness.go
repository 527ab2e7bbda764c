package coordinator

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// lifetime returns how long a 2xx answer (or a 304 revalidating one) with
// header h, received at now, stays fresh and then usable stale, what may be
// done with it once stale, and whether it may be stored at all. The
// upstream's Cache-Control decides when it says:
//
//   - no-store and private: delivered but not stored (coordd is a shared
//     cache).
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
func (u *Upstream) lifetime(h http.Header, now time.Time) (l lifetime, store bool) {
	cc := parseCacheControl(h.Values("Cache-Control"))
	if cc.noStore {
		return lifetime{fresh: now, stale: now}, false
	}
	ttl := u.TTL
	switch {
	case cc.noCache || (cc.hasAge && cc.age == 0):
		ttl, l.rv = 0, RevalidateBeforeUse
	case cc.hasAge:
		ttl = min(max(cc.age, u.Protection.MinTTL), u.Protection.MaxTTL)
	}
	if cc.mustRevalidate {
		l.rv = RevalidateStrictly
	}
	l.fresh, l.stale = now.Add(ttl), now.Add(ttl+u.StaleTTL)
	if cc.hasSWR {
		l.whileRevalidate = l.fresh.Add(min(cc.swr, u.StaleTTL))
	}
	if cc.hasSIE {
		l.ifError = l.fresh.Add(min(cc.sie, u.StaleTTL))
	}
	return l, l.stale.After(now)
}

// lifetime is when a copy stops being fresh, usable stale, and served
// stale (see Document).
type lifetime struct {
	fresh, stale             time.Time
	whileRevalidate, ifError time.Time // zero: until stale
	rv                       Revalidation
}

// set gives d the lifetime l.
func (l lifetime) set(d *Document) {
	d.FreshUntil, d.StaleUntil, d.Revalidation = l.fresh, l.stale, l.rv
	d.WhileRevalidateUntil, d.IfErrorUntil = l.whileRevalidate, l.ifError
}

// cacheControl is what a shared cache reads from Cache-Control.
type cacheControl struct {
	age            time.Duration // s-maxage, else max-age, when hasAge
	hasAge         bool
	noStore        bool          // no-store or private
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
			case "no-store", "private":
				cc.noStore = true
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
