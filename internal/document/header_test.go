package document

import (
	"strings"
	"testing"
)

func TestServableHeader(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    string
		want bool
	}{
		{"empty", "", true},
		{"etag", `"33a64df5"`, true},
		{"weak etag", `W/"0815"`, true},
		{"content type", "text/html; charset=utf-8", true},
		{"tab", "text/html;\tcharset=utf-8", true},
		{"utf-8", "Mié, 21 Oct 2026", true},
		{"replacement character", "\uFFFD", true},
		{"1 KiB", strings.Repeat("a", 1024), true},
		{"over 1 KiB", strings.Repeat("a", 1025), false},
		{"latin-1 byte", "\"caf\xe9\"", false},
		{"truncated rune", "\xe2\x82", false},
		{"NUL", "a\x00b", false},
		{"newline", "a\nb", false},
		{"DEL", "a\x7fb", false},
		{"C1 control", "a\u0085b", false},
	} {
		if got := servableHeader(tc.v); got != tc.want {
			t.Errorf("%s: servableHeader(%.20q) = %v; want %v", tc.name, tc.v, got, tc.want)
		}
	}
}

// TestDecodeDropsBadHeaders: a copy cached before headers were checked is
// served without them.
func TestDecodeDropsBadHeaders(t *testing.T) {
	d := &Document{Key: "k", ContentType: "text/html", ETag: "\"\xff\"", LastModified: strings.Repeat("x", 2000), Body: []byte("b")}
	got, err := Decode(d.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if got.ContentType != "text/html" || got.ETag != "" || got.LastModified != "" {
		t.Errorf("decoded headers %q, %q, %.10q; want %q, \"\", \"\"", got.ContentType, got.ETag, got.LastModified, "text/html")
	}
}
