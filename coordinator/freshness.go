package coordinator

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// lifetime returns how long a 2xx answer (or a 304 revalidating one) with
// header h, received at now, stays fresh and then usable stale, and whether
// it may be stored at all. The upstream's Cache-Control decides when it
// says: no-store and private are delivered but not stored (coordd is a
// shared cache); s-maxage, else max-age, sets the fresh lifetime within
// [MinTTL, MaxTTL] (no-cache counts as max-age=0). Otherwise the
// upstream's TTL applies.
func (u *Upstream) lifetime(h http.Header, now time.Time) (fresh, stale time.Time, store bool) {
	ttl := u.TTL
	age, ok, noStore := parseCacheControl(h.Values("Cache-Control"))
	if noStore {
		return now, now, false
	}
	if ok {
		ttl = min(max(age, u.Protection.MinTTL), u.Protection.MaxTTL)
	}
	return now.Add(ttl), now.Add(ttl + u.StaleTTL), true
}

// parseCacheControl reads the directives that matter to a shared cache
// from Cache-Control header lines. ok reports whether they set an age.
func parseCacheControl(lines []string) (age time.Duration, ok, noStore bool) {
	shared, noCache := false, false // s-maxage seen: it overrides max-age
	for _, line := range lines {
		for _, dir := range strings.Split(line, ",") {
			name, val, _ := strings.Cut(strings.TrimSpace(dir), "=")
			name = strings.ToLower(strings.TrimSpace(name))
			val = strings.Trim(strings.TrimSpace(val), `"`)
			switch name {
			case "no-store", "private":
				noStore = true
			case "no-cache":
				noCache = true
			case "s-maxage", "max-age":
				secs, err := strconv.ParseInt(val, 10, 64)
				if err != nil || secs < 0 || (shared && name == "max-age") {
					continue
				}
				age, ok = time.Duration(min(secs, int64(1<<33)))*time.Second, true
				shared = shared || name == "s-maxage"
			}
		}
	}
	if noCache {
		age, ok = 0, true
	}
	return age, ok, noStore
}
