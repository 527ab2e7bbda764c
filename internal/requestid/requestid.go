// Package requestid makes up request ids: for coordd's calls that bring
// none (server), and for the bare gRPC floor it is measured against
// (internal/testing/wirefloor), so that both pay the same for one.
package requestid

import "math/rand/v2"

// Alphabet is crypto/rand.Text's: ids look as they did when coordd made
// them with it.
const Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"

// New returns 26 random characters of Alphabet (130 bits), as
// crypto/rand.Text does, from math/rand/v2's generator (ChaCha8, seeded
// by the runtime from the system's randomness, with no system call per
// id): a request id must be unique, not secret.
func New() string {
	var b [26]byte
	var r uint64
	for i := range b {
		if i%12 == 0 {
			r = rand.Uint64() // 12 characters of 5 bits each
		}
		b[i] = Alphabet[r&31]
		r >>= 5
	}
	return string(b[:])
}
