package coordinator

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
)

func newTestCoordinator(t *testing.T, cfg Config) *Coordinator {
	t.Helper()
	c, err := New(cfg, Options{})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestResolve(t *testing.T) {
	c := newTestCoordinator(t, Config{Upstreams: []Upstream{
		{Name: "mdn", BaseURL: "https://developer.mozilla.org"},
		{Name: "local", BaseURL: "http://127.0.0.1:8080/docs/"},
		{Name: "noslash", BaseURL: "http://127.0.0.1:9090/docs"},
	}})
	tests := []struct {
		name, url, key string
		want           error
		wantURL        string
	}{
		{name: "plain", url: "https://developer.mozilla.org/en-US/docs/Web", wantURL: "https://developer.mozilla.org/en-US/docs/Web"},
		{name: "case and default port", url: "HTTPS://Developer.Mozilla.ORG:443/a", wantURL: "https://developer.mozilla.org/a"},
		{name: "fragment dropped, query sorted", url: "https://developer.mozilla.org/a?b=2&a=1#x", wantURL: "https://developer.mozilla.org/a?a=1&b=2"},
		{name: "dot segments", url: "https://developer.mozilla.org/a/../b/./c", wantURL: "https://developer.mozilla.org/b/c"},
		{name: "empty path", url: "https://developer.mozilla.org", wantURL: "https://developer.mozilla.org/"},
		{name: "base path", url: "http://127.0.0.1:8080/docs/x", wantURL: "http://127.0.0.1:8080/docs/x"},
		{name: "custom key", url: "https://developer.mozilla.org/a", key: "k1", wantURL: "https://developer.mozilla.org/a"},
		{name: "empty", url: "", want: ErrInvalidArgument},
		{name: "relative", url: "/en-US/docs/Web", want: ErrInvalidArgument},
		{name: "scheme-relative", url: "//developer.mozilla.org/a", want: ErrInvalidArgument},
		{name: "ftp", url: "ftp://developer.mozilla.org/a", want: ErrInvalidArgument},
		{name: "file", url: "file:///etc/passwd", want: ErrInvalidArgument},
		{name: "javascript", url: "javascript:alert(1)", want: ErrInvalidArgument},
		{name: "userinfo", url: "https://user:pw@developer.mozilla.org/a", want: ErrInvalidArgument},
		{name: "control char", url: "https://developer.mozilla.org/a\nb", want: ErrInvalidArgument},
		{name: "nul", url: "https://developer.mozilla.org/a\x00", want: ErrInvalidArgument},
		{name: "oversized url", url: "https://developer.mozilla.org/" + strings.Repeat("a", MaxURLBytes), want: ErrInvalidArgument},
		{name: "oversized key", url: "https://developer.mozilla.org/a", key: strings.Repeat("k", MaxKeyBytes+1), want: ErrInvalidArgument},
		{name: "control in key", url: "https://developer.mozilla.org/a", key: "a\tb", want: ErrInvalidArgument},
		{name: "bad utf8 key", url: "https://developer.mozilla.org/a", key: "\xff", want: ErrInvalidArgument},
		{name: "bad port", url: "https://developer.mozilla.org:99999/a", want: ErrInvalidArgument},
		{name: "other host", url: "https://evil.example/a", want: ErrForbidden},
		{name: "host suffix", url: "https://developer.mozilla.org.evil.example/a", want: ErrForbidden},
		{name: "other scheme of host", url: "http://developer.mozilla.org/a", want: ErrForbidden},
		{name: "other port", url: "http://127.0.0.1:8081/docs/x", want: ErrForbidden},
		{name: "outside base path", url: "http://127.0.0.1:8080/admin", want: ErrForbidden},
		{name: "base path prefix trick", url: "http://127.0.0.1:8080/docsevil/x", want: ErrForbidden},
		{name: "dot escape", url: "http://127.0.0.1:8080/docs/../admin", want: ErrForbidden},
		{name: "metadata IP", url: "http://169.254.169.254/latest/meta-data", want: ErrForbidden},

		// A base path ending in "/" admits what is under it, not itself
		// without the slash; one without admits itself too.
		{name: "slash base: directory", url: "http://127.0.0.1:8080/docs/", wantURL: "http://127.0.0.1:8080/docs/"},
		{name: "slash base: bare", url: "http://127.0.0.1:8080/docs", want: ErrForbidden},
		{name: "slash base: bare, dot", url: "http://127.0.0.1:8080/docs/.", want: ErrForbidden},
		{name: "no-slash base: bare", url: "http://127.0.0.1:9090/docs", wantURL: "http://127.0.0.1:9090/docs"},
		{name: "no-slash base: directory", url: "http://127.0.0.1:9090/docs/", wantURL: "http://127.0.0.1:9090/docs/"},
		{name: "no-slash base: under", url: "http://127.0.0.1:9090/docs/x", wantURL: "http://127.0.0.1:9090/docs/x"},
		{name: "no-slash base: prefix trick", url: "http://127.0.0.1:9090/docsevil", want: ErrForbidden},

		// Path tricks: refused, whatever upstream they aim at.
		{name: "dotdot params", url: "http://127.0.0.1:8080/docs/..;/admin", want: ErrInvalidArgument},
		{name: "dotdot named params", url: "http://127.0.0.1:8080/docs/..;jsessionid=1/admin", want: ErrInvalidArgument},
		{name: "dot params", url: "http://127.0.0.1:8080/docs/.;/x", want: ErrInvalidArgument},
		{name: "dotdot escaped semicolon", url: "http://127.0.0.1:8080/docs/..%3B/admin", want: ErrInvalidArgument},
		{name: "dotdot params last", url: "https://developer.mozilla.org/a/..;", want: ErrInvalidArgument},
		{name: "backslash", url: `http://127.0.0.1:8080/docs\..\admin`, want: ErrInvalidArgument},
		{name: "backslash in segment", url: `https://developer.mozilla.org/a\b`, want: ErrInvalidArgument},
		{name: "escaped backslash", url: "http://127.0.0.1:8080/docs/..%5C..%5Cadmin", want: ErrInvalidArgument},
		{name: "escaped backslash lower", url: "https://developer.mozilla.org/a%5cb", want: ErrInvalidArgument},
		{name: "escaped slash", url: "http://127.0.0.1:8080/docs/..%2F..%2Fadmin", want: ErrInvalidArgument},
		{name: "escaped slash lower", url: "http://127.0.0.1:8080/admin/..%2f..%2fdocs/x", want: ErrInvalidArgument},
		{name: "escaped dot", url: "http://127.0.0.1:8080/docs/%2E%2E/admin", want: ErrInvalidArgument},
		{name: "escaped dot lower", url: "https://developer.mozilla.org/%2e%2e/a", want: ErrInvalidArgument},
		{name: "escaped dot in name", url: "https://developer.mozilla.org/a%2ehtml", want: ErrInvalidArgument},
		{name: "escaped percent", url: "https://developer.mozilla.org/a%25b", want: ErrInvalidArgument},
		{name: "double escape", url: "http://127.0.0.1:8080/docs/%252e%252e/admin", want: ErrInvalidArgument},
		{name: "escaped nul", url: "https://developer.mozilla.org/a%00b", want: ErrInvalidArgument},
		{name: "escaped newline", url: "https://developer.mozilla.org/a%0Ab", want: ErrInvalidArgument},
		{name: "backslash in host", url: `https://developer.mozilla.org\@evil.example/a`, want: ErrInvalidArgument},

		// Not tricks: kept.
		{name: "semicolon in name", url: "https://developer.mozilla.org/a;b/c", wantURL: "https://developer.mozilla.org/a;b/c"},
		{name: "dot file", url: "https://developer.mozilla.org/.well-known/x", wantURL: "https://developer.mozilla.org/.well-known/x"},
		{name: "other escape", url: "https://developer.mozilla.org/a%20b%41", wantURL: "https://developer.mozilla.org/a%20bA"},
		{name: "escaped slash in query", url: "https://developer.mozilla.org/a?p=%2F..%2F", wantURL: "https://developer.mozilla.org/a?p=%2F..%2F"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The second pass finds the url in the memo (urlmemo.go).
			for pass := range 2 {
				got, err := c.Resolve(tt.url, tt.key)
				if tt.want != nil {
					if !errors.Is(err, tt.want) {
						t.Fatalf("pass %d: Resolve(%q, %q) error = %v; want %v", pass, tt.url, tt.key, err, tt.want)
					}
					continue
				}
				if err != nil {
					t.Fatalf("pass %d: Resolve(%q) error = %v", pass, tt.url, err)
				}
				if got.URL != tt.wantURL {
					t.Errorf("pass %d: URL = %q; want %q", pass, got.URL, tt.wantURL)
				}
				wantKey := tt.key
				if wantKey == "" {
					wantKey = tt.wantURL
				}
				if got.Key != wantKey {
					t.Errorf("pass %d: Key = %q; want %q", pass, got.Key, wantKey)
				}
			}
		})
	}
}

// TestURLMemoCollisions resolves, from many goroutines at once, more urls
// than the memo has slots, each with an upstream of its own, so that
// slots are replaced while they are read: every answer must be its own
// url's, never another's that shares its slot.
func TestURLMemoCollisions(t *testing.T) {
	const upstreams = 3
	var ups []Upstream
	for i := range upstreams {
		ups = append(ups, Upstream{Name: fmt.Sprintf("u%d", i), BaseURL: fmt.Sprintf("http://127.0.0.1:%d/", 8000+i)})
	}
	c := newTestCoordinator(t, Config{Upstreams: ups})
	n := 3 * urlMemoSlots
	raw := func(i int) (url, want, up string) {
		u := i % upstreams
		// Written unlike its canonical form, so a wrong answer shows.
		return fmt.Sprintf("HTTP://127.0.0.1:%d/a/../d%d?z=1&a=%d", 8000+u, i, i),
			fmt.Sprintf("http://127.0.0.1:%d/d%d?a=%d&z=1", 8000+u, i, i),
			fmt.Sprintf("u%d", u)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for pass := range 3 {
				for j := range n {
					i := (j*7 + g*131 + pass) % n
					u, want, up := raw(i)
					got, err := c.Resolve(u, "")
					if err != nil || got.URL != want || got.Upstream() != up {
						t.Errorf("Resolve(%q) = %q in %q, %v; want %q in %q", u, got.URL, got.Upstream(), err, want, up)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	// Outside every upstream: refused, and refused again (never kept).
	for range 2 {
		if _, err := c.Resolve("http://127.0.0.1:9999/x", ""); !errors.Is(err, ErrForbidden) {
			t.Fatalf("outside every upstream: %v; want ErrForbidden", err)
		}
	}
}

func TestConfigValidateNamesField(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		field string
	}{
		{"bad base url", Config{Upstreams: []Upstream{{Name: "a", BaseURL: "ftp://x"}}}, "upstreams[0] (a).base_url"},
		{"bad name", Config{Upstreams: []Upstream{{Name: "a b", BaseURL: "http://x"}}}, "upstreams[0].name"},
		{"duplicate", Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://x"}, {Name: "a", BaseURL: "http://y"}}}, "upstreams[1].name"},
		{"base url trick", Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://x/docs/%2e%2e/"}}}, "upstreams[0] (a).base_url"},
		{"negative ttl", Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://x", TTL: -1}}}, "upstreams[0] (a).ttl"},
		{"tiny l1", Config{L1MaxBytes: 10}, "l1_max_bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg, Options{})
			if err == nil || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("New error = %v; want one naming %q", err, tt.field)
			}
		})
	}
}

// FuzzResolve: no input crashes Resolve, and whatever it accepts is inside
// the upstream and resolves to itself.
func FuzzResolve(f *testing.F) {
	for _, s := range []string{"https://developer.mozilla.org/a?b=1#c", "http://127.0.0.1:8080/docs/../x", "//x", "https://u@x/", "\x00", "https://developer.mozilla.org:443/%2e%2e/a"} {
		f.Add(s, "")
	}
	c, err := New(Config{Upstreams: []Upstream{
		{Name: "mdn", BaseURL: "https://developer.mozilla.org"},
		{Name: "local", BaseURL: "http://127.0.0.1:8080/docs/"},
	}}, Options{})
	if err != nil {
		f.Fatal(err)
	}
	defer c.Close()
	f.Fuzz(func(t *testing.T, raw, key string) {
		tg, err := c.Resolve(raw, key)
		if err != nil {
			if !errors.Is(err, ErrInvalidArgument) && !errors.Is(err, ErrForbidden) {
				t.Fatalf("Resolve(%q) = %v; want an invalid-argument or forbidden error", raw, err)
			}
			return
		}
		again, err := c.Resolve(tg.URL, "")
		if err != nil || again.URL != tg.URL {
			t.Fatalf("canonical %q resolves to %q, %v; want itself", tg.URL, again.URL, err)
		}
	})
}
