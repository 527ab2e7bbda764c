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
		Revalidation: RevalidateStrictly, Body: bytes.Repeat([]byte("ab"), 1000),
	}
	got, err := decodeDocument(d.encode())
	if err != nil {
		t.Fatal(err)
	}
	if got.Key != d.Key || got.URL != d.URL || got.Upstream != d.Upstream || got.StatusCode != d.StatusCode ||
		got.ContentType != d.ContentType || got.ETag != d.ETag || got.LastModified != d.LastModified ||
		!got.FetchedAt.Equal(d.FetchedAt) || !got.FreshUntil.Equal(d.FreshUntil) || !got.StaleUntil.Equal(d.StaleUntil) ||
		got.Revalidation != d.Revalidation || !bytes.Equal(got.Body, d.Body) {
		t.Fatalf("round trip = %+v; want %+v", got, d)
	}
	unknownRV := d.encode()
	unknownRV[len(unknownRV)-len(d.Body)-1] = byte(RevalidateStrictly) + 1
	for _, bad := range [][]byte{nil, {9}, {docVersion, 0xff}, d.encode()[:5], unknownRV} {
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

// TestDecodeVersion1: a copy an older coordd cached (version 1, without
// Revalidation) still decodes, as RevalidateInBackground.
func TestDecodeVersion1(t *testing.T) {
	now := time.Unix(1700000000, 0)
	d := &Document{Key: "k", StatusCode: 200, ETag: `"e"`, FetchedAt: now, FreshUntil: now, StaleUntil: now.Add(time.Hour), Body: []byte("body")}
	v2 := d.encode()
	// Version 1 is version 2 without the Revalidation varint (one byte
	// here) before the body.
	v1 := append([]byte{1}, v2[1:len(v2)-len(d.Body)-1]...)
	v1 = append(v1, d.Body...)
	got, err := decodeDocument(v1)
	if err != nil {
		t.Fatal(err)
	}
	if got.Key != d.Key || got.ETag != d.ETag || !got.StaleUntil.Equal(d.StaleUntil) || got.Revalidation != RevalidateInBackground || !bytes.Equal(got.Body, d.Body) {
		t.Errorf("got %+v; want %+v", got, d)
	}
}
