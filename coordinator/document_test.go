package coordinator

import (
	"bytes"
	"testing"
	"time"
)

func TestDocumentRoundTrip(t *testing.T) {
	now := time.Unix(1700000000, 123)
	d := &Document{
		Key: "k", URL: "https://x/a", Upstream: "mdn", StatusCode: 200, ContentType: "text/html",
		ETag: `"e"`, LastModified: "Mon, 01 Jan 2024 00:00:00 GMT",
		FetchedAt: now, FreshUntil: now.Add(time.Minute), StaleUntil: now.Add(time.Hour),
		Body: bytes.Repeat([]byte("ab"), 1000),
	}
	got, err := decodeDocument(d.encode())
	if err != nil {
		t.Fatal(err)
	}
	if got.Key != d.Key || got.URL != d.URL || got.Upstream != d.Upstream || got.StatusCode != d.StatusCode ||
		got.ContentType != d.ContentType || got.ETag != d.ETag || got.LastModified != d.LastModified ||
		!got.FetchedAt.Equal(d.FetchedAt) || !got.FreshUntil.Equal(d.FreshUntil) || !got.StaleUntil.Equal(d.StaleUntil) ||
		!bytes.Equal(got.Body, d.Body) {
		t.Fatalf("round trip = %+v; want %+v", got, d)
	}
	for _, bad := range [][]byte{nil, {9}, {docVersion, 0xff}, d.encode()[:5]} {
		if _, err := decodeDocument(bad); err == nil {
			t.Errorf("decodeDocument(%x) succeeded; want error", bad)
		}
	}
}

func FuzzDecodeDocument(f *testing.F) {
	f.Add((&Document{Key: "k", Body: []byte("x")}).encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := decodeDocument(b)
		if err == nil {
			_ = d.encode()
		}
	})
}
