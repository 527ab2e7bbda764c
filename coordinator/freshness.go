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
//   - no-cache (unqualified), or a zero s-maxage, else max-age: fresh for
//     0, so revalidated before every use; kept for the stale window only
//     to be revalidated with a conditional request, and served stale only
//     instead of an upstream error (RevalidateBeforeUse).
//   - a positive s-maxage, else max-age: the fresh lifetime, within
//     [MinTTL, MaxTTL]. Otherwise the upstream's TTL applies.
//   - must-revalidate or proxy-revalidate: never served stale
//     (RevalidateStrictly); still kept for the stale window, to be
//     revalidated with a conditional request.
//
// The stale window is StaleTTL after the fresh lifetime; a copy whose
// window is empty is not stored.
func (u *Upstream) lifetime(h http.Header, now time.Time) (fresh, stale time.Time, rv Revalidation, store bool) {
	cc := parseCacheControl(h.Values("Cache-Control"))
	if cc.noStore {
		return now, now, RevalidateInBackground, false
	}
	ttl := u.TTL
	switch {
	case cc.noCache || (cc.hasAge && cc.age == 0):
		ttl, rv = 0, RevalidateBeforeUse
	case cc.hasAge:
		ttl = min(max(cc.age, u.Protection.MinTTL), u.Protection.MaxTTL)
	}
	if cc.mustRevalidate {
		rv = RevalidateStrictly
	}
	fresh, stale = now.Add(ttl), now.Add(ttl+u.StaleTTL)
	return fresh, stale, rv, stale.After(now)
}

// cacheControl is what a shared cache reads from Cache-Control.
type cacheControl struct {
	age            time.Duration // s-maxage, else max-age, when hasAge
	hasAge         bool
	noStore        bool // no-store or private
	noCache        bool // unqualified no-cache
	mustRevalidate bool // must-revalidate or proxy-revalidate
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
				secs, err := strconv.ParseInt(val, 10, 64)
				if err != nil || secs < 0 || (shared && name == "max-age") {
					continue
				}
				cc.age, cc.hasAge = time.Duration(min(secs, int64(1<<33)))*time.Second, true
				shared = shared || name == "s-maxage"
			}
		}
	}
	return cc
}
