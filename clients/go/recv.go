package coordd

import (
	"encoding/binary"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
)

// Field numbers of the chunk messages read in wire form; a test checks them
// against the generated code.
const (
	responseChunkField = 3 // GetOrFetchResponse.chunk
	chunkDataField     = 1 // Chunk.data
)

// chunkTag is the first byte of a GetOrFetchResponse whose first field is
// its chunk.
var chunkTag = int(protowire.EncodeTag(responseChunkField, protowire.BytesType))

// response is what Get's receive loop passes to RecvMsg on a GetOrFetch
// stream: exactly one of its fields is set by recvCodec.
type response struct {
	// raw is a message that starts with a chunk, still in wire form. The
	// receiver owns a reference to it and must Free it.
	raw mem.BufferSlice
	// msg is any other message, decoded.
	msg *coorddv1.GetOrFetchResponse
}

// recvCodec is the proto codec, except that a GetOrFetch message carrying a
// chunk is handed to the receive loop in wire form, so that its data is
// copied once, from gRPC's receive buffers into the document's body. The
// proto codec would copy it three times: into one contiguous buffer, into
// a new []byte for Chunk.data, then onto the body. Hand-rolled because
// neither gRPC nor protobuf-go decode a bytes field into a caller's buffer.
type recvCodec struct {
	encoding.CodecV2
}

// recvCodecOption makes a call use recvCodec.
var recvCodecOption = grpc.ForceCodecV2(recvCodec{encoding.GetCodecV2("proto")})

func (c recvCodec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*response)
	if !ok {
		return c.CodecV2.Unmarshal(data, v)
	}
	if firstByte(data) == chunkTag {
		data.Ref() // gRPC frees its own reference when Unmarshal returns
		r.raw = data
		return nil
	}
	r.msg = new(coorddv1.GetOrFetchResponse)
	return c.CodecV2.Unmarshal(data, r.msg)
}

// firstByte returns the first byte of data, or -1 if data is empty.
func firstByte(data mem.BufferSlice) int {
	for _, b := range data {
		if d := b.ReadOnlyData(); len(d) > 0 {
			return int(d[0])
		}
	}
	return -1
}

// chunkData locates Chunk.data in raw, a GetOrFetchResponse in wire form,
// if raw has the shape coordd sends: the chunk field alone, holding the
// data field alone. It returns data's offset and length in raw, or ok
// false for any other shape (unknown fields, a field repeated, a chunk
// without data), which the caller decodes as protobuf instead.
func chunkData(raw mem.BufferSlice) (off, n int, ok bool) {
	// The framing is two tags and two varints.
	var head [2 * (1 + binary.MaxVarintLen64)]byte
	h := head[:prefix(head[:], raw)]
	total := raw.Len()

	off, outer := lenField(h, 0, responseChunkField)
	if off < 0 || outer != uint64(total-off) {
		return 0, 0, false
	}
	off, inner := lenField(h, off, chunkDataField)
	if off < 0 || inner != uint64(total-off) {
		return 0, 0, false
	}
	return off, int(inner), true
}

// lenField reads, at h[off:], the tag of a length-delimited field num and
// its length; it returns the offset past them and the length, or -1 if
// they are not there.
func lenField(h []byte, off int, num protowire.Number) (int, uint64) {
	n, typ, l := protowire.ConsumeTag(h[off:])
	if l < 0 || n != num || typ != protowire.BytesType {
		return -1, 0
	}
	off += l
	v, l := protowire.ConsumeVarint(h[off:])
	if l < 0 {
		return -1, 0
	}
	return off + l, v
}

// prefix copies the first bytes of data into dst, as many as fit, and
// returns how many it copied.
func prefix(dst []byte, data mem.BufferSlice) int {
	n := 0
	for _, b := range data {
		if n == len(dst) {
			break
		}
		n += copy(dst[n:], b.ReadOnlyData())
	}
	return n
}

// copyFrom fills dst with the bytes of data that start at offset off.
func copyFrom(dst []byte, data mem.BufferSlice, off int) {
	for _, b := range data {
		if len(dst) == 0 {
			return
		}
		d := b.ReadOnlyData()
		if off >= len(d) {
			off -= len(d)
			continue
		}
		n := copy(dst, d[off:])
		dst = dst[n:]
		off = 0
	}
}
