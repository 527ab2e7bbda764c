package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// canonicalJSON returns v in the JSON Canonicalization Scheme (RFC 8785):
// object members sorted by the UTF-16 code units of their names, no
// insignificant white space, strings with the fewest escapes, numbers as
// ECMAScript prints a double. Identical arguments written differently
// (member order, spacing, 1.0 against 1) give the same bytes, so the same
// coalescing key. Hand-rolled: no module the proxy serves here implements
// RFC 8785, and the scheme is small. It refuses invalid UTF-8 (which
// encoding/json would quietly replace), duplicate member names and numbers
// a double cannot hold.
func canonicalJSON(v []byte) ([]byte, error) {
	if !utf8.Valid(v) {
		return nil, errors.New("not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	var b bytes.Buffer
	if err := canonValue(dec, &b, 0); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err == nil {
		return nil, errors.New("more than one JSON value")
	}
	return b.Bytes(), nil
}

// maxDepth bounds the nesting of arguments, so that a hostile document
// cannot exhaust the stack.
const maxDepth = 64

func canonValue(dec *json.Decoder, b *bytes.Buffer, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("nested deeper than %d", maxDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			type member struct {
				name string
				key  []uint16
				val  []byte
			}
			var ms []member
			seen := map[string]bool{}
			for dec.More() {
				nt, err := dec.Token()
				if err != nil {
					return err
				}
				name, _ := nt.(string)
				if seen[name] {
					return fmt.Errorf("duplicate member %q", name)
				}
				seen[name] = true
				var vb bytes.Buffer
				if err := canonValue(dec, &vb, depth+1); err != nil {
					return err
				}
				ms = append(ms, member{name, utf16.Encode([]rune(name)), vb.Bytes()})
			}
			if _, err := dec.Token(); err != nil {
				return err
			}
			slices.SortFunc(ms, func(x, y member) int { return slices.Compare(x.key, y.key) })
			b.WriteByte('{')
			for i, m := range ms {
				if i > 0 {
					b.WriteByte(',')
				}
				canonString(b, m.name)
				b.WriteByte(':')
				b.Write(m.val)
			}
			b.WriteByte('}')
		case '[':
			b.WriteByte('[')
			for i := 0; dec.More(); i++ {
				if i > 0 {
					b.WriteByte(',')
				}
				if err := canonValue(dec, b, depth+1); err != nil {
					return err
				}
			}
			if _, err := dec.Token(); err != nil {
				return err
			}
			b.WriteByte(']')
		}
	case string:
		canonString(b, t)
	case json.Number:
		s, err := canonNumber(t.String())
		if err != nil {
			return err
		}
		b.WriteString(s)
	case bool:
		b.WriteString(strconv.FormatBool(t))
	case nil:
		b.WriteString("null")
	}
	return nil
}

// canonString writes s as RFC 8785 3.2.2.2 says: only ", \ and the
// control characters escaped, the short forms where JSON has them.
func canonString(b *bytes.Buffer, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if r < 0x20 {
				fmt.Fprintf(b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// canonNumber prints the double that s denotes as ECMAScript's
// Number.prototype.toString does (RFC 8785 3.2.2.3).
func canonNumber(s string) (string, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return "", fmt.Errorf("number %.40q out of range", s)
	}
	if f == 0 {
		return "0", nil // -0 too
	}
	if a := math.Abs(f); a >= 1e-6 && a < 1e21 {
		return strconv.FormatFloat(f, 'f', -1, 64), nil
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // 1.5e-07
	mant, exp, _ := strings.Cut(e, "e")
	sign, digits := exp[:1], strings.TrimLeft(exp[1:], "0")
	return mant + "e" + sign + digits, nil
}
