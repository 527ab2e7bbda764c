package coordd

import (
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
)

// getOnceGeneric is getOnce as it was before recvCodec, the baseline of
// the benchmarks.
func (c *Client) getOnceGeneric(ctx context.Context, req *coorddv1.GetOrFetchRequest) (*Document, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.api.GetOrFetch(ctx, req)
	if err != nil {
		return nil, err
	}
	return receiveGeneric(st.Recv)
}

// receiveGeneric is the receive loop as it was before recvCodec: the proto
// codec decodes every message, so each chunk's data is copied into a
// contiguous buffer, into a new []byte, then onto the body.
func receiveGeneric(recv func() (*coorddv1.GetOrFetchResponse, error)) (*Document, error) {
	d := &Document{}
	for {
		m, err := recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		switch ev := m.GetEvent().(type) {
		case *coorddv1.GetOrFetchResponse_Progress:
			d.Progress = append(d.Progress, ev.Progress)
		case *coorddv1.GetOrFetchResponse_Metadata:
			d.Metadata = ev.Metadata
			d.Body = make([]byte, 0, min(max(ev.Metadata.GetSize(), 0), maxPrealloc))
		case *coorddv1.GetOrFetchResponse_Chunk:
			d.Body = append(d.Body, ev.Chunk.GetData()...)
		}
	}
	if d.Metadata == nil || int64(len(d.Body)) != d.Metadata.GetSize() {
		return nil, badStream("baseline: bad body")
	}
	return d, nil
}

// preEncoded is a message already in wire form; passCodec sends it as it
// is.
type preEncoded []byte

type passCodec struct{ encoding.CodecV2 }

func (c passCodec) Marshal(v any) (mem.BufferSlice, error) {
	if p, ok := v.(preEncoded); ok {
		return mem.BufferSlice{mem.SliceBuffer(p)}, nil
	}
	return c.CodecV2.Marshal(v)
}

// docServer streams one document, pre-encoded, so that the server's share
// of each op is small and what differs between runs is the client.
type docServer struct {
	coorddv1.UnimplementedCoordinatorServiceServer
	msgs []preEncoded
}

// encodeDoc returns the messages of a document of size bytes as coordd's
// server encodes them: a progress event, the metadata, then 64 KiB chunks.
func encodeDoc(size int) []preEncoded {
	const chunkSize = 64 << 10
	enc := func(m proto.Message) preEncoded {
		b, err := proto.Marshal(m)
		if err != nil {
			panic(err)
		}
		return b
	}
	msgs := []preEncoded{
		enc(&coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Progress{Progress: &coorddv1.Progress{Role: coorddv1.Role_ROLE_HIT}}}),
		enc(&coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Metadata{Metadata: &coorddv1.Metadata{StatusCode: 200, Size: int64(size), Source: coorddv1.Source_SOURCE_L1}}}),
	}
	body := make([]byte, size)
	for i := range body {
		body[i] = byte(i)
	}
	for i := 0; i < size; i += chunkSize {
		data := body[i:min(size, i+chunkSize)]
		var b []byte
		b = protowire.AppendTag(b, responseChunkField, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(protowire.SizeTag(chunkDataField)+protowire.SizeBytes(len(data))))
		b = protowire.AppendTag(b, chunkDataField, protowire.BytesType)
		b = protowire.AppendBytes(b, data)
		msgs = append(msgs, b)
	}
	return msgs
}

func (s *docServer) GetOrFetch(_ *coorddv1.GetOrFetchRequest, st grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse]) error {
	for _, m := range s.msgs {
		if err := st.SendMsg(m); err != nil {
			return err
		}
	}
	return nil
}

// benchSizes are the body sizes benchmarked.
var benchSizes = []struct {
	name string
	size int
}{{"100KiB", 100 << 10}, {"1MiB", 1 << 20}}

// benchMode is one way to receive a document of size bytes.
type benchMode struct {
	name string
	get  func() (*Document, error)
}

// runModes runs each mode as a sub-benchmark, with MB/s and allocs/op,
// and reports for every mode after the first its speed and allocations
// against the first mode's latest run: x-speed 2 is twice as fast,
// x-allocs 0.5 half the allocations. On a busy machine, compare the
// medians of -count runs rather than one ratio.
func runModes(b *testing.B, size int, modes ...benchMode) {
	var base struct{ nsPerOp, allocsPerOp float64 }
	for i, mode := range modes {
		b.Run(mode.name, func(b *testing.B) {
			if _, err := mode.get(); err != nil { // connect, warm up
				b.Fatal(err)
			}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			before := mallocs()
			for b.Loop() {
				d, err := mode.get()
				if err != nil {
					b.Fatal(err)
				}
				if len(d.Body) != size {
					b.Fatalf("body of %d bytes; want %d", len(d.Body), size)
				}
			}
			nsPerOp := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			allocsPerOp := float64(mallocs()-before) / float64(b.N)
			if i == 0 {
				base.nsPerOp, base.allocsPerOp = nsPerOp, allocsPerOp
			} else if base.nsPerOp > 0 {
				b.ReportMetric(base.nsPerOp/nsPerOp, "x-speed")
				b.ReportMetric(allocsPerOp/base.allocsPerOp, "x-allocs")
			}
		})
	}
}

// BenchmarkReceive measures a Client receiving one document over loopback
// from a gRPC server that streams it pre-encoded, as coordd does:
// proto-generic is the receive loop before recvCodec, zero-copy the one
// with it. Client and server share the process, so allocs/op include the
// server's (and both sides' stream setup).
//
//	go test -run '^$' -bench Receive -benchmem ./clients/go/
func BenchmarkReceive(b *testing.B) {
	for _, bs := range benchSizes {
		b.Run(bs.name, func(b *testing.B) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			g := grpc.NewServer(grpc.ForceServerCodecV2(passCodec{encoding.GetCodecV2("proto")}))
			coorddv1.RegisterCoordinatorServiceServer(g, &docServer{msgs: encodeDoc(bs.size)})
			hs := health.NewServer()
			hs.SetServingStatus(coorddv1.CoordinatorService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
			healthpb.RegisterHealthServer(g, hs)
			go func() { _ = g.Serve(lis) }()
			defer g.Stop()
			c, err := Dial(lis.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			ctx := context.Background()
			req := &coorddv1.GetOrFetchRequest{Url: "https://docs.example/doc"}
			runModes(b, bs.size,
				benchMode{"proto-generic", func() (*Document, error) { return c.getOnceGeneric(ctx, req) }},
				benchMode{"zero-copy", func() (*Document, error) { return c.getOnce(ctx, req, nil) }},
			)
		})
	}
}

// BenchmarkDecode measures the client's decoding alone, without gRPC's
// transport: the messages of one document, each cut into 16 KiB buffers
// as HTTP/2 frames deliver them, are decoded by the proto codec and the
// loop before recvCodec (proto-generic), or by recvCodec and receive
// (zero-copy).
//
//	go test -run '^$' -bench Decode -benchmem ./clients/go/
func BenchmarkDecode(b *testing.B) {
	const frameSize = 16 << 10 // HTTP/2's default SETTINGS_MAX_FRAME_SIZE
	for _, bs := range benchSizes {
		b.Run(bs.name, func(b *testing.B) {
			var msgs []mem.BufferSlice
			for _, m := range encodeDoc(bs.size) {
				var at []int
				for i := frameSize; i < len(m); i += frameSize {
					at = append(at, i)
				}
				msgs = append(msgs, split(m, at...))
			}
			// next returns a recvMsg that decodes msgs in turn with codec.
			next := func(codec encoding.CodecV2) func(any) error {
				i := 0
				return func(v any) error {
					if i == len(msgs) {
						return io.EOF
					}
					i++
					return codec.Unmarshal(msgs[i-1], v)
				}
			}
			protoCodec := encoding.GetCodecV2("proto")
			runModes(b, bs.size,
				benchMode{"proto-generic", func() (*Document, error) {
					recvMsg := next(protoCodec)
					return receiveGeneric(func() (*coorddv1.GetOrFetchResponse, error) {
						m := new(coorddv1.GetOrFetchResponse)
						return m, recvMsg(m)
					})
				}},
				benchMode{"zero-copy", func() (*Document, error) {
					return receive(next(recvCodec{protoCodec}), nil, 0)
				}},
			)
		})
	}
}

// mallocs is the count of heap objects allocated so far.
func mallocs() uint64 {
	var s runtime.MemStats
	runtime.ReadMemStats(&s)
	return s.Mallocs
}
