package document

import (
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
