package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime/pprof"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/redistest"
	"github.com/coordd/coordd/internal/testing/wirefloor"
)

// pollInterval is how often the polling baseline's losers look again.
const pollInterval = 200 * time.Millisecond

// chunkSize is the body piece per chunk message, as coordd sends it.
const chunkSize = 64 << 10

// pollServer is the design coordd replaces, as one process of it: an
// in-process map of documents; the first caller of a missing key fetches
// it from the upstream, every other caller polls the map every 200 ms.
// Nothing is shared between processes, so every process fetches each key.
type pollServer struct {
	coorddv1.UnimplementedCoordinatorServiceServer
	client *http.Client

	mu       sync.Mutex // protects docs and fetching
	docs     map[string][]byte
	fetching map[string]bool
}

func (s *pollServer) GetOrFetch(req *coorddv1.GetOrFetchRequest, stream grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse]) error {
	ctx, u := stream.Context(), req.GetUrl()
	var tick *time.Ticker
	for {
		s.mu.Lock()
		body, ok := s.docs[u]
		lead := !ok && !s.fetching[u]
		if lead {
			s.fetching[u] = true
		}
		s.mu.Unlock()
		switch {
		case ok:
			return sendPlain(stream, body, coorddv1.Source_SOURCE_L1)
		case lead:
			return s.lead(stream, u)
		}
		if tick == nil {
			if err := stream.Send(progressMsg(coorddv1.Role_ROLE_FOLLOWER, coorddv1.Stage_STAGE_JOINED)); err != nil {
				return err
			}
			tick = time.NewTicker(pollInterval)
			defer tick.Stop()
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// lead fetches u for this process and answers its own caller; the pollers
// find it in the map.
func (s *pollServer) lead(stream grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse], u string) error {
	if err := stream.Send(progressMsg(coorddv1.Role_ROLE_LEADER, coorddv1.Stage_STAGE_FETCHING)); err != nil {
		s.mu.Lock()
		delete(s.fetching, u)
		s.mu.Unlock()
		return err
	}
	body, err := s.fetch(stream.Context(), u)
	s.mu.Lock()
	delete(s.fetching, u)
	if err == nil {
		s.docs[u] = body
	}
	s.mu.Unlock()
	if err != nil {
		return status.Error(codes.Unavailable, err.Error())
	}
	return sendPlain(stream, body, coorddv1.Source_SOURCE_UPSTREAM)
}

func (s *pollServer) fetch(ctx context.Context, u string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("upstream answered %s", resp.Status)
	}
	return io.ReadAll(resp.Body)
}

// sendPlain sends metadata and the body in chunks, each message encoded
// for this caller, as a straightforward service would.
func sendPlain(stream grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse], body []byte, src coorddv1.Source) error {
	if err := stream.Send(metadataMsg(len(body), src)); err != nil {
		return err
	}
	for i := 0; i < len(body); i += chunkSize {
		c := &coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Chunk{Chunk: &coorddv1.Chunk{Data: body[i:min(len(body), i+chunkSize)]}}}
		if err := stream.Send(c); err != nil {
			return err
		}
	}
	return nil
}

func progressMsg(role coorddv1.Role, stage coorddv1.Stage) *coorddv1.GetOrFetchResponse {
	return &coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Progress{Progress: &coorddv1.Progress{Role: role, Stage: stage}}}
}

func metadataMsg(size int, src coorddv1.Source) *coorddv1.GetOrFetchResponse {
	return &coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Metadata{Metadata: &coorddv1.Metadata{
		Source: src, StatusCode: http.StatusOK, ContentType: "text/html; charset=utf-8", Size: int64(size),
	}}}
}

// floorServer streams the catalog's documents from memory, every message
// encoded once per document: the least work a GetOrFetch can cost. For a
// gated (cold) document it sends a progress event, waits for the gate and
// then streams, so that its lag is the floor of a push.
type floorServer struct {
	coorddv1.UnimplementedCoordinatorServiceServer
	cat *catalog
}

// floorProgress is the floor's one progress message, encoded once.
var floorProgress = mustMarshal(progressMsg(coorddv1.Role_ROLE_FOLLOWER, coorddv1.Stage_STAGE_JOINED))

func (s *floorServer) GetOrFetch(req *coorddv1.GetOrFetchRequest, stream grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse]) error {
	u, err := url.Parse(req.GetUrl())
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	e := s.cat.get(u.Path)
	if e == nil {
		return status.Error(codes.NotFound, u.Path)
	}
	if hit := e.hit.Load(); hit != nil {
		return wirefloor.SendHit(stream, *hit)
	}
	if g := e.gate; g != nil {
		if err := stream.SendMsg(&wirefloor.Encoded{B: floorProgress}); err != nil {
			return err
		}
		select {
		case <-g.release:
		case <-stream.Context().Done():
			return status.FromContextError(stream.Context().Err()).Err()
		}
		g.left()
	}
	for _, f := range e.wire() {
		if err := stream.SendMsg(&wirefloor.Encoded{B: f}); err != nil {
			return err
		}
	}
	return nil
}

// wire returns e's metadata and chunk messages in wire form, built on the
// first call.
func (e *entry) wire() [][]byte {
	e.once.Do(func() {
		e.frames = append(e.frames, mustMarshal(metadataMsg(len(e.body), coorddv1.Source_SOURCE_L1)))
		for i := 0; i < len(e.body); i += chunkSize {
			c := &coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Chunk{Chunk: &coorddv1.Chunk{Data: e.body[i:min(len(e.body), i+chunkSize)]}}}
			e.frames = append(e.frames, mustMarshal(c))
		}
	})
	return e.frames
}

func mustMarshal(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

func startPolling(h redistest.TB, client *http.Client) string {
	s := &pollServer{client: client, docs: make(map[string][]byte), fetching: make(map[string]bool)}
	return serveBaseline(h, s)
}

func startFloor(h redistest.TB, cat *catalog) string {
	return serveBaseline(h, &floorServer{cat: cat}, wirefloor.ServerOption())
}

// serveBaseline serves s on a free loopback port with the health service
// (which the Go client checks) and coordd's stream limit, and nothing else:
// no interceptors.
func serveBaseline(h redistest.TB, s coorddv1.CoordinatorServiceServer, opts ...grpc.ServerOption) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		h.Fatalf("baseline listen: %v", err)
	}
	g := grpc.NewServer(append([]grpc.ServerOption{grpc.MaxConcurrentStreams(10000)}, opts...)...)
	coorddv1.RegisterCoordinatorServiceServer(g, s)
	hs := health.NewServer()
	hs.SetServingStatus(coorddv1.CoordinatorService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, hs)
	name := nameFloor
	if _, ok := s.(*pollServer); ok {
		name = namePolling
	}
	go serveLabelled(name, func() { _ = g.Serve(lis) })
	h.Cleanup(g.Stop)
	return lis.Addr().String()
}

// serveLabelled runs serve in a goroutine labelled server=name, which every
// goroutine it starts (a gRPC server's connections, streams and writers)
// inherits: a CPU profile (--cpuprofile) splits by it, as in
// go tool pprof -tagfocus server=coordd.
func serveLabelled(name string, serve func()) {
	pprof.Do(context.Background(), pprof.Labels("server", name), func(context.Context) { serve() })
}
