package server

import (
	"testing"

	"github.com/coordd/coordd/internal/requestid"
)

// TestMadeUpRequestIDValid: an id coordd makes up passes the check a
// caller's own id passes, so a caller may send it back.
func TestMadeUpRequestIDValid(t *testing.T) {
	for range 100 {
		if id := requestid.New(); !validRequestID(id) {
			t.Fatalf("made-up id %q is not a valid request id", id)
		}
	}
}
