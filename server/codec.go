package server

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/coordd/coordd/coordinator"
)

// ChunkSize is the largest body piece per chunk message: far under gRPC's
// default 4 MiB message limit.
const ChunkSize = 64 << 10

// frame is a GetOrFetchResponse{chunk: {data}} already in wire form: a few
// bytes of proto framing followed by a slice of the document's body,
// shared, never copied. One frame is built per chunk per document and sent
// to every stream.
type frame struct {
	bufs mem.BufferSlice
}

// codec is the proto codec, except that a *frame passes through as the
// bytes it already holds, and a request that does not decode is marked
// instead of failing (see Unmarshal). The first is how a chunk is encoded
// once per document instead of once per caller (grpc.PreparedMsg would
// need a stream to encode against and would copy the body).
type codec struct {
	encoding.CodecV2
}

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(*frame); ok {
		return f.bufs, nil
	}
	return c.CodecV2.Marshal(v)
}

// Unmarshal decodes data into v. If data does not decode (bad wire format,
// invalid UTF-8 in a string, nesting past the recursion limit), v is reset
// and marked undecodable, and Unmarshal returns nil: the interceptors of
// NewGRPC then refuse the call with INVALID_ARGUMENT before any handler
// sees v. Returning the error is no use: grpc-go (recv in rpc_util.go)
// wraps any codec error in codes.Internal, and serverStream.RecvMsg writes
// that status to the client at once, before an interceptor could change it.
func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	m, ok := v.(proto.Message)
	if err == nil || !ok {
		return err
	}
	proto.Reset(m)
	markUndecodable(m, err)
	return nil
}

// codecOption makes a grpc.Server use codec.
func codecOption() grpc.ServerOption {
	return grpc.ForceServerCodecV2(codec{encoding.GetCodecV2("proto")})
}

// Field numbers of the wire form built by frames; a test checks them
// against the generated code.
const (
	responseChunkField = 3 // GetOrFetchResponse.chunk
	chunkDataField     = 1 // Chunk.data
)

// buildFrames cuts d's body into chunk frames; frames (framecache.go)
// calls it once per Document.
func buildFrames(d *coordinator.Document) []*frame {
	body := d.Body
	n := (len(body) + ChunkSize - 1) / ChunkSize
	fs := make([]*frame, n)
	// All the framing prefixes of a document share one allocation.
	prefixes := make([]byte, 0, n*2*(1+protowire.SizeVarint(ChunkSize+8)))
	for i := range fs {
		data := body[i*ChunkSize : min(len(body), (i+1)*ChunkSize)]
		start := len(prefixes)
		inner := protowire.SizeTag(chunkDataField) + protowire.SizeBytes(len(data))
		prefixes = protowire.AppendTag(prefixes, responseChunkField, protowire.BytesType)
		prefixes = protowire.AppendVarint(prefixes, uint64(inner))
		prefixes = protowire.AppendTag(prefixes, chunkDataField, protowire.BytesType)
		prefixes = protowire.AppendVarint(prefixes, uint64(len(data)))
		fs[i] = &frame{bufs: mem.BufferSlice{
			mem.SliceBuffer(prefixes[start:len(prefixes):len(prefixes)]),
			mem.SliceBuffer(data),
		}}
	}
	return fs
}

// mustFrame is m as a frame, encoded now: for messages that never change.
func mustFrame(m proto.Message) *frame {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return &frame{bufs: mem.BufferSlice{mem.SliceBuffer(b)}}
}
