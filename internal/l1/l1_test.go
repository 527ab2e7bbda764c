package l1

import (
	"bytes"
	"runtime"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/document"
)

// TestL1SharesTheFlightsBuffer: while a Document is alive, L1 hits return
// that very Document (and body), not a copy out of bigcache; once it is
// collected, a hit decodes a copy and shares that from then on.
func TestL1SharesTheFlightsBuffer(t *testing.T) {
	l1, err := New(16<<20, 1<<20, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer l1.Close()
	now := time.Now()
	d := &document.Document{Key: "k", URL: "k", StatusCode: 200, FetchedAt: now, FreshUntil: now.Add(time.Hour), StaleUntil: now.Add(time.Hour), Body: bytes.Repeat([]byte("x"), 100<<10)}
	l1.Set(d, d.Encode())
	if got := l1.Get("k"); got != d || &got.Body[0] != &d.Body[0] {
		t.Fatal("hit while the document is alive returned a copy")
	}
	body := append([]byte(nil), d.Body...)
	runtime.KeepAlive(d)
	d = nil
	for range 5 {
		runtime.GC()
	}
	a := l1.Get("k")
	if a == nil || !bytes.Equal(a.Body, body) {
		t.Fatal("hit after collection lost the document")
	}
	if b := l1.Get("k"); b != a {
		t.Fatal("second hit decoded another copy; want the first one shared")
	}
	l1.Delete("k")
	if l1.Get("k") != nil {
		t.Fatal("hit after Delete")
	}
}

// TestL1NewerCopyWins races the Sets of an older and a newer copy of one
// document, many times: whichever order they run in, the newer copy is
// the one L1 keeps, in the weak map and in bigcache.
func TestL1NewerCopyWins(t *testing.T) {
	l1, err := New(64<<20, 1<<20, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer l1.Close()
	now := time.Now()
	doc := func(at time.Time, fill byte) *document.Document {
		return &document.Document{Key: "k", URL: "k", StatusCode: 200, FetchedAt: at, FreshUntil: at.Add(time.Hour), StaleUntil: at.Add(time.Hour), Body: bytes.Repeat([]byte{fill}, 64<<10)}
	}
	for i := range 100 {
		older, newer := doc(now, 'o'), doc(now.Add(time.Second), 'n')
		oenc, nenc := older.Encode(), newer.Encode()
		start := make(chan struct{})
		done := make(chan struct{}, 2)
		go func() { <-start; l1.Set(older, oenc); done <- struct{}{} }()
		go func() { <-start; l1.Set(newer, nenc); done <- struct{}{} }()
		close(start)
		<-done
		<-done
		if got := l1.Get("k"); got == nil || !got.FetchedAt.Equal(newer.FetchedAt) || got.Body[0] != 'n' {
			t.Fatalf("round %d: L1 kept the older copy", i)
		}
		// bigcache too: a hit once the newer copy is collected.
		b, err := l1.bc.Get("k")
		if err != nil {
			t.Fatalf("round %d: bigcache: %v", i, err)
		}
		if d, err := document.Decode(b); err != nil || d.Body[0] != 'n' {
			t.Fatalf("round %d: bigcache kept the older copy", i)
		}
		runtime.KeepAlive(newer)
		l1.Delete("k")
	}
}
