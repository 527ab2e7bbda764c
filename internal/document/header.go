package document

import (
	"net/http"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// maxHeaderBytes bounds each upstream header value a Document keeps
// (Content-Type, ETag, Last-Modified). Every caller gets them in one
// metadata message, which must stay far under gRPC's default 4 MiB
// receive limit.
const maxHeaderBytes = 1 << 10

// DropBadHeaders empties each of d's upstream header values (ContentType,
// ETag, LastModified) that cannot be served: longer than maxHeaderBytes,
// not valid UTF-8 (protobuf string fields must be), or holding a control
// character other than horizontal tab (HTTP's whitespace). A value is
// dropped whole, never repaired: a repaired ETag sent back in If-None-Match
// would not be the upstream's, and a repaired Content-Type or
// Last-Modified would be a guess. It is called while d is being built, by
// the coordinator and Decode (copies cached before it existed).
func (d *Document) DropBadHeaders() {
	for _, v := range []*string{&d.ContentType, &d.ETag, &d.LastModified} {
		if !servableHeader(*v) {
			*v = ""
		}
	}
	if !slices.ContainsFunc(d.Header, badHeader) {
		return
	}
	d.Header = slices.DeleteFunc(slices.Clone(d.Header), badHeader)
}

// servableHeader reports whether v may be kept and served as a header
// value; see DropBadHeaders.
func servableHeader(v string) bool {
	if len(v) > maxHeaderBytes || !utf8.ValidString(v) {
		return false
	}
	for _, r := range v {
		if unicode.IsControl(r) && r != '\t' {
			return false
		}
	}
	return true
}

// Header is one response header field a Document keeps.
type Header struct {
	Name  string // canonical (Content-Type)
	Value string
}

// Bounds on the response headers a Document keeps: every caller gets them
// in its metadata message.
const (
	maxHeaders          = 64       // fields kept; the rest dropped
	maxHeaderTotalBytes = 16 << 10 // names and values together
)

// dropped reports whether a response header is never kept: hop-by-hop
// fields (RFC 9110 7.6.1), the body's framing and coding (coordd serves
// the decoded body with its own length), Age (coordd says how old its copy
// is) and cookies, which belong to one client, never to a shared copy.
func dropped(name string) bool {
	switch name {
	case "Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization",
		"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length", "Content-Encoding",
		"Age", "Set-Cookie", "Set-Cookie2", "Alt-Svc":
		return true
	}
	return false
}

// KeepHeaders returns the end-to-end fields of a response header h that a
// Document keeps, sorted by name, values in the upstream's order: not
// dropped, not named by Connection, servable (see DropBadHeaders), at most
// maxHeaders fields and maxHeaderTotalBytes.
func KeepHeaders(h http.Header) []Header {
	if len(h) == 0 {
		return nil
	}
	conn := map[string]bool{}
	for _, v := range h.Values("Connection") {
		for f := range strings.SplitSeq(v, ",") {
			conn[http.CanonicalHeaderKey(strings.TrimSpace(f))] = true
		}
	}
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	slices.Sort(names)
	var out []Header
	total := 0
	for _, name := range names {
		canon := http.CanonicalHeaderKey(name)
		if dropped(canon) || conn[canon] || !servableHeader(canon) {
			continue
		}
		for _, v := range h[name] {
			if !servableHeader(v) || len(out) == maxHeaders || total+len(canon)+len(v) > maxHeaderTotalBytes {
				continue
			}
			total += len(canon) + len(v)
			out = append(out, Header{canon, v})
		}
	}
	return out
}

// MergeHeaders returns old with the fields that a 304 revalidating it
// carries (kept, the fresh list) replacing old's of the same name (RFC
// 9111 4.3.4), sorted by name.
func MergeHeaders(old, fresh []Header) []Header {
	if len(fresh) == 0 {
		return old
	}
	replaced := map[string]bool{}
	for _, h := range fresh {
		replaced[h.Name] = true
	}
	out := make([]Header, 0, len(old)+len(fresh))
	for _, h := range old {
		if !replaced[h.Name] {
			out = append(out, h)
		}
	}
	out = append(out, fresh...)
	slices.SortStableFunc(out, func(a, b Header) int { return strings.Compare(a.Name, b.Name) })
	if len(out) > maxHeaders {
		out = out[:maxHeaders]
	}
	return out
}

func badHeader(h Header) bool { return !servableHeader(h.Name) || !servableHeader(h.Value) }
