package server

import (
	"strings"
	"testing"
)

// TestNewRequestID: ids made up for callers that send none look as
// crypto/rand.Text's did (26 characters of its alphabet), pass the check a
// caller's id passes, and do not repeat.
func TestNewRequestID(t *testing.T) {
	seen := make(map[string]bool)
	counts := make(map[rune]int)
	for range 10000 {
		id := newRequestID()
		if len(id) != 26 || strings.Trim(id, idAlphabet) != "" || !validRequestID(id) {
			t.Fatalf("id %q: want 26 characters of %s", id, idAlphabet)
		}
		if seen[id] {
			t.Fatalf("id %q made twice", id)
		}
		seen[id] = true
		for _, r := range id {
			counts[r]++
		}
	}
	// 260,000 characters: each of the 32 expected 8,125 times.
	if len(counts) != len(idAlphabet) {
		t.Fatalf("%d characters used; want all %d", len(counts), len(idAlphabet))
	}
	for r, n := range counts {
		if n < 7000 || n > 9300 {
			t.Errorf("%q used %d times of 260,000; want about 8,125", r, n)
		}
	}
}
