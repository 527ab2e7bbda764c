package coordd_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	coordd "github.com/coordd/coordd/clients/go"
	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fastReconnect makes the channel retry a failed connection within tens of
// milliseconds, so that tests do not wait out gRPC's backoff.
var fastReconnect = grpc.WithConnectParams(grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 50 * time.Millisecond},
	MinConnectTimeout: time.Second,
})

// quickRetries retries almost at once.
func quickRetries(attempts int) coordd.RetryPolicy {
	return coordd.RetryPolicy{MaxAttempts: attempts, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}
}

// dial returns a Client closed when the test ends.
func dial(t *testing.T, target string, opts ...coordd.Option) *coordd.Client {
	t.Helper()
	c, err := coordd.Dial(target, opts...)
	if err != nil {
		t.Fatalf("Dial(%q): %v", target, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// upstreamConfig is a coordinator config whose one upstream is u.
func upstreamConfig(u *fakeupstream.Upstream) coordinator.Config {
	return coordinator.Config{Upstreams: []coordinator.Upstream{{Name: "docs", BaseURL: u.URL()}}}
}

// attempts counts the RPC attempts that reach gRPC (the circuit breaker
// lets them through) and signals the first one that fails.
type attempts struct {
	n          atomic.Int64
	failedOnce sync.Once
	failed     chan struct{} // closed when an attempt first fails
}

func newAttempts() *attempts { return &attempts{failed: make(chan struct{})} }

func (a *attempts) count() int64 { return a.n.Load() }

func (a *attempts) fail() { a.failedOnce.Do(func() { close(a.failed) }) }

// option installs the counting interceptors.
func (a *attempts) option() coordd.Option {
	return coordd.WithDialOptions(
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			a.n.Add(1)
			s, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil {
				a.fail()
				return nil, err
			}
			return &watchedStream{ClientStream: s, a: a}, nil
		}),
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			a.n.Add(1)
			err := invoker(ctx, method, req, reply, cc, opts...)
			if err != nil {
				a.fail()
			}
			return err
		}),
	)
}

type watchedStream struct {
	grpc.ClientStream
	a *attempts
}

func (s *watchedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil && !errors.Is(err, io.EOF) {
		s.a.fail()
	}
	return err
}

// fakeCoordd is a scripted CoordinatorService: call n (from 0) of
// GetOrFetch runs steps[n], or the last step once they run out.
type fakeCoordd struct {
	coorddv1.UnimplementedCoordinatorServiceServer
	addr  string
	calls atomic.Int64
	last  atomic.Pointer[fakeCall] // the latest GetOrFetch's request

	mu    sync.Mutex // protects steps
	steps []step
}

type step func(grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse]) error

func startFake(t *testing.T, steps ...step) *fakeCoordd {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeCoordd{addr: lis.Addr().String(), steps: steps}
	g := grpc.NewServer()
	coorddv1.RegisterCoordinatorServiceServer(g, f)
	hs := health.NewServer() // the Client checks the service's health
	hs.SetServingStatus(coorddv1.CoordinatorService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, hs)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return f
}

func (f *fakeCoordd) script(steps ...step) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.steps = steps
	f.calls.Store(0)
}

// fakeCall is what a fakeCoordd received in a call.
type fakeCall struct {
	req *coorddv1.GetOrFetchRequest
	md  metadata.MD
}

func (f *fakeCoordd) GetOrFetch(req *coorddv1.GetOrFetchRequest, st grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse]) error {
	md, _ := metadata.FromIncomingContext(st.Context())
	f.last.Store(&fakeCall{req: req, md: md})
	n := int(f.calls.Add(1)) - 1
	f.mu.Lock()
	s := f.steps[min(n, len(f.steps)-1)]
	f.mu.Unlock()
	return s(st)
}

// fail answers with code.
func fail(code codes.Code) step {
	return func(grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse]) error {
		return status.Error(code, "scripted "+code.String())
	}
}

// serve streams a well-formed document: a progress event, the metadata,
// then body in chunks of 4 bytes.
func serve(body string) step {
	return func(st grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse]) error {
		return sendDoc(st, body, len(body))
	}
}

// cutAfter streams the progress, the metadata and the first n bytes of
// body, then fails with UNAVAILABLE, as a connection cut mid-body would.
func cutAfter(body string, n int) step {
	return func(st grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse]) error {
		if err := sendDoc(st, body, n); err != nil {
			return err
		}
		return status.Error(codes.Unavailable, "scripted cut")
	}
}

func sendDoc(st grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse], body string, upTo int) error {
	events := []*coorddv1.GetOrFetchResponse{
		{Event: &coorddv1.GetOrFetchResponse_Progress{Progress: &coorddv1.Progress{Role: coorddv1.Role_ROLE_LEADER, Stage: coorddv1.Stage_STAGE_FETCHING}}},
		{Event: &coorddv1.GetOrFetchResponse_Metadata{Metadata: &coorddv1.Metadata{StatusCode: 200, Size: int64(len(body))}}},
	}
	for i := 0; i < upTo; i += 4 {
		events = append(events, &coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Chunk{Chunk: &coorddv1.Chunk{Data: []byte(body[i:min(i+4, upTo)])}}})
	}
	for _, ev := range events {
		if err := st.Send(ev); err != nil {
			return err
		}
	}
	return nil
}

func TestGetReassemblesStream(t *testing.T) {
	up := fakeupstream.New(t)
	const size = 300 << 10 // five 64 KiB chunks
	up.Set("/big", fakeupstream.Behavior{Size: size})
	cfg := upstreamConfig(up)
	cfg.MaxAgeFloor = -1 // no floor: MaxAge(1ms) below must refetch
	in := fleettest.Start(t, fleettest.Options{Config: cfg})
	c := dial(t, in.Addr)

	var seen []*coorddv1.Progress
	doc, err := c.Get(context.Background(), up.URL()+"/big", coordd.WithProgress(func(p *coorddv1.Progress) {
		seen = append(seen, p)
	}))
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if want := fakeupstream.SizedBody("/big", size); !bytes.Equal(doc.Body, want) {
		t.Errorf("body: got %d bytes; want the upstream's %d", len(doc.Body), len(want))
	}
	md := doc.Metadata
	if md.GetStatusCode() != 200 || md.GetSize() != size || md.GetSource() != coorddv1.Source_SOURCE_UPSTREAM {
		t.Errorf("metadata = %v; want status 200, size %d, source upstream", md, size)
	}
	if len(doc.Progress) == 0 || doc.Progress[0].GetRole() != coorddv1.Role_ROLE_LEADER {
		t.Errorf("progress = %v; want a leader event first", doc.Progress)
	}
	if len(seen) != len(doc.Progress) {
		t.Errorf("WithProgress saw %d events; Document holds %d", len(seen), len(doc.Progress))
	}

	// A 404 is a document, and the key can be the caller's.
	up.Set("/nope", fakeupstream.Status(404))
	doc, err = c.Get(context.Background(), up.URL()+"/nope", coordd.WithKey("custom-key"))
	if err != nil {
		t.Fatalf("Get missing: %v", err)
	}
	if doc.Metadata.GetStatusCode() != 404 || doc.Metadata.GetKey() != "custom-key" {
		t.Errorf("status %d, key %q; want 404, custom-key", doc.Metadata.GetStatusCode(), doc.Metadata.GetKey())
	}
	res, err := c.Invalidate(context.Background(), "", coordd.WithKey("custom-key"))
	if err != nil || res.GetKey() != "custom-key" {
		t.Errorf("Invalidate = %v, %v; want key custom-key", res, err)
	}

	// MaxAge reaches coordd: a copy older than it is fetched anew.
	time.Sleep(5 * time.Millisecond) // time is the subject: the copy ages past MaxAge(1ms)
	doc, err = c.Get(context.Background(), up.URL()+"/big", coordd.MaxAge(time.Millisecond))
	if err != nil || doc.Metadata.GetSource() != coorddv1.Source_SOURCE_UPSTREAM || up.Count("/big") != 2 {
		t.Errorf("MaxAge(1ms): %v, source %v, %d upstream requests; want a second fetch", err, doc.GetMetadata().GetSource(), up.Count("/big"))
	}
}

func TestRetries(t *testing.T) {
	const body = "0123456789abcdef"
	tests := []struct {
		name     string
		steps    []step
		attempts int64
		code     codes.Code // of the error; OK: Get succeeds
		badShape bool
	}{
		{"unavailable twice then ok", []step{fail(codes.Unavailable), fail(codes.Unavailable), serve(body)}, 3, codes.OK, false},
		{"resource exhausted then ok", []step{fail(codes.ResourceExhausted), serve(body)}, 2, codes.OK, false},
		{"unavailable past max attempts", []step{fail(codes.Unavailable)}, 4, codes.Unavailable, false},
		{"invalid argument not retried", []step{fail(codes.InvalidArgument), serve(body)}, 1, codes.InvalidArgument, false},
		{"permission denied not retried", []step{fail(codes.PermissionDenied), serve(body)}, 1, codes.PermissionDenied, false},
		{"failed precondition not retried", []step{fail(codes.FailedPrecondition), serve(body)}, 1, codes.FailedPrecondition, false},
		{"internal not retried", []step{fail(codes.Internal), serve(body)}, 1, codes.Internal, false},
		{"cut after metadata restarts cleanly", []step{cutAfter(body, 0), serve(body)}, 2, codes.OK, false},
		{"cut mid-body restarts cleanly", []step{cutAfter(body, 8), serve(body)}, 2, codes.OK, false},
		{"malformed stream not retried", []step{func(st grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse]) error {
			return st.Send(&coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Chunk{Chunk: &coorddv1.Chunk{Data: []byte("x")}}})
		}, serve(body)}, 1, codes.Unknown, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := startFake(t, tt.steps...)
			c := dial(t, f.addr, coordd.WithRetryPolicy(quickRetries(4)))
			doc, err := c.Get(context.Background(), "https://docs.example/x")
			if got := f.calls.Load(); got != tt.attempts {
				t.Errorf("attempts = %d; want %d", got, tt.attempts)
			}
			if tt.badShape {
				if !errors.Is(err, coordd.ErrBadStream) {
					t.Errorf("err = %v; want ErrBadStream", err)
				}
				return
			}
			if got := status.Code(err); got != tt.code {
				t.Fatalf("code = %v (err %v); want %v", got, err, tt.code)
			}
			if err == nil && string(doc.Body) != body {
				t.Errorf("body = %q; want %q (partial attempts discarded)", doc.Body, body)
			}
		})
	}
}

func TestNoRetryOfCoorddRejections(t *testing.T) {
	up := fakeupstream.New(t)
	in := fleettest.Start(t, fleettest.Options{Config: upstreamConfig(up)})
	tests := []struct {
		name string
		url  string
		code codes.Code
	}{
		{"invalid argument", "ftp://docs.example/x", codes.InvalidArgument},
		{"permission denied", "https://elsewhere.example/x", codes.PermissionDenied},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAttempts()
			c := dial(t, in.Addr, a.option())
			_, err := c.Get(context.Background(), tt.url)
			if got := status.Code(err); got != tt.code {
				t.Fatalf("code = %v (err %v); want %v", got, err, tt.code)
			}
			if got := a.count(); got != 1 {
				t.Errorf("attempts = %d; want 1", got)
			}
		})
	}
	if up.Total() != 0 {
		t.Errorf("upstream requests = %d; want 0", up.Total())
	}
}

func TestRetryAcrossRestart(t *testing.T) {
	up := fakeupstream.New(t)
	cfg := fleettest.Options{Config: upstreamConfig(up)}
	in := fleettest.Start(t, cfg)
	a := newAttempts()
	c := dial(t, in.Addr, a.option(),
		coordd.WithRetryPolicy(coordd.RetryPolicy{MaxAttempts: 20, InitialBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, MaxTokens: -1}),
		coordd.WithBreakerPolicy(coordd.BreakerPolicy{Failures: 1000}),
		coordd.WithDialOptions(fastReconnect))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Get(ctx, up.URL()+"/a"); err != nil {
		t.Fatalf("Get before stop: %v", err)
	}

	in.Stop()
	before := a.count()
	type result struct {
		doc *coordd.Document
		err error
	}
	done := make(chan result, 1)
	go func() {
		doc, err := c.Get(ctx, up.URL()+"/b")
		done <- result{doc, err}
	}()
	select {
	case <-a.failed: // the first attempt found coordd gone
	case <-ctx.Done():
		t.Fatal("no attempt failed while coordd was down")
	}
	cfg.Addr = in.Addr
	fleettest.Start(t, cfg) // the same address, as a restarted process
	r := <-done
	if r.err != nil {
		t.Fatalf("Get across the restart: %v", r.err)
	}
	if string(r.doc.Body) != string(up.Body("/b")) {
		t.Errorf("body = %q; want the upstream's", r.doc.Body)
	}
	if n := a.count() - before; n < 2 {
		t.Errorf("attempts = %d; want at least 2", n)
	}
	t.Logf("the call made %d attempts across the restart", a.count()-before)
}

func TestRetryThrottling(t *testing.T) {
	f := startFake(t, fail(codes.Unavailable))
	c := dial(t, f.addr, coordd.WithRetryPolicy(coordd.RetryPolicy{
		MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond,
		MaxTokens: 10, TokenRatio: 0.1,
	}))
	// Tokens 10 → 7 (3 attempts), → 5 (2), then one attempt per call.
	want := []int64{3, 2, 1, 1, 1, 1, 1, 1}
	var got []int64
	for range want {
		before := f.calls.Load()
		_, err := c.Get(context.Background(), "https://docs.example/x")
		if errors.Is(err, coordd.ErrUnreachable) {
			t.Fatalf("err = %v; errors coordd sent must not count as unreachable, nor open the breaker", err)
		}
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("err = %v; want UNAVAILABLE", err)
		}
		got = append(got, f.calls.Load()-before)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("attempts per call = %v; want %v", got, want)
	}

	// Once coordd answers again, calls succeed at the first attempt.
	f.script(serve("ok"))
	if _, err := c.Get(context.Background(), "https://docs.example/x"); err != nil {
		t.Fatalf("Get after recovery: %v", err)
	}
}

func TestBreaker(t *testing.T) {
	up := fakeupstream.New(t)
	cfg := fleettest.Options{Config: upstreamConfig(up)}
	in := fleettest.Start(t, cfg)
	a := newAttempts()
	const openFor = 300 * time.Millisecond
	c := dial(t, in.Addr, a.option(),
		coordd.WithRetryPolicy(coordd.RetryPolicy{MaxAttempts: 1}),
		coordd.WithBreakerPolicy(coordd.BreakerPolicy{Failures: 3, OpenFor: openFor}),
		coordd.WithDialOptions(fastReconnect))
	ctx := context.Background()
	url := up.URL() + "/page"
	if _, err := c.Get(ctx, url); err != nil {
		t.Fatalf("Get: %v", err)
	}

	in.Stop()
	for i := range 3 {
		_, err := c.Get(ctx, url)
		if status.Code(err) != codes.Unavailable || !errors.Is(err, coordd.ErrUnreachable) || errors.Is(err, coordd.ErrCircuitOpen) {
			t.Fatalf("call %d with coordd down: %v; want ErrUnreachable with code UNAVAILABLE", i+1, err)
		}
	}

	// Open: calls fail fast, and none reaches gRPC.
	before := a.count()
	start := time.Now()
	const fastCalls = 100
	for range fastCalls {
		_, err := c.Get(ctx, url)
		if !errors.Is(err, coordd.ErrCircuitOpen) || status.Code(err) != codes.Unavailable {
			t.Fatalf("err = %v; want ErrCircuitOpen with code UNAVAILABLE", err)
		}
	}
	t.Logf("open breaker: %d calls in %v", fastCalls, time.Since(start))
	if n := a.count() - before; n != 0 {
		t.Errorf("%d attempts reached gRPC while the breaker was open; want 0", n)
	}

	// Half-open: of many concurrent calls, one probes; it fails, and the
	// breaker opens again.
	time.Sleep(openFor + 20*time.Millisecond) // wait out gobreaker's timer; it has no clock to inject
	before = a.count()
	var wg sync.WaitGroup
	var refused atomic.Int64
	for range 10 {
		wg.Go(func() {
			if _, err := c.Get(ctx, url); errors.Is(err, coordd.ErrCircuitOpen) {
				refused.Add(1)
			}
		})
	}
	wg.Wait()
	if n := a.count() - before; n != 1 || refused.Load() != 9 {
		t.Errorf("half-open: %d probe attempts, %d refused; want 1 and 9", n, refused.Load())
	}

	// coordd comes back: a probe succeeds and the breaker closes.
	cfg.Addr = in.Addr
	fleettest.Start(t, cfg)
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := c.Get(ctx, url)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("breaker did not close after coordd came back: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i := range 10 {
		if _, err := c.Get(ctx, url); err != nil {
			t.Fatalf("call %d after the breaker closed: %v", i+1, err)
		}
	}
}

func TestRoundRobin(t *testing.T) {
	up := fakeupstream.New(t)
	var ins []*fleettest.Instance
	var addrs []resolver.Address
	for range 3 {
		in := fleettest.Start(t, fleettest.Options{Config: upstreamConfig(up)})
		ins = append(ins, in)
		addrs = append(addrs, resolver.Address{Addr: in.Addr})
	}
	r := manual.NewBuilderWithScheme("coordd-test")
	r.InitialState(resolver.State{Addresses: addrs})
	c := dial(t, "coordd-test:///coordd", coordd.WithDialOptions(grpc.WithResolvers(r)))
	ctx := context.Background()
	counts := func() []int64 {
		var n []int64
		for _, in := range ins {
			n = append(n, in.Metrics.Fetches())
		}
		return n
	}

	// Every call is for a new page, so the instance it lands on fetches it.
	page := 0
	get := func() {
		page++
		if _, err := c.Get(ctx, fmt.Sprintf("%s/page/%d", up.URL(), page)); err != nil {
			t.Fatalf("Get: %v", err)
		}
	}
	// Until all three connections are ready, calls go to those that are.
	for n := counts(); n[0] == 0 || n[1] == 0 || n[2] == 0; n = counts() {
		if page == 100 {
			t.Fatalf("after 100 calls, upstream requests per instance = %v; want every instance used", n)
		}
		get()
	}
	before := counts()
	for range 30 {
		get()
	}
	after := counts()
	for i := range ins {
		if d := after[i] - before[i]; d != 10 {
			t.Errorf("instance %d served %d of 30 calls; want 10 (all: before %v, after %v)", i, d, before, after)
		}
	}
}

func TestDeadlines(t *testing.T) {
	var seen atomic.Value // time.Duration left on the call's deadline, or -1 for none
	f := startFake(t, func(st grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse]) error {
		left := time.Duration(-1)
		if dl, ok := st.Context().Deadline(); ok {
			left = time.Until(dl)
		}
		seen.Store(left)
		return sendDoc(st, "ok", 2)
	})
	tests := []struct {
		name    string
		opt     coordd.Option
		ctx     time.Duration // the caller's own deadline; 0: none
		atMost  time.Duration
		atLeast time.Duration
	}{
		{"default applied", coordd.WithTimeout(time.Second), 0, time.Second, 0},
		{"default is 30s", nil, 0, coordd.DefaultTimeout, coordd.DefaultTimeout - 10*time.Second},
		{"caller's deadline kept", coordd.WithTimeout(time.Second), time.Hour, time.Hour, 50 * time.Minute},
		{"no default", coordd.WithTimeout(0), 0, -1, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var opts []coordd.Option
			if tt.opt != nil {
				opts = append(opts, tt.opt)
			}
			c := dial(t, f.addr, opts...)
			ctx := context.Background()
			if tt.ctx > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.ctx)
				defer cancel()
			}
			if _, err := c.Get(ctx, "https://docs.example/x"); err != nil {
				t.Fatalf("Get: %v", err)
			}
			left := seen.Load().(time.Duration)
			if left > tt.atMost || left < tt.atLeast {
				t.Errorf("deadline seen by the server: %v left; want between %v and %v", left, tt.atLeast, tt.atMost)
			}
		})
	}

	t.Run("expires", func(t *testing.T) {
		hang := startFake(t, func(st grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse]) error {
			<-st.Context().Done()
			return st.Context().Err()
		})
		c := dial(t, hang.addr, coordd.WithTimeout(50*time.Millisecond))
		_, err := c.Get(context.Background(), "https://docs.example/x")
		if status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("err = %v; want DEADLINE_EXCEEDED", err)
		}
		if n := hang.calls.Load(); n != 1 {
			t.Errorf("attempts = %d; want 1", n)
		}
	})
}

func TestGetBodySizes(t *testing.T) {
	up := fakeupstream.New(t)
	in := fleettest.Start(t, fleettest.Options{Config: upstreamConfig(up)})
	c := dial(t, in.Addr)
	tests := []struct {
		name string
		size int
	}{
		{"empty", 0},
		{"one byte", 1},
		{"one chunk", 64 << 10},
		{"one chunk and a byte", 64<<10 + 1},
		{"1 MiB", 1 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := fmt.Sprintf("/size/%d", tt.size)
			want := fakeupstream.SizedBody(path, tt.size)
			up.Set(path, fakeupstream.Behavior{Body: want})
			for _, tier := range []string{"upstream", "cache"} {
				doc, err := c.Get(context.Background(), up.URL()+path)
				if err != nil {
					t.Fatalf("%s: Get: %v", tier, err)
				}
				if !bytes.Equal(doc.Body, want) {
					t.Errorf("%s: body of %d bytes differs from the upstream's %d", tier, len(doc.Body), len(want))
				}
				if got := doc.Metadata.GetSize(); got != int64(tt.size) {
					t.Errorf("%s: metadata size = %d; want %d", tier, got, tt.size)
				}
				if cap(doc.Body) != tt.size {
					t.Errorf("%s: body capacity = %d; want %d, allocated once from the metadata", tier, cap(doc.Body), tt.size)
				}
			}
		})
	}
}

// sendRaw sends the metadata of a document of size bytes, then chunks
// until more than n bytes went, or, for n < 0, until the client gives up.
func sendRaw(size int64, n int) step {
	return func(st grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse]) error {
		if err := st.Send(&coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Metadata{Metadata: &coorddv1.Metadata{StatusCode: 200, Size: size}}}); err != nil {
			return err
		}
		data := bytes.Repeat([]byte("x"), 1024)
		for sent := 0; n < 0 || sent < n; sent += len(data) {
			if err := st.Send(&coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Chunk{Chunk: &coorddv1.Chunk{Data: data}}}); err != nil {
				return err
			}
		}
		return nil
	}
}

// TestLyingStream checks that a stream whose body does not match its
// metadata fails with ErrBadStream, and that one sending more than the
// size announced fails at once rather than when it ends, if ever.
func TestLyingStream(t *testing.T) {
	tests := []struct {
		name   string
		step   step
		detail string // in the error
	}{
		{"more than the size, then ends", sendRaw(2048, 4096), "exceeds"},
		{"more than the size, endless", sendRaw(2048, -1), "exceeds"},
		{"empty document, endless", sendRaw(0, -1), "exceeds"},
		{"negative size, endless", sendRaw(-1, -1), "size -1"},
		{"huge size, short body", sendRaw(1<<62, 4096), "body is 4096 bytes"},
		{"less than the size", sendRaw(8192, 4096), "body is 4096 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := startFake(t, tt.step)
			// The deadline only bounds a failing test.
			c := dial(t, f.addr, coordd.WithTimeout(5*time.Second))
			_, err := c.Get(context.Background(), "https://docs.example/x")
			if !errors.Is(err, coordd.ErrBadStream) || !strings.Contains(err.Error(), tt.detail) {
				t.Fatalf("err = %v; want ErrBadStream saying %q", err, tt.detail)
			}
			if n := f.calls.Load(); n != 1 {
				t.Errorf("attempts = %d; want 1", n)
			}
		})
	}
}

// TestChunkOfAnotherShape checks that chunk messages shaped otherwise than
// coordd's own (empty, or with a field this client does not know) are
// decoded as protobuf.
func TestChunkOfAnotherShape(t *testing.T) {
	withUnknown := &coorddv1.Chunk{Data: []byte("cdef")}
	withUnknown.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 15, protowire.VarintType), 1))
	f := startFake(t, func(st grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse]) error {
		for _, m := range []*coorddv1.GetOrFetchResponse{
			{Event: &coorddv1.GetOrFetchResponse_Metadata{Metadata: &coorddv1.Metadata{StatusCode: 200, Size: 8}}},
			{Event: &coorddv1.GetOrFetchResponse_Chunk{Chunk: &coorddv1.Chunk{Data: []byte("ab")}}},
			{Event: &coorddv1.GetOrFetchResponse_Chunk{Chunk: &coorddv1.Chunk{}}},
			{Event: &coorddv1.GetOrFetchResponse_Chunk{Chunk: withUnknown}},
			{Event: &coorddv1.GetOrFetchResponse_Chunk{Chunk: &coorddv1.Chunk{Data: []byte("gh")}}},
		} {
			if err := st.Send(m); err != nil {
				return err
			}
		}
		return nil
	})
	c := dial(t, f.addr)
	doc, err := c.Get(context.Background(), "https://docs.example/x")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if got, want := string(doc.Body), "abcdefgh"; got != want {
		t.Errorf("body = %q; want %q", got, want)
	}
}

// TestMaxBodyBytes checks WithMaxBodyBytes against a real coordd: a body of
// exactly the limit arrives, one a byte larger fails at its first attempt
// with ErrBodyTooLarge, and without the option that body arrives.
func TestMaxBodyBytes(t *testing.T) {
	up := fakeupstream.New(t)
	in := fleettest.Start(t, fleettest.Options{Config: upstreamConfig(up)})
	const limit = 1 << 20
	path := func(size int) string { return fmt.Sprintf("/size/%d", size) }
	for _, size := range []int{limit, limit + 1} {
		up.Set(path(size), fakeupstream.Behavior{Size: size})
	}
	ctx := context.Background()
	a := newAttempts()
	c := dial(t, in.Addr, a.option(), coordd.WithMaxBodyBytes(limit), coordd.WithRetryPolicy(quickRetries(4)))

	doc, err := c.Get(ctx, up.URL()+path(limit))
	if err != nil {
		t.Fatalf("Get at the limit: %v", err)
	}
	if want := fakeupstream.SizedBody(path(limit), limit); !bytes.Equal(doc.Body, want) {
		t.Errorf("body at the limit: got %d bytes; want the upstream's %d", len(doc.Body), len(want))
	}

	before := a.count()
	_, err = c.Get(ctx, up.URL()+path(limit+1))
	if !errors.Is(err, coordd.ErrBodyTooLarge) || !strings.Contains(err.Error(), fmt.Sprint(limit+1)) || !strings.Contains(err.Error(), fmt.Sprint(limit)) {
		t.Fatalf("Get past the limit: err = %v; want ErrBodyTooLarge naming the size and the limit", err)
	}
	if n := a.count() - before; n != 1 {
		t.Errorf("attempts past the limit = %d; want 1", n)
	}

	// The default is no limit.
	doc, err = dial(t, in.Addr).Get(ctx, up.URL()+path(limit+1))
	if err != nil {
		t.Fatalf("Get without a limit: %v", err)
	}
	if len(doc.Body) != limit+1 {
		t.Errorf("body without a limit: %d bytes; want %d", len(doc.Body), limit+1)
	}
}

// TestMaxBodyBytesCancelsStream checks that a body announced above the
// limit is refused on its metadata and its stream cancelled: the server
// here streams chunks until its stream fails, which without the
// cancellation it would not do before the deadline.
func TestMaxBodyBytesCancelsStream(t *testing.T) {
	ended := make(chan error, 1) // the stream context's error once sending failed
	var chunks atomic.Int64
	f := startFake(t, func(st grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse]) error {
		err := st.Send(&coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Metadata{Metadata: &coorddv1.Metadata{StatusCode: 200, Size: 1 << 40}}})
		data := bytes.Repeat([]byte("x"), 1024)
		for err == nil {
			err = st.Send(&coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Chunk{Chunk: &coorddv1.Chunk{Data: data}}})
			chunks.Add(1)
		}
		ended <- st.Context().Err()
		return err
	})
	// The deadline only bounds a failing test; it outlasts the wait below.
	c := dial(t, f.addr, coordd.WithMaxBodyBytes(1<<20), coordd.WithRetryPolicy(quickRetries(4)), coordd.WithTimeout(30*time.Second))
	_, err := c.Get(context.Background(), "https://docs.example/x")
	if !errors.Is(err, coordd.ErrBodyTooLarge) || errors.Is(err, coordd.ErrBadStream) {
		t.Fatalf("err = %v; want ErrBodyTooLarge", err)
	}
	if n := f.calls.Load(); n != 1 {
		t.Errorf("attempts = %d; want 1", n)
	}
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("server's stream ended with %v; want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server was still streaming 10s after Get returned")
	}
	t.Logf("the server sent %d chunks of 1 KiB before the cancellation reached it", chunks.Load())
}
