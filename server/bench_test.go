package server

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
)

// protoPerCaller is the baseline the fan-out path is measured against: the
// same coordinator, but each stream marshals its own chunk messages, so
// every caller pays for copying and encoding the body.
type protoPerCaller struct{ *Server }

func (s protoPerCaller) GetOrFetch(req *coorddv1.GetOrFetchRequest, stream grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse]) error {
	t, err := s.c.Resolve(req.GetUrl(), req.GetKey())
	if err != nil {
		return toStatus(err)
	}
	res, err := s.c.Get(stream.Context(), t, coordinator.GetOptions{})
	if err != nil {
		return toStatus(err)
	}
	body := res.Doc.Body
	if err := stream.Send(&coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Metadata{Metadata: &coorddv1.Metadata{Size: int64(len(body))}}}); err != nil {
		return err
	}
	for i := 0; i < len(body); i += ChunkSize {
		msg := &coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Chunk{Chunk: &coorddv1.Chunk{Data: body[i:min(len(body), i+ChunkSize)]}}}
		if err := stream.Send(msg); err != nil {
			return err
		}
	}
	return nil
}

// counted is a received message's length; countingCodec fills it.
type counted int

type countingCodec struct{}

func (countingCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, err := proto.Marshal(v.(proto.Message))
	return mem.BufferSlice{mem.SliceBuffer(b)}, err
}

func (countingCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*counted) = counted(data.Len())
	return nil
}

func (countingCodec) Name() string { return "proto" }

// BenchmarkFanOut delivers one 1 MiB document to 100 concurrent streams per
// op, over loopback, and compares the pre-encoded frames with the
// per-caller proto baseline. ns/op, B/op and allocs/op are per 100
// deliveries; the client does not decode, so the allocations are mostly
// the server's.
func BenchmarkFanOut(b *testing.B) {
	const size, streams = 1 << 20, 100
	body := make([]byte, size)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(body) }))
	defer up.Close()
	c, err := coordinator.New(coordinator.Config{Upstreams: []coordinator.Upstream{{Name: "b", BaseURL: up.URL}}}, coordinator.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	results := map[string]float64{}
	for _, mode := range []string{"frames", "proto-per-caller"} {
		b.Run(mode, func(b *testing.B) {
			s := New(c, nil)
			var impl coorddv1.CoordinatorServiceServer = s
			if mode == "proto-per-caller" {
				impl = protoPerCaller{s}
			}
			g := grpc.NewServer(codecOption())
			coorddv1.RegisterCoordinatorServiceServer(g, impl)
			lis, _ := net.Listen("tcp", "127.0.0.1:0")
			go g.Serve(lis)
			defer g.Stop()
			// The client counts bytes without decoding them, so that B/op and
			// allocs/op are dominated by the server's side of the fan-out.
			cc, _ := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithDefaultCallOptions(grpc.ForceCodecV2(countingCodec{})))
			defer cc.Close()
			desc := &grpc.StreamDesc{ServerStreams: true}
			req := &coorddv1.GetOrFetchRequest{Url: up.URL + "/doc"}
			drain := func() error {
				st, err := cc.NewStream(context.Background(), desc, coorddv1.CoordinatorService_GetOrFetch_FullMethodName)
				if err != nil {
					return err
				}
				if err := st.SendMsg(req); err != nil {
					return err
				}
				if err := st.CloseSend(); err != nil {
					return err
				}
				n := 0
				var m counted
				for {
					err := st.RecvMsg(&m)
					if err == io.EOF {
						break
					}
					if err != nil {
						return err
					}
					n += int(m)
				}
				if n < size {
					return fmt.Errorf("got %d bytes", n)
				}
				return nil
			}
			if err := drain(); err != nil { // warm L1
				b.Fatal(err)
			}
			b.SetBytes(size * streams)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				var wg sync.WaitGroup
				for range streams {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if err := drain(); err != nil {
							b.Error(err)
						}
					}()
				}
				wg.Wait()
			}
			b.StopTimer()
			results[mode] = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
		})
	}
	if f, p := results["frames"], results["proto-per-caller"]; f > 0 && p > 0 {
		fmt.Printf("fan-out of 1 MiB to 100 streams: frames %.2f ms/op, proto-per-caller %.2f ms/op: frames are %.2fx faster\n", f/1e6, p/1e6, p/f)
	}
}
