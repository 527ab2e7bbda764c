package requestid

import (
	"strings"
	"testing"
)

// TestNew: ids look as crypto/rand.Text's did (26 characters of its
// alphabet), use every character evenly, and do not repeat.
func TestNew(t *testing.T) {
	seen := make(map[string]bool)
	counts := make(map[rune]int)
	for range 10000 {
		id := New()
		if len(id) != 26 || strings.Trim(id, Alphabet) != "" {
			t.Fatalf("id %q: want 26 characters of %s", id, Alphabet)
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
	if len(counts) != len(Alphabet) {
		t.Fatalf("%d characters used; want all %d", len(counts), len(Alphabet))
	}
	for r, n := range counts {
		if n < 7000 || n > 9300 {
			t.Errorf("%q used %d times of 260,000; want about 8,125", r, n)
		}
	}
}
