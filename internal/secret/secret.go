// Package secret holds values that must never be printed: credentials
// coordd sends upstream. A Value's String, Format, GoString, MarshalJSON,
// MarshalText, MarshalYAML and LogValue all give "<redacted>", so that no
// log line, error, status page or dumped configuration can spill it; only
// Reveal gives the value, at the one place it is sent.
package secret

import (
	"fmt"
	"io"
	"log/slog"
)

// Redacted is what a Value prints as.
const Redacted = "<redacted>"

// Value is a secret string. The zero Value is empty. It holds the string
// behind a pointer, so that even reflection-based printing of a struct
// holding a Value in an unexported field (fmt's %+v) shows an address,
// never the secret.
type Value struct{ p *string }

// New returns a Value holding s.
func New(s string) Value {
	if s == "" {
		return Value{}
	}
	return Value{p: &s}
}

// Reveal returns the secret. Call it only where the secret is sent.
func (v Value) Reveal() string {
	if v.p == nil {
		return ""
	}
	return *v.p
}

// IsZero reports whether v is empty.
func (v Value) IsZero() bool { return v.p == nil }

// Equal reports whether v and w hold the same secret.
func (v Value) Equal(w Value) bool { return v.Reveal() == w.Reveal() }

func (v Value) String() string   { return Redacted }
func (v Value) GoString() string { return Redacted }

// Format prints Redacted for every verb.
func (v Value) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, Redacted) }

func (v Value) MarshalJSON() ([]byte, error) { return []byte(`"` + Redacted + `"`), nil }
func (v Value) MarshalText() ([]byte, error) { return []byte(Redacted), nil }
func (v Value) MarshalYAML() (any, error)    { return Redacted, nil }
func (v Value) LogValue() slog.Value         { return slog.StringValue(Redacted) }
