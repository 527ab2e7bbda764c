package document

import (
	"bytes"
	"testing"
	"time"
)

func TestDocumentRoundTrip(t *testing.T) {
	now := time.Unix(1700000000, 123)
	d := &Document{
		Key: "k", URL: "https://x/a", Upstream: "mdn", Tenant: "team-a", StatusCode: 200, ContentType: "text/html",
		ETag: `"e"`, LastModified: "Mon, 01 Jan 2024 00:00:00 GMT",
		FetchedAt: now, FreshUntil: now.Add(time.Minute), StaleUntil: now.Add(time.Hour),
		Revalidation: RevalidateStrictly, Body: bytes.Repeat([]byte("ab"), 1000),
	}
	windows := &Document{
		Key: d.Key, URL: d.URL, Upstream: d.Upstream, Tenant: d.Tenant, StatusCode: d.StatusCode, ContentType: d.ContentType,
		ETag: d.ETag, LastModified: d.LastModified, FetchedAt: d.FetchedAt, FreshUntil: d.FreshUntil, StaleUntil: d.StaleUntil,
		Revalidation: d.Revalidation, Body: d.Body,
		WhileRevalidateUntil: now.Add(2 * time.Minute), IfErrorUntil: now.Add(30 * time.Minute),
	}
	for _, d := range []*Document{d, windows} {
		got, err := Decode(d.Encode())
		if err != nil {
			t.Fatal(err)
		}
		if got.Key != d.Key || got.URL != d.URL || got.Upstream != d.Upstream || got.StatusCode != d.StatusCode ||
			got.ContentType != d.ContentType || got.ETag != d.ETag || got.LastModified != d.LastModified ||
			!got.FetchedAt.Equal(d.FetchedAt) || !got.FreshUntil.Equal(d.FreshUntil) || !got.StaleUntil.Equal(d.StaleUntil) ||
			got.Revalidation != d.Revalidation || got.Tenant != d.Tenant || !bytes.Equal(got.Body, d.Body) ||
			!got.WhileRevalidateUntil.Equal(d.WhileRevalidateUntil) || !got.IfErrorUntil.Equal(d.IfErrorUntil) ||
			got.WhileRevalidateUntil.IsZero() != d.WhileRevalidateUntil.IsZero() {
			t.Fatalf("round trip = %+v; want %+v", got, d)
		}
	}
	// d's windows are unset: it is encoded as version 3, which a coordd of
	// the previous version reads.
	if v := d.Encode()[0]; v != 3 {
		t.Errorf("without windows: version %d; want 3", v)
	}
	unknownRV := d.Encode()
	unknownRV[len(unknownRV)-len(d.Body)-len(d.Tenant)-2] = byte(RevalidateStrictly) + 1
	longTenant := d.Encode()
	longTenant[len(longTenant)-len(d.Body)-len(d.Tenant)-1] = 0x7f // longer than the rest
	enc := windows.Encode()
	noWindows := enc[:len(enc)-len(d.Body)-2] // version 4 cut short
	for _, bad := range [][]byte{nil, {0}, {9}, {Version, 0xff}, d.Encode()[:5], unknownRV, longTenant[:len(longTenant)-len(d.Body)], noWindows} {
		if _, err := Decode(bad); err == nil {
			t.Errorf("Decode(%x) succeeded; want error", bad)
		}
	}
}

func FuzzDecodeDocument(f *testing.F) {
	f.Add((&Document{Key: "k", Body: []byte("x")}).Encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := Decode(b)
		if err == nil {
			_ = d.Encode()
		}
	})
}

// TestDecodeOlderVersions: copies an older coordd cached still decode:
// version 1 (without Revalidation) as RevalidateInBackground, versions 1
// and 2 (without Tenant) as the default tenant, whose ids they were stored
// under.
func TestDecodeOlderVersions(t *testing.T) {
	now := time.Unix(1700000000, 0)
	d := &Document{Key: "https://x/a", URL: "https://x/a", Upstream: "mdn", StatusCode: 200, ETag: `"e"`, FetchedAt: now, FreshUntil: now,
		StaleUntil: now.Add(time.Hour), Revalidation: RevalidateStrictly, Body: []byte("body")}
	// A document without RFC 5861 windows is encoded as version 3 (see
	// TestDocumentRoundTrip); version 4 is version 3 with two varints (zero:
	// unset) before the body. Version 2 is version 3 without the Tenant (one
	// zero byte here) before the body; version 1 is version 2 without the
	// Revalidation varint (one byte here) before that.
	v3 := d.Encode()
	v4 := append(append([]byte{4}, v3[1:len(v3)-len(d.Body)]...), append([]byte{0, 0}, d.Body...)...)
	head := v3[1 : len(v3)-len(d.Body)-1]
	v2 := append(append([]byte{2}, head...), d.Body...)
	v1 := append(append([]byte{1}, head[:len(head)-1]...), d.Body...)
	tests := []struct {
		name   string
		enc    []byte
		wantRV Revalidation
	}{
		{"version 1", v1, RevalidateInBackground},
		{"version 2", v2, RevalidateStrictly},
		{"version 3", v3, RevalidateStrictly},
		{"version 4", v4, RevalidateStrictly},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Decode(tt.enc)
			if err != nil {
				t.Fatal(err)
			}
			if got.Key != d.Key || got.ETag != d.ETag || !got.StaleUntil.Equal(d.StaleUntil) || got.Revalidation != tt.wantRV ||
				got.Tenant != "" || got.ID() != d.URL || !bytes.Equal(got.Body, d.Body) {
				t.Errorf("got %+v (id %q); want %+v with Revalidation %v, id %q", got, got.ID(), d, tt.wantRV, d.URL)
			}
		})
	}
}
