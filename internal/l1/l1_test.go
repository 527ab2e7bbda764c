package l1

import (
	"bytes"
	"fmt"
	"runtime"
	"sync"
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

// doc is a document of key with a body of n bytes of fill, fetched at.
func doc(key string, n int, fill byte, at time.Time) *document.Document {
	return &document.Document{Key: key, URL: key, StatusCode: 200, FetchedAt: at, FreshUntil: at.Add(time.Hour), StaleUntil: at.Add(time.Hour), Body: bytes.Repeat([]byte{fill}, n)}
}

// held is what bigcache holds: entries and the bytes of their encodings.
func held(t *testing.T, l *Cache) (n int, size int64) {
	t.Helper()
	it := l.bc.Iterator()
	for it.SetNext() {
		e, err := it.Value()
		if err != nil {
			t.Fatal(err)
		}
		n++
		size += int64(len(e.Value()))
	}
	return n, size
}

// TestL1DocumentBytes: Stats' DocumentBytes is the size of the documents
// held (their encodings), far below the memory bigcache reserves for a few
// small ones, and follows every way a document comes and goes: stored,
// replaced by a newer copy (larger or smaller), kept over an older one,
// deleted.
func TestL1DocumentBytes(t *testing.T) {
	l, err := New(256<<20, 1<<20, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	now := time.Now()
	var want int64
	keep := map[string]*document.Document{} // alive: the weak map's copies are the newest
	for i := range 5 {
		d := doc(fmt.Sprint("k", i), 1<<10, 'a', now)
		enc := d.Encode()
		l.Set(d, enc)
		keep[d.Key] = d
		want += int64(len(enc))
	}
	steps := []struct {
		name string
		do   func() int64 // the change in the documents' size
	}{
		{"five 1 KiB documents", func() int64 { return 0 }},
		{"a newer, larger copy", func() int64 {
			old, d := keep["k0"].Encode(), doc("k0", 4<<10, 'b', now.Add(time.Second))
			enc := d.Encode()
			l.Set(d, enc)
			keep["k0"] = d
			return int64(len(enc) - len(old))
		}},
		{"a newer, smaller copy", func() int64 {
			old, d := keep["k1"].Encode(), doc("k1", 100, 'c', now.Add(time.Second))
			enc := d.Encode()
			l.Set(d, enc)
			keep["k1"] = d
			return int64(len(enc) - len(old))
		}},
		{"an older copy, refused", func() int64 {
			d := doc("k2", 8<<10, 'd', now.Add(-time.Second))
			l.Set(d, d.Encode())
			return 0
		}},
		{"a delete", func() int64 {
			old := keep["k3"].Encode()
			l.Delete("k3")
			delete(keep, "k3")
			return -int64(len(old))
		}},
		{"a delete of nothing", func() int64 {
			l.Delete("nothing")
			return 0
		}},
	}
	for _, step := range steps {
		want += step.do()
		s := l.Stats()
		n, size := held(t, l)
		if s.DocumentBytes != want || size != want || s.Entries != len(keep) || n != len(keep) {
			t.Errorf("%s: DocumentBytes %d, Entries %d (bigcache holds %d in %d); want %d in %d", step.name, s.DocumentBytes, s.Entries, size, n, want, len(keep))
		}
		if s.DocumentBytes >= s.Bytes {
			t.Errorf("%s: DocumentBytes %d, Bytes %d; want the documents well inside the memory reserved", step.name, s.DocumentBytes, s.Bytes)
		}
	}
}

// TestL1DocumentBytesUnderEviction stores, replaces and deletes documents
// from several goroutines in a cache too small for them, so that bigcache
// evicts as they go: once they are done, DocumentBytes and Entries are
// what bigcache holds.
func TestL1DocumentBytesUnderEviction(t *testing.T) {
	l, err := New(1<<20, 64<<10, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	now := time.Now()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 300 {
				key := fmt.Sprint("k", (g*7+i)%40) // goroutines share keys
				switch i % 5 {
				case 4:
					l.Delete(key)
				default:
					d := doc(key, 1<<10+(i*g*389)%(48<<10), 'x', now.Add(time.Duration(i)*time.Millisecond))
					l.Set(d, d.Encode())
				}
			}
		})
	}
	wg.Wait()
	s := l.Stats()
	n, size := held(t, l)
	if s.DocumentBytes != size || s.Entries != n {
		t.Errorf("DocumentBytes %d, Entries %d; bigcache holds %d bytes in %d entries", s.DocumentBytes, s.Entries, size, n)
	}
	if s.Evicted == 0 {
		t.Errorf("no eviction: the test did not fill the cache")
	}
}
