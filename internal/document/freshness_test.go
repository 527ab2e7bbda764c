package document

import (
	"net/http"
	"testing"
	"time"
)

func TestLifetime(t *testing.T) {
	up := &Freshness{TTL: 10 * time.Minute, StaleTTL: time.Hour}
	up.MinTTL, up.MaxTTL = time.Minute, 24*time.Hour
	noStaleWindow := *up
	noStaleWindow.StaleTTL = 0
	now := time.Unix(1_800_000_000, 0)
	const (
		background = RevalidateInBackground
		beforeUse  = RevalidateBeforeUse
		strictly   = RevalidateStrictly
	)
	for _, tc := range []struct {
		cc        []string
		up        *Freshness // default: up
		fresh     time.Duration
		wantRV    Revalidation
		wantStore bool
	}{
		{nil, nil, 10 * time.Minute, background, true},
		{[]string{"public"}, nil, 10 * time.Minute, background, true},
		{[]string{"max-age=3600"}, nil, time.Hour, background, true},
		{[]string{`max-age="120"`}, nil, 2 * time.Minute, background, true},
		{[]string{"max-age=5"}, nil, time.Minute, background, true},            // raised to min_ttl
		{[]string{"max-age=999999999"}, nil, 24 * time.Hour, background, true}, // lowered to max_ttl
		{[]string{"max-age=600, s-maxage=1200"}, nil, 20 * time.Minute, background, true},
		{[]string{"s-maxage=1200", "max-age=600"}, nil, 20 * time.Minute, background, true},
		{[]string{"max-age=bogus"}, nil, 10 * time.Minute, background, true},
		{[]string{"max-age=-1"}, nil, 10 * time.Minute, background, true},
		// Revalidate before every use: fresh for 0, not raised to min_ttl;
		// kept for the stale window, for conditional revalidation.
		{[]string{"no-cache"}, nil, 0, beforeUse, true},
		{[]string{"No-Cache, max-age=3600"}, nil, 0, beforeUse, true},
		{[]string{"max-age=0"}, nil, 0, beforeUse, true},
		{[]string{"s-maxage=0, max-age=3600"}, nil, 0, beforeUse, true},
		{[]string{"max-age=0, s-maxage=60"}, nil, time.Minute, background, true}, // s-maxage overrides
		{[]string{`no-cache="Set-Cookie"`}, nil, 10 * time.Minute, background, true},
		{[]string{"max-age=0"}, &noStaleWindow, 0, beforeUse, false}, // nothing to keep
		// Never served stale.
		{[]string{"public, max-age=7200, must-revalidate"}, nil, 2 * time.Hour, strictly, true},
		{[]string{"proxy-revalidate"}, nil, 10 * time.Minute, strictly, true},
		{[]string{"max-age=0", "must-revalidate"}, nil, 0, strictly, true},
		{[]string{"no-cache, must-revalidate"}, nil, 0, strictly, true},
		// Not stored.
		{[]string{"no-store"}, nil, 0, background, false},
		{[]string{"max-age=3600", "No-Store"}, nil, 0, background, false},
		{[]string{"private, max-age=60"}, nil, 0, background, false},
		{[]string{"no-store, must-revalidate"}, nil, 0, background, false},
	} {
		u := tc.up
		if u == nil {
			u = up
		}
		h := http.Header{}
		for _, v := range tc.cc {
			h.Add("Cache-Control", v)
		}
		l, store := u.Lifetime(h, now)
		fresh, stale, rv := l.Fresh, l.Stale, l.Revalidation
		if store != tc.wantStore || fresh.Sub(now) != tc.fresh || rv != tc.wantRV {
			t.Errorf("Cache-Control %q: fresh %v, %v, store %v; want %v, %v, %v", tc.cc, fresh.Sub(now), rv, store, tc.fresh, tc.wantRV, tc.wantStore)
			continue
		}
		wantStale := tc.fresh + u.StaleTTL
		if !store {
			wantStale = 0
		}
		if stale.Sub(now) != wantStale {
			t.Errorf("Cache-Control %q: stale until +%v; want +%v", tc.cc, stale.Sub(now), wantStale)
		}
	}
}

func TestServeStale(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, tc := range []struct {
		rv          Revalidation
		fresh       bool
		wantSWR     bool
		wantIfError bool
	}{
		{RevalidateInBackground, false, true, true},
		{RevalidateBeforeUse, false, false, true},
		{RevalidateStrictly, false, false, false},
		{RevalidateStrictly, true, true, true}, // a fresh copy is served whatever its policy
	} {
		d := &Document{Revalidation: tc.rv, FreshUntil: now, StaleUntil: now.Add(time.Hour)}
		if tc.fresh {
			d.FreshUntil = now.Add(time.Minute)
		}
		if got := d.ServeStaleWhileRevalidate(now); got != tc.wantSWR {
			t.Errorf("%v, fresh %v: ServeStaleWhileRevalidate = %v; want %v", tc.rv, tc.fresh, got, tc.wantSWR)
		}
		if got := d.ServeStaleIfError(now); got != tc.wantIfError {
			t.Errorf("%v, fresh %v: ServeStaleIfError = %v; want %v", tc.rv, tc.fresh, got, tc.wantIfError)
		}
	}
}

// TestStaleWindows: stale-while-revalidate=N and stale-if-error=N end
// their windows N seconds after the fresh lifetime, within the stale
// window; without them both last the stale window.
func TestStaleWindows(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	u := &Freshness{TTL: 10 * time.Minute, StaleTTL: time.Hour, MaxTTL: 24 * time.Hour}
	for _, tc := range []struct {
		cc               string
		wantSWR, wantSIE time.Duration // after now; the stale window ends at fresh + 1h
	}{
		{"max-age=60", 60*time.Second + time.Hour, 60*time.Second + time.Hour},
		{"max-age=60, stale-while-revalidate=30, stale-if-error=300", 90 * time.Second, 360 * time.Second},
		{"Stale-If-Error=86400, max-age=60", 60*time.Second + time.Hour, 60*time.Second + time.Hour}, // capped by stale_ttl
		{"max-age=60, stale-while-revalidate=0", 60 * time.Second, 60*time.Second + time.Hour},
		{"max-age=60, stale-while-revalidate=-1, stale-if-error=x", 60*time.Second + time.Hour, 60*time.Second + time.Hour},
	} {
		l, _ := u.Lifetime(http.Header{"Cache-Control": {tc.cc}}, now)
		d := &Document{FetchedAt: now}
		l.Apply(d)
		for _, at := range []time.Duration{0, 61 * time.Second, 89 * time.Second, 91 * time.Second, 359 * time.Second, 361 * time.Second, time.Hour + 59*time.Second, time.Hour + 61*time.Second} {
			when := now.Add(at)
			if got, want := d.ServeStaleWhileRevalidate(when), at < tc.wantSWR; got != want {
				t.Errorf("%q at +%v: ServeStaleWhileRevalidate = %v; want %v", tc.cc, at, got, want)
			}
			if got, want := d.ServeStaleIfError(when), at < tc.wantSIE; got != want {
				t.Errorf("%q at +%v: ServeStaleIfError = %v; want %v", tc.cc, at, got, want)
			}
		}
	}
}
