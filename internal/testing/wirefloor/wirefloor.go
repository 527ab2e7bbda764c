// Package wirefloor is the wire of the bare gRPC floor that coordd's
// benchmarks measure coordd against (cmd/coordbench, and server's
// BenchmarkWarmHitFloor): messages sent in the wire form they were
// encoded or captured in, and what coordd sends for a warm hit.
package wirefloor

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/requestid"
	"github.com/coordd/coordd/server"
)

// Encoded is a message already in wire form, which a server with
// ServerOption sends as it is.
type Encoded struct{ B []byte }

// codec is the proto codec, except that an *Encoded passes through.
// Hand-rolled like coordd's own (server/codec.go, unexported): gRPC has
// no public way to send pre-encoded bytes without copying them.
type codec struct{ encoding.CodecV2 }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if m, ok := v.(*Encoded); ok {
		return mem.BufferSlice{mem.SliceBuffer(m.B)}, nil
	}
	return c.CodecV2.Marshal(v)
}

// ServerOption makes a grpc.Server send an *Encoded as it is.
func ServerOption() grpc.ServerOption {
	return grpc.ForceServerCodecV2(codec{encoding.GetCodecV2("proto")})
}

// CaptureHit returns what coordd, through stub, sends for a warm hit of
// u: each message of the stream in wire form. It fails unless u is served
// from L1.
func CaptureHit(ctx context.Context, stub coorddv1.CoordinatorServiceClient, u string) ([][]byte, error) {
	st, err := stub.GetOrFetch(ctx, &coorddv1.GetOrFetchRequest{Url: u})
	if err != nil {
		return nil, err
	}
	var out [][]byte
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if md := m.GetMetadata(); md != nil && md.GetSource() != coorddv1.Source_SOURCE_L1 {
			return nil, fmt.Errorf("%s: served from %v, not L1", u, md.GetSource())
		}
		b, err := proto.Marshal(m)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
}

// SendHit sends hit (CaptureHit's) on stream, after a request id header,
// as coordd does.
func SendHit(stream grpc.ServerStream, hit [][]byte) error {
	if err := stream.SetHeader(metadata.Pairs(server.RequestIDHeader, requestid.New())); err != nil {
		return err
	}
	for _, f := range hit {
		if err := stream.SendMsg(&Encoded{f}); err != nil {
			return err
		}
	}
	return nil
}
