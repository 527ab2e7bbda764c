package server_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/enginetest"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
)

// rawMsg is a request sent as the bytes it holds, whatever they are.
type rawMsg []byte

// rawCodec is a client codec that sends a rawMsg as it is and decodes
// replies as proto.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(rawMsg); ok {
		return mem.BufferSlice{mem.SliceBuffer(r)}, nil
	}
	b, err := proto.Marshal(v.(proto.Message))
	return mem.BufferSlice{mem.SliceBuffer(b)}, err
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

func (rawCodec) Name() string { return "proto" }

const (
	methodGetOrFetch  = "/coordd.v1.CoordinatorService/GetOrFetch"
	methodInvalidate  = "/coordd.v1.CoordinatorService/Invalidate"
	methodHealthCheck = "/grpc.health.v1.Health/Check"
)

// dialRaw returns a connection to in whose calls send rawMsg bytes as they
// are; closed on cleanup.
func dialRaw(t *testing.T, in *fleettest.Instance) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(in.Addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// callRaw sends body as the one request of method and returns the call's
// outcome, reading a stream to its end.
func callRaw(ctx context.Context, cc *grpc.ClientConn, method string, body []byte) error {
	switch method {
	case methodGetOrFetch:
		st, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, method)
		if err != nil {
			return err
		}
		if err := st.SendMsg(rawMsg(body)); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if err := st.CloseSend(); err != nil {
			return err
		}
		for {
			if err := st.RecvMsg(new(coorddv1.GetOrFetchResponse)); err != nil {
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
		}
	case methodInvalidate:
		return cc.Invoke(ctx, method, rawMsg(body), new(coorddv1.InvalidateResponse))
	default:
		return cc.Invoke(ctx, method, rawMsg(body), new(healthpb.HealthCheckResponse))
	}
}

// str is field f holding s, in wire form.
func str(f protowire.Number, s string) []byte {
	return protowire.AppendString(protowire.AppendTag(nil, f, protowire.BytesType), s)
}

// nestedGroups is n start-group tags of an unknown field, closed by n end
// tags if closed: nesting far past the decoder's recursion limit.
func nestedGroups(n int, closed bool) []byte {
	var b []byte
	for range n {
		b = protowire.AppendTag(b, 99, protowire.StartGroupType)
	}
	for range n * btoi(closed) {
		b = protowire.AppendTag(b, 99, protowire.EndGroupType)
	}
	return b
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// garbage is n pseudo-random bytes that do not decode as a request.
func garbage(t *testing.T, seed uint64, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	_, _ = rand.NewChaCha8([32]byte{byte(seed)}).Read(b)
	if proto.Unmarshal(b, new(coorddv1.GetOrFetchRequest)) == nil {
		t.Fatalf("seed %d: the garbage decodes; pick another seed", seed)
	}
	return b
}

// badInputs are request bodies that do not decode, each paired with a
// good url so that only the bad part can be refused.
func badInputs(t *testing.T, goodURL string) []struct {
	name string
	body []byte
} {
	return []struct {
		name string
		body []byte
	}{
		{"invalid UTF-8 in url", str(1, goodURL+"/\xff\xfe")},
		{"invalid UTF-8 in key", append(str(1, goodURL), str(2, "key-\xc3\x28")...)},
		{"truncated field", str(1, goodURL)[:12]},
		{"random bytes 1", garbage(t, 1, 1024)},
		{"random bytes 2", garbage(t, 2, 64<<10)},
		{"100k nested groups", append(str(1, goodURL), nestedGroups(100_000, true)...)},
		{"100k unterminated groups", append(str(1, goodURL), nestedGroups(100_000, false)...)},
		{"overlong varint", append(str(1, goodURL), 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01)},
	}
}

func TestUndecodableRequestsAreInvalidArgument(t *testing.T) {
	u := fakeupstream.New(t)
	in := fleettest.Start(t, fleettest.Options{Config: coordinator.Config{
		Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: u.URL()}},
		Logger:    slog.New(slog.DiscardHandler),
	}})
	cc := dialRaw(t, in)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, method := range []string{methodGetOrFetch, methodInvalidate, methodHealthCheck} {
		for _, tc := range badInputs(t, u.URL()+"/doc") {
			if method == methodHealthCheck && proto.Unmarshal(tc.body, new(healthpb.HealthCheckRequest)) == nil {
				continue // a good health request: field 2 is unknown there
			}
			t.Run(method+"/"+tc.name, func(t *testing.T) {
				err := callRaw(ctx, cc, method, tc.body)
				if got := status.Code(err); got != codes.InvalidArgument {
					t.Errorf("got %v (%v); want %v", got, err, codes.InvalidArgument)
				}
			})
		}
	}
	if n := u.Total(); n != 0 {
		t.Errorf("upstream got %d requests; want 0", n)
	}
	// The server keeps serving.
	good, _ := proto.Marshal(&coorddv1.GetOrFetchRequest{Url: u.URL() + "/doc"})
	if err := callRaw(ctx, cc, methodGetOrFetch, good); err != nil {
		t.Fatalf("good call after bad ones: %v", err)
	}
	if n := u.Count("/doc"); n != 1 {
		t.Errorf("upstream got %d requests for /doc; want 1", n)
	}
}

// Refused calls log at most at WARN, at a bounded rate, in bounded lines,
// however fast a caller sends them.
func TestRefusedCallsLogBounded(t *testing.T) {
	const (
		calls   = 2000
		maxLine = 1024 // bytes
		// The refused-call log limit of server/logging.go.
		burst, perSecond = 20, 10
	)
	u := fakeupstream.New(t)
	var buf enginetest.SyncBuffer
	start := time.Now() // the log limiter starts full no earlier than this
	in := fleettest.Start(t, fleettest.Options{Config: coordinator.Config{
		Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: u.URL()}},
		Logger:    slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}})
	cc := dialRaw(t, in)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	long := "https://elsewhere.example/" + strings.Repeat("a\"b", 600) // forbidden, quoted in the error
	longOK := u.URL() + "/" + strings.Repeat("x", 1900) + "\xff"       // invalid UTF-8
	bodies := [][]byte{
		str(1, u.URL()+"/\xff"),
		str(1, long),
		str(1, longOK),
		garbage(t, 3, 512),
		nestedGroups(20_000, false),
	}
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < calls; i += 8 {
				method := methodGetOrFetch
				if i%3 == 0 {
					method = methodInvalidate
				}
				if err := callRaw(ctx, cc, method, bodies[i%len(bodies)]); status.Code(err) != codes.InvalidArgument && status.Code(err) != codes.PermissionDenied {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err, ok := <-errs; ok {
		t.Errorf("got %v and %d more; want InvalidArgument or PermissionDenied", err, len(errs))
	}

	log := buf.String()
	lines, errLines, longest := 0, 0, 0
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines++
		if bytes.Contains(sc.Bytes(), []byte("level=ERROR")) {
			errLines++
		}
		longest = max(longest, len(sc.Bytes()))
	}
	// The limiter allows burst lines at once and perSecond after; +1 for
	// the token refilled while the last line was written.
	if most := burst + int(elapsed.Seconds()*perSecond) + 1; lines > most {
		t.Errorf("got %d log lines for %d refused calls in %v; want at most %d", lines, calls, elapsed, most)
	}
	if errLines != 0 {
		t.Errorf("got %d ERROR lines; want 0", errLines)
	}
	if longest > maxLine {
		t.Errorf("got a log line of %d bytes; want at most %d", longest, maxLine)
	}
	if lines == 0 {
		t.Errorf("got no log line; want refused calls logged")
	}
	if t.Failed() {
		t.Logf("log (%d bytes), first 2 KiB:\n%s", len(log), log[:min(len(log), 2048)])
	}
}
