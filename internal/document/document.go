package document

import (
	"encoding/binary"
	"errors"
	"strconv"
	"time"
)

// Document is one cached upstream answer. A Document is immutable once
// built: Body and every field are shared, without copies, by L1, the flight
// and every caller that streams it. Callers must not modify it.
type Document struct {
	Key      string // cache key
	URL      string // canonical url fetched
	Upstream string // upstream name
	Tenant   string // tenant whose namespace a custom key is cached in; "" the default, and for every url id
	// Scope is the credential scope and request variant the document
	// answers ("s/<scope id>", "v/<variant>", both, or "" for a public
	// request without forwarded headers): part of its cache id (see ID).
	Scope string
	// Header holds the upstream's end-to-end response headers (see
	// KeepHeaders), sorted by name.
	Header       []Header
	StatusCode   int
	ContentType  string
	ETag         string
	LastModified string
	FetchedAt    time.Time // when the upstream answered (or last revalidated)
	FreshUntil   time.Time // served as fresh until then
	StaleUntil   time.Time // usable stale until then, as Revalidation allows; dropped after
	Revalidation Revalidation
	// WhileRevalidateUntil and IfErrorUntil, when set, end the windows
	// in which d is served stale while it is revalidated, and instead of
	// an upstream error, earlier than StaleUntil: the upstream's
	// stale-while-revalidate=N and stale-if-error=N (RFC 5861).
	WhileRevalidateUntil time.Time
	IfErrorUntil         time.Time
	Body                 []byte
}

// Fresh reports whether d is fresh at now.
func (d *Document) Fresh(now time.Time) bool { return now.Before(d.FreshUntil) }

// StaleOnArrival reports whether d was never fresh (no-cache, max-age=0):
// each use after the flight that fetched it revalidates it.
func (d *Document) StaleOnArrival() bool { return !d.FreshUntil.After(d.FetchedAt) }

// Usable reports whether d may still be used at now: served fresh, or
// stale as Revalidation allows (see ServeStaleWhileRevalidate and
// ServeStaleIfError), or revalidated with a conditional request.
func (d *Document) Usable(now time.Time) bool { return now.Before(d.StaleUntil) }

// ServeStaleWhileRevalidate reports whether d may be served at now while
// a newer copy is fetched: it is fresh, or its Cache-Control allows
// serving it stale (RevalidateInBackground) and its window has not ended.
func (d *Document) ServeStaleWhileRevalidate(now time.Time) bool {
	return d.Fresh(now) || (d.Revalidation == RevalidateInBackground && d.before(now, d.WhileRevalidateUntil))
}

// ServeStaleIfError reports whether d may be served at now instead of an
// upstream error: it is fresh, or its Cache-Control allows serving it
// stale (anything but RevalidateStrictly) and its window has not ended.
func (d *Document) ServeStaleIfError(now time.Time) bool {
	return d.Fresh(now) || (d.Revalidation != RevalidateStrictly && d.before(now, d.IfErrorUntil))
}

// before reports whether now is before until, or before StaleUntil when
// until is not set.
func (d *Document) before(now, until time.Time) bool {
	if until.IsZero() || until.After(d.StaleUntil) {
		until = d.StaleUntil
	}
	return now.Before(until)
}

// Revalidation is what the upstream's Cache-Control allows of a Document
// once it is stale: past FreshUntil, before StaleUntil.
type Revalidation uint8

const (
	// RevalidateInBackground: a stale copy is served at once while it is
	// revalidated (stale-while-revalidate), and instead of an upstream
	// error (stale-if-error). The default.
	RevalidateInBackground Revalidation = iota
	// RevalidateBeforeUse (no-cache, max-age=0, s-maxage=0): a stale copy
	// is revalidated before it is served, and served stale only instead of
	// an upstream error.
	RevalidateBeforeUse
	// RevalidateStrictly (must-revalidate, proxy-revalidate): a stale copy
	// is never served; it is kept only to be revalidated with a
	// conditional request.
	RevalidateStrictly
)

func (r Revalidation) String() string {
	switch r {
	case RevalidateInBackground:
		return "in-background"
	case RevalidateBeforeUse:
		return "before-use"
	case RevalidateStrictly:
		return "strictly"
	}
	return "Revalidation(" + strconv.Itoa(int(r)) + ")"
}

// Age is how long ago the upstream answered.
func (d *Document) Age(now time.Time) time.Duration {
	if a := now.Sub(d.FetchedAt); a > 0 {
		return a
	}
	return 0
}

// Version is the encoding's version. Version 2 added Revalidation,
// version 3 Tenant, version 4 WhileRevalidateUntil and IfErrorUntil,
// version 5 Scope and Header;
// copies of older versions, cached by an older coordd, still decode (as
// RevalidateInBackground, the default tenant, no RFC 5861 windows).
const Version = 5

// ErrBadEncoding reports bytes that Decode cannot read as a Document.
var ErrBadEncoding = errors.New("document: bad encoding")

// Encode serialises d for L1 and L2: a version byte, length-prefixed
// strings, varint integers and times, Revalidation, Tenant (length-prefixed),
// the RFC 5861 windows if either is set (version 4; else version 3), Scope
// and Header if either is set (version 5, windows always), then the body
// as the rest. Hand-rolled rather than JSON or gob so that the body is neither
// base64-encoded nor copied more than once.
func (d *Document) Encode() []byte {
	n := 1 + 6*binary.MaxVarintLen64 + 5*binary.MaxVarintLen64 + len(d.Key) + len(d.URL) + len(d.Upstream) +
		len(d.ContentType) + len(d.ETag) + len(d.LastModified) + len(d.Tenant) + len(d.Body) + 8*binary.MaxVarintLen64
	for _, h := range d.Header {
		n += 2*binary.MaxVarintLen64 + len(h.Name) + len(h.Value)
	}
	n += binary.MaxVarintLen64 + len(d.Scope)
	version := byte(Version)
	v5 := d.Scope != "" || len(d.Header) > 0
	windows := v5 || !d.WhileRevalidateUntil.IsZero() || !d.IfErrorUntil.IsZero()
	switch {
	case !windows:
		version = 3 // what a coordd of two versions ago reads, during a rolling upgrade
	case !v5:
		version = 4
	}
	b := make([]byte, 0, n)
	b = append(b, version)
	for _, s := range []string{d.Key, d.URL, d.Upstream, d.ContentType, d.ETag, d.LastModified} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = binary.AppendVarint(b, int64(d.StatusCode))
	b = binary.AppendVarint(b, d.FetchedAt.UnixNano())
	b = binary.AppendVarint(b, d.FreshUntil.UnixNano())
	b = binary.AppendVarint(b, d.StaleUntil.UnixNano())
	b = binary.AppendUvarint(b, uint64(d.Revalidation))
	b = binary.AppendUvarint(b, uint64(len(d.Tenant)))
	b = append(b, d.Tenant...)
	if windows {
		for _, t := range []time.Time{d.WhileRevalidateUntil, d.IfErrorUntil} {
			var ns int64 // 0: not set
			if !t.IsZero() {
				ns = t.UnixNano()
			}
			b = binary.AppendVarint(b, ns)
		}
	}
	if v5 {
		b = binary.AppendUvarint(b, uint64(len(d.Scope)))
		b = append(b, d.Scope...)
		b = binary.AppendUvarint(b, uint64(len(d.Header)))
		for _, h := range d.Header {
			for _, s := range []string{h.Name, h.Value} {
				b = binary.AppendUvarint(b, uint64(len(s)))
				b = append(b, s...)
			}
		}
	}
	return append(b, d.Body...)
}

// Decode parses b. The returned Document's Body aliases b, so b must
// not be modified afterwards.
func Decode(b []byte) (*Document, error) {
	if len(b) == 0 || b[0] < 1 || b[0] > Version {
		return nil, ErrBadEncoding
	}
	version := b[0]
	b = b[1:]
	var fields [6]string
	for i := range fields {
		n, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < n {
			return nil, ErrBadEncoding
		}
		fields[i] = string(b[k : k+int(n)])
		b = b[k+int(n):]
	}
	var ints [4]int64
	for i := range ints {
		v, k := binary.Varint(b)
		if k <= 0 {
			return nil, ErrBadEncoding
		}
		ints[i] = v
		b = b[k:]
	}
	rv := RevalidateInBackground
	if version >= 2 {
		v, k := binary.Uvarint(b)
		if k <= 0 || v > uint64(RevalidateStrictly) {
			return nil, ErrBadEncoding
		}
		rv = Revalidation(v)
		b = b[k:]
	}
	var tenant string
	if version >= 3 {
		n, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < n {
			return nil, ErrBadEncoding
		}
		tenant = string(b[k : k+int(n)])
		b = b[k+int(n):]
	}
	var windows [2]time.Time
	if version >= 4 {
		for i := range windows {
			v, k := binary.Varint(b)
			if k <= 0 {
				return nil, ErrBadEncoding
			}
			if v != 0 {
				windows[i] = time.Unix(0, v)
			}
			b = b[k:]
		}
	}
	var scope string
	var header []Header
	if version >= 5 {
		str := func() (string, bool) {
			n, k := binary.Uvarint(b)
			if k <= 0 || uint64(len(b)-k) < n {
				return "", false
			}
			s := string(b[k : k+int(n)])
			b = b[k+int(n):]
			return s, true
		}
		var ok bool
		if scope, ok = str(); !ok {
			return nil, ErrBadEncoding
		}
		n, k := binary.Uvarint(b)
		if k <= 0 || n > maxHeaders {
			return nil, ErrBadEncoding
		}
		b = b[k:]
		header = make([]Header, n)
		for i := range header {
			name, ok1 := str()
			value, ok2 := str()
			if !ok1 || !ok2 {
				return nil, ErrBadEncoding
			}
			header[i] = Header{name, value}
		}
	}
	d := &Document{
		Scope: scope, Header: header,
		WhileRevalidateUntil: windows[0], IfErrorUntil: windows[1],
		Key: fields[0], URL: fields[1], Upstream: fields[2], Tenant: tenant,
		ContentType: fields[3], ETag: fields[4], LastModified: fields[5],
		StatusCode:   int(ints[0]),
		FetchedAt:    time.Unix(0, ints[1]),
		FreshUntil:   time.Unix(0, ints[2]),
		StaleUntil:   time.Unix(0, ints[3]),
		Revalidation: rv,
		Body:         b[:len(b):len(b)],
	}
	d.DropBadHeaders() // a copy an older coordd cached unchecked
	return d, nil
}
