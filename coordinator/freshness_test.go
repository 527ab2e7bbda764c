package coordinator

import (
	"net/http"
	"testing"
	"time"
)

func TestLifetime(t *testing.T) {
	up := &Upstream{TTL: 10 * time.Minute, StaleTTL: time.Hour}
	up.Protection.MinTTL, up.Protection.MaxTTL = time.Minute, 24*time.Hour
	now := time.Unix(1_800_000_000, 0)
	for _, tc := range []struct {
		cc        []string
		fresh     time.Duration
		wantStore bool
	}{
		{nil, 10 * time.Minute, true},
		{[]string{"public"}, 10 * time.Minute, true},
		{[]string{"max-age=3600"}, time.Hour, true},
		{[]string{"public, max-age=7200, must-revalidate"}, 2 * time.Hour, true},
		{[]string{`max-age="120"`}, 2 * time.Minute, true},
		{[]string{"max-age=5"}, time.Minute, true},            // raised to min_ttl
		{[]string{"max-age=999999999"}, 24 * time.Hour, true}, // lowered to max_ttl
		{[]string{"max-age=600, s-maxage=1200"}, 20 * time.Minute, true},
		{[]string{"s-maxage=1200", "max-age=600"}, 20 * time.Minute, true},
		{[]string{"no-cache, max-age=3600"}, time.Minute, true}, // revalidate: as soon as allowed
		{[]string{"max-age=bogus"}, 10 * time.Minute, true},
		{[]string{"max-age=-1"}, 10 * time.Minute, true},
		{[]string{"no-store"}, 0, false},
		{[]string{"max-age=3600", "No-Store"}, 0, false},
		{[]string{"private, max-age=60"}, 0, false},
	} {
		h := http.Header{}
		for _, v := range tc.cc {
			h.Add("Cache-Control", v)
		}
		fresh, stale, store := up.lifetime(h, now)
		if store != tc.wantStore || fresh.Sub(now) != tc.fresh {
			t.Errorf("Cache-Control %q: fresh %v, store %v; want %v, %v", tc.cc, fresh.Sub(now), store, tc.fresh, tc.wantStore)
			continue
		}
		wantStale := tc.fresh + up.StaleTTL
		if !store {
			wantStale = 0
		}
		if stale.Sub(now) != wantStale {
			t.Errorf("Cache-Control %q: stale until +%v; want +%v", tc.cc, stale.Sub(now), wantStale)
		}
	}
}
