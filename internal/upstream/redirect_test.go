package upstream

import (
	"log/slog"
	"net/http"
	"testing"
)

// TestRedirectTarget: a redirect is followed only to the canonical form of
// a target inside the upstream; tricks and exits are not followed.
func TestRedirectTarget(t *testing.T) {
	up := Config{Name: "docs", BaseURL: "http://127.0.0.1:8080/docs/"}
	SetDefaults(&up)
	if err := Validate(&up, "upstreams[0]"); err != nil {
		t.Fatal(err)
	}
	p := &Client{up: &up, log: slog.New(slog.DiscardHandler)}
	const from = "http://127.0.0.1:8080/docs/a/start"
	tests := []struct {
		name     string
		status   int
		location string
		want     string // "" for not followed
	}{
		{"relative", 302, "next", "http://127.0.0.1:8080/docs/a/next"},
		{"absolute path", 301, "/docs/x", "http://127.0.0.1:8080/docs/x"},
		{"absolute url", 307, "HTTP://127.0.0.1:8080/docs/x?b=2&a=1#f", "http://127.0.0.1:8080/docs/x?a=1&b=2"},
		{"see other", 303, "/docs/x", "http://127.0.0.1:8080/docs/x"},
		{"permanent", 308, "/docs/x", "http://127.0.0.1:8080/docs/x"},
		{"dot segments resolved inside", 302, "/admin/../docs/x", "http://127.0.0.1:8080/docs/x"},
		{"dot segments leaving", 302, "../../admin", ""},
		{"other host", 302, "https://example.com/docs/x", ""},
		{"other port", 302, "http://127.0.0.1:8081/docs/x", ""},
		{"scheme-relative", 302, "//example.com/docs/x", ""},
		{"other scheme", 302, "ftp://127.0.0.1:8080/docs/x", ""},
		{"bare base without slash", 302, "/docs", ""},
		{"escaped slash climbing in", 302, "/admin/..%2f..%2fdocs/x", ""},
		{"escaped slash climbing out", 302, "/docs/..%2F..%2Fadmin/x", ""},
		{"escaped dots", 302, "/docs/%2e%2e/admin", ""},
		{"dotdot params", 302, "/docs/..;/admin", ""},
		{"backslash", 302, `/docs\..\admin`, ""},
		{"escaped backslash", 302, "/docs/..%5cadmin", ""},
		{"double escape", 302, "/docs/%252e%252e/admin", ""},
		{"userinfo", 302, "http://u:p@127.0.0.1:8080/docs/x", ""},
		{"no location", 302, "", ""},
		{"bad location", 302, "http://[::1", ""},
		{"not a redirect", 200, "/docs/x", ""},
		{"not modified", 304, "/docs/x", ""},
		{"multiple choices", 300, "/docs/x", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := &Response{StatusCode: tt.status, Header: http.Header{}}
			if tt.location != "" {
				resp.Header.Set("Location", tt.location)
			}
			got, ok := p.redirect(from, resp)
			if want := tt.want != ""; ok != want || got != tt.want {
				t.Fatalf("redirect(%d, Location %q) = %q, %v; want %q, %v", tt.status, tt.location, got, ok, tt.want, want)
			}
		})
	}
}
