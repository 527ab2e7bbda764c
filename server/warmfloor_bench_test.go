package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	coordd "github.com/coordd/coordd/clients/go"
	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/wirefloor"
)

// BenchmarkWarmHitFloor is a warm hit through coordd's whole server stack
// beside the floor: a bare gRPC server sending, from memory, the very
// messages coordd sends for that hit (captured from coordd once), with a
// request id header as coordd sends. Both are read by the Go client, in
// one process: cpu-ns/op is the process's CPU per document, client
// included, and coordd's less the floor's is what coordd's own work costs.
//
//	go test -run '^$' -bench 'WarmHitFloor' -count 8 ./server | benchstat -col /server -
func BenchmarkWarmHitFloor(b *testing.B) {
	up := fakeupstream.New(b)
	cfg := coordinator.Config{Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: up.URL()}}}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))
	in := fleettest.Start(b, fleettest.Options{Config: cfg})
	ctx := context.Background()
	for _, size := range []int{1 << 10, 100 << 10} {
		path := fmt.Sprintf("/warmfloor/%d", size)
		up.Set(path, fakeupstream.Behavior{Size: size})
		u := up.URL() + path
		stub := in.Dial(b)
		if _, err := fleettest.Get(ctx, stub, &coorddv1.GetOrFetchRequest{Url: u}); err != nil { // now a hit
			b.Fatal(err)
		}
		hit, err := wirefloor.CaptureHit(ctx, stub, u)
		if err != nil {
			b.Fatal(err)
		}
		floor := startFloor(b, hit)
		for _, srv := range []struct{ name, addr string }{{"coordd", in.Addr}, {"floor", floor}} {
			c, err := coordd.Dial(srv.addr)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = c.Close() })
			for _, callers := range []int{1, 8} {
				b.Run(fmt.Sprintf("size=%dKiB/callers=%d/server=%s", size>>10, callers, srv.name), func(b *testing.B) {
					if d, err := c.Get(ctx, u); err != nil || len(d.Body) != size {
						b.Fatalf("%s: %v", srv.name, err)
					}
					b.ReportAllocs()
					cpu0 := cpuTime()
					b.ResetTimer()
					if callers == 1 {
						for range b.N {
							if _, err := c.Get(ctx, u); err != nil {
								b.Fatal(err)
							}
						}
					} else {
						b.SetParallelism(callers / runtime.GOMAXPROCS(0))
						b.RunParallel(func(pb *testing.PB) {
							for pb.Next() {
								if _, err := c.Get(ctx, u); err != nil {
									b.Error(err)
									return
								}
							}
						})
					}
					b.StopTimer()
					b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
				})
			}
		}
	}
}

// startFloor serves hit, as is, for every GetOrFetch, on a bare gRPC
// server with no interceptors, and returns its address.
func startFloor(b *testing.B, hit [][]byte) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	g := grpc.NewServer(grpc.MaxConcurrentStreams(10000), wirefloor.ServerOption())
	coorddv1.RegisterCoordinatorServiceServer(g, floorServer{hit: hit})
	hs := health.NewServer() // the Go client checks it
	healthpb.RegisterHealthServer(g, hs)
	hs.SetServingStatus(coorddv1.CoordinatorService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	go func() { _ = g.Serve(lis) }()
	b.Cleanup(g.Stop)
	return lis.Addr().String()
}

type floorServer struct {
	coorddv1.UnimplementedCoordinatorServiceServer
	hit [][]byte
}

func (s floorServer) GetOrFetch(_ *coorddv1.GetOrFetchRequest, stream grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse]) error {
	return wirefloor.SendHit(stream, s.hit)
}
