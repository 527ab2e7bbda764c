package server

import (
	"time"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
)

// A metadata message is mostly the same for every caller of a Document:
// only source, stale, age, ttl and private differ per call. metaWire holds
// the rest in wire form, built once per Document (framecache.go), and
// metadataFrame appends the per-call fields around it, in field-number
// order: the bytes are exactly what proto.Marshal makes of metadataPB's
// message (a test checks it), for a few appends instead of a marshal of
// the whole message and the five allocations of building it.
// Hand-rolled because neither grpc.PreparedMsg nor the proto codec can
// encode part of a message once and the rest per call.

// Field numbers of Metadata and of google.protobuf.Duration, written by
// metadataFrame; a test checks them against the generated code.
const (
	responseMetadataField = 2 // GetOrFetchResponse.metadata
	metaSourceField       = 1
	metaStaleField        = 2
	metaAgeField          = 5
	metaTTLField          = 11
	metaPrivateField      = 13
	metaCacheControlField = 14
	durationSecondsField  = 1
	durationNanosField    = 2
)

// metaWire is a Document's metadata fields that do not change per call,
// in wire form: status_code and content_type (fields 3–4); size, key,
// upstream, etag and last_modified (6–10); headers (12).
type metaWire struct {
	ok         bool // false: a field did not encode (invalid UTF-8); callers marshal the message and fail as that does
	mid1, mid2 []byte
	tail       []byte
	// cache_control (14), for a public copy and for a private one.
	ccPublic, ccPrivate []byte
}

// buildMetaWire encodes d's per-Document metadata fields; hdrs are d's
// headers on the wire (metaHeaders).
func buildMetaWire(d *coordinator.Document, hdrs []*coorddv1.Header) metaWire {
	var w metaWire
	var err1, err2, err3 error
	w.mid1, err1 = proto.Marshal(&coorddv1.Metadata{StatusCode: int32(d.StatusCode), ContentType: d.ContentType})
	w.mid2, err2 = proto.Marshal(&coorddv1.Metadata{Size: int64(len(d.Body)), Key: d.Key, Upstream: d.Upstream, Etag: d.ETag, LastModified: d.LastModified})
	w.tail, err3 = proto.Marshal(&coorddv1.Metadata{Headers: hdrs})
	w.ccPublic = protowire.AppendString(protowire.AppendTag(nil, metaCacheControlField, protowire.BytesType), cacheControl(d, false))
	w.ccPrivate = protowire.AppendString(protowire.AppendTag(nil, metaCacheControlField, protowire.BytesType), cacheControl(d, true))
	w.ok = err1 == nil && err2 == nil && err3 == nil
	return w
}

// metadataPB is the metadata message of res for a call at now.
func metadataPB(res *coordinator.Result, private bool, now time.Time) *coorddv1.GetOrFetchResponse {
	d := res.Doc
	return &coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Metadata{Metadata: &coorddv1.Metadata{
		Source:       sourcePB(res.Source),
		Stale:        res.Stale,
		StatusCode:   int32(d.StatusCode),
		ContentType:  d.ContentType,
		Age:          durationpb.New(d.Age(now)),
		Size:         int64(len(d.Body)),
		Key:          d.Key,
		Upstream:     d.Upstream,
		Etag:         d.ETag,
		LastModified: d.LastModified,
		Ttl:          durationpb.New(max(0, d.FreshUntil.Sub(now))),
		Headers:      metaHeaders(d),
		Private:      private,
		CacheControl: cacheControl(d, private),
	}}}
}

// metadataMsg is metadataPB's message, for SendMsg: in wire form when
// res.Doc's metaWire is, else the message itself.
func metadataMsg(res *coordinator.Result, private bool, now time.Time) any {
	w := &framed.entry(res.Doc).meta
	if !w.ok {
		return metadataPB(res, private, now)
	}
	d := res.Doc
	src := uint64(sourcePB(res.Source))
	age, ttl := d.Age(now), max(0, d.FreshUntil.Sub(now))
	n := len(w.mid1) + len(w.mid2) + len(w.tail) + durationSize(metaAgeField, age) + durationSize(metaTTLField, ttl)
	if src != 0 {
		n += protowire.SizeTag(metaSourceField) + protowire.SizeVarint(src)
	}
	if res.Stale {
		n += protowire.SizeTag(metaStaleField) + 1
	}
	cc := w.ccPublic
	if private {
		n += protowire.SizeTag(metaPrivateField) + 1
		cc = w.ccPrivate
	}
	n += len(cc)
	b := make([]byte, 0, protowire.SizeTag(responseMetadataField)+protowire.SizeBytes(n))
	b = protowire.AppendTag(b, responseMetadataField, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(n))
	if src != 0 {
		b = protowire.AppendTag(b, metaSourceField, protowire.VarintType)
		b = protowire.AppendVarint(b, src)
	}
	if res.Stale {
		b = protowire.AppendTag(b, metaStaleField, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
	}
	b = append(b, w.mid1...)
	b = appendDuration(b, metaAgeField, age)
	b = append(b, w.mid2...)
	b = appendDuration(b, metaTTLField, ttl)
	b = append(b, w.tail...)
	if private {
		b = protowire.AppendTag(b, metaPrivateField, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
	}
	b = append(b, cc...)
	return &frame{bufs: mem.BufferSlice{mem.SliceBuffer(b)}}
}

// durationParts splits d as durationpb.New does.
func durationParts(d time.Duration) (secs int64, nanos int32) {
	n := d.Nanoseconds()
	secs = n / 1e9
	return secs, int32(n - secs*1e9)
}

// durationBodySize is the size of d as a google.protobuf.Duration message.
func durationBodySize(d time.Duration) int {
	secs, nanos := durationParts(d)
	n := 0
	if secs != 0 {
		n += protowire.SizeTag(durationSecondsField) + protowire.SizeVarint(uint64(secs))
	}
	if nanos != 0 {
		n += protowire.SizeTag(durationNanosField) + protowire.SizeVarint(uint64(int64(nanos)))
	}
	return n
}

// durationSize is the size of field num holding d.
func durationSize(num protowire.Number, d time.Duration) int {
	return protowire.SizeTag(num) + protowire.SizeBytes(durationBodySize(d))
}

// appendDuration appends field num holding d (always present, as a
// non-nil message field is).
func appendDuration(b []byte, num protowire.Number, d time.Duration) []byte {
	secs, nanos := durationParts(d)
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(durationBodySize(d)))
	if secs != 0 {
		b = protowire.AppendTag(b, durationSecondsField, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(secs))
	}
	if nanos != 0 {
		b = protowire.AppendTag(b, durationNanosField, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(int64(nanos)))
	}
	return b
}
