// Package fleettest runs real coordd instances (coordinator and gRPC
// server on a free loopback port) for tests across the project.
package fleettest

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/enginetest"
	"github.com/coordd/coordd/server"
	"github.com/coordd/coordd/server/metrics"
)

// Instance is one running coordd.
type Instance struct {
	Addr        string
	Coordinator *coordinator.Coordinator
	// Metrics records the coordinator's events that tests count (fetches
	// started, timer wakeups, Redis downs, running flights); with
	// Options.Metrics it passes them on to the Prometheus registry.
	Metrics *enginetest.Recorder
	GRPC    *server.GRPC
	Redis   *redis.Client // from Options.RedisURL; nil otherwise
	// MetricsURL is the instance's Prometheus endpoint (http://…/metrics),
	// with Options.Metrics; else empty.
	MetricsURL string
	// HTTPURL is the base URL of the instance's HTTP door (http://host:port),
	// with Options.HTTP; else empty.
	HTTPURL string

	rdb      redis.UniversalClient // the client in use, closed by Stop and Crash; nil in single-node mode
	http     *http.Server          // the HTTP door, with Options.HTTP; closed by Stop and Crash
	stopOnce sync.Once
}

// Options configure Start.
type Options struct {
	// RedisURL is the shared Redis; empty: single-node mode.
	RedisURL string
	// RedisClient, when set, is used instead of RedisURL: a Redis Cluster
	// or Sentinel (failover) client the test built. Stop and Crash close it.
	RedisClient redis.UniversalClient
	// Config is the coordinator's configuration; Logger defaults to one
	// that logs errors only to stderr.
	Config coordinator.Config
	// Addr to listen on. Default: a free port on 127.0.0.1.
	Addr string
	// Server configures the gRPC server.
	Server server.Config
	// ServerOptions are options of server.New, such as server.WithAuth.
	ServerOptions []server.Option
	// GRPC are options appended to server.NewGRPC's, such as grpc.Creds
	// for a TLS listener.
	GRPC []grpc.ServerOption
	// Metrics serves the instance's metrics on a free port on 127.0.0.1
	// (Instance.MetricsURL), as coordd's metrics_listen does.
	Metrics bool
	// HTTP serves the instance's HTTP door on a free port on 127.0.0.1
	// (Instance.HTTPURL), as coordd's http_listen does.
	HTTP bool
	// Transport performs the instance's upstream requests (for tests that
	// count them per instance). Default: the coordinator's own.
	Transport http.RoundTripper
	// TracerProvider traces the instance's engine (coordinator.Options);
	// nil: no tracing. Trace the calls with GRPC (a stats handler) and
	// WrapHTTP.
	TracerProvider trace.TracerProvider
	// WrapHTTP, when set, wraps the HTTP door's handler (Options.HTTP), as
	// coordd wraps it in its tracing.
	WrapHTTP func(http.Handler) http.Handler
}

// Start runs a coordd instance; it is stopped on cleanup.
func Start(t testing.TB, o Options) *Instance {
	t.Helper()
	cfg := o.Config
	if cfg.RedisTimeout == 0 {
		// A test that is not about Redis's timing must not find Redis down
		// because a busy machine (CI, make stress-test) starved the process
		// past the 500ms default: it would then coordinate in-process and
		// fetch once per instance. Fault tests set their own timeout.
		cfg.RedisTimeout = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	}
	var rdb *redis.Client
	if o.RedisURL != "" && o.RedisClient == nil {
		opt, err := redis.ParseURL(o.RedisURL)
		if err != nil {
			t.Fatalf("fleettest: redis url: %v", err)
		}
		timeout := cfg.RedisTimeout
		opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = timeout, timeout, timeout
		opt.ContextTimeoutEnabled = true
		rdb = redis.NewClient(opt)
	}
	in := &Instance{Redis: rdb}
	if rdb != nil {
		in.rdb = rdb
	}
	if o.RedisClient != nil {
		in.rdb = o.RedisClient
	}
	var g *server.GRPC
	var mu sync.Mutex
	opts := coordinator.Options{Transport: o.Transport, TracerProvider: o.TracerProvider, OnRedisHealth: func(up bool) {
		mu.Lock()
		defer mu.Unlock()
		if g != nil {
			g.SetRedisHealth(up)
		}
	}}
	if in.rdb != nil {
		opts.Redis = in.rdb
	}
	var reg *metrics.Registry
	var grpcOpts []grpc.ServerOption
	in.Metrics = enginetest.NewRecorder(nil)
	if o.Metrics {
		reg = metrics.New()
		in.Metrics = enginetest.NewRecorder(reg)
		grpcOpts = reg.ServerOptions()
	}
	opts.Metrics = in.Metrics
	c, err := coordinator.New(cfg, opts)
	if err != nil {
		t.Fatalf("fleettest: coordinator.New: %v", err)
	}
	addr := o.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("fleettest: listen: %v", err)
	}
	mu.Lock()
	g = server.NewGRPC(server.New(c, cfg.Logger, o.ServerOptions...), o.Server, append(o.GRPC, grpcOpts...)...)
	mu.Unlock()
	go func() { _ = g.Serve(lis) }()
	in.Addr, in.Coordinator, in.GRPC = lis.Addr().String(), c, g
	t.Cleanup(in.Stop)
	if o.HTTP {
		hl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("fleettest: listen for http: %v", err)
		}
		h := g.HTTPHandler()
		if reg != nil {
			h = reg.InstrumentHTTP(h)
		}
		if o.WrapHTTP != nil {
			h = o.WrapHTTP(h)
		}
		in.http = g.HTTPServer(h, nil)
		go func() { _ = in.http.Serve(hl) }()
		in.HTTPURL = "http://" + hl.Addr().String()
	}
	if reg != nil {
		reg.Watch(c, g.Server)
		ml, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("fleettest: listen for metrics: %v", err)
		}
		hs := reg.HTTPServer()
		go func() { _ = hs.Serve(ml) }()
		t.Cleanup(func() { hs.Close() })
		in.MetricsURL = "http://" + ml.Addr().String() + "/metrics"
	}
	return in
}

// Stop drains the gRPC server and closes the coordinator (releasing held
// locks), as SIGTERM does.
func (in *Instance) Stop() {
	in.stopOnce.Do(func() {
		if in.http != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = in.http.Shutdown(ctx)
			cancel()
			in.http.Close()
		}
		in.GRPC.Drain(context.Background(), 0, 2*time.Second)
		in.Coordinator.Close()
		if in.rdb != nil {
			in.rdb.Close()
		}
	})
}

// Crash stops serving at once, without draining or releasing locks, as a
// killed process would: connections are cut and the fill lock it holds is
// left to expire. Background work is then abandoned to the test's end.
func (in *Instance) Crash() {
	in.stopOnce.Do(func() {
		if in.http != nil {
			in.http.Close()
		}
		in.GRPC.Stop()
		if in.rdb != nil {
			in.rdb.Close() // its lock watchdog can no longer extend the lease
		}
	})
}

// Dial returns a client for the instance, closed on cleanup. opts are
// appended to its own (plaintext), so they win: say, per-RPC credentials
// or TLS.
func (in *Instance) Dial(t testing.TB, opts ...grpc.DialOption) coorddv1.CoordinatorServiceClient {
	t.Helper()
	return coorddv1.NewCoordinatorServiceClient(in.Conn(t, opts...))
}

// Conn returns a connection to the instance, closed on cleanup, for
// services other than coordd's (health, reflection). opts are as for Dial.
func (in *Instance) Conn(t testing.TB, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(in.Addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatalf("fleettest: dial: %v", err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// Doc is a reassembled GetOrFetch stream.
type Doc struct {
	Progress []*coorddv1.Progress
	Meta     *coorddv1.Metadata
	Body     []byte
	Chunks   int
}

// Get calls GetOrFetch and reassembles the stream, checking its shape:
// progress events, then exactly one metadata, then chunks.
func Get(ctx context.Context, c coorddv1.CoordinatorServiceClient, req *coorddv1.GetOrFetchRequest) (*Doc, error) {
	st, err := c.GetOrFetch(ctx, req)
	if err != nil {
		return nil, err
	}
	d := &Doc{}
	for {
		m, err := st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return d, err
		}
		switch ev := m.Event.(type) {
		case *coorddv1.GetOrFetchResponse_Progress:
			if d.Meta != nil {
				return d, errShape("progress after metadata")
			}
			d.Progress = append(d.Progress, ev.Progress)
		case *coorddv1.GetOrFetchResponse_Metadata:
			if d.Meta != nil {
				return d, errShape("second metadata")
			}
			d.Meta = ev.Metadata
		case *coorddv1.GetOrFetchResponse_Chunk:
			if d.Meta == nil {
				return d, errShape("chunk before metadata")
			}
			d.Body = append(d.Body, ev.Chunk.GetData()...)
			d.Chunks++
		}
	}
	if d.Meta == nil {
		return d, errShape("no metadata")
	}
	if int64(len(d.Body)) != d.Meta.GetSize() {
		return d, errShape("body length differs from metadata size")
	}
	return d, nil
}

type errShape string

func (e errShape) Error() string { return "fleettest: bad stream: " + string(e) }

// GetMeta returns d's metadata; nil-safe, for error messages.
func (d *Doc) GetMeta() *coorddv1.Metadata {
	if d == nil {
		return nil
	}
	return d.Meta
}
