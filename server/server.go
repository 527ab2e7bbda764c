// Package server exposes a coordinator.Coordinator as the gRPC service
// coordd.v1.CoordinatorService, with health and reflection. It translates
// between the wire and the engine: gRPC status codes are chosen here, never
// in the engine (status.go maps the engine's errors).
package server

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"golang.org/x/net/http/httpguts"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/document"
	"github.com/coordd/coordd/internal/drain"
	"github.com/coordd/coordd/internal/logctx"
	"github.com/coordd/coordd/internal/secret"
)

// RedisHealthService is the health-service name whose status reports the
// Redis component: NOT_SERVING while coordd runs degraded (in-process
// coordination only). The overall ("") status stays SERVING meanwhile, so
// that a load balancer does not pull every instance at once.
const RedisHealthService = "coordd.v1.CoordinatorService/redis"

// Server implements coorddv1.CoordinatorServiceServer over a Coordinator.
type Server struct {
	coorddv1.UnimplementedCoordinatorServiceServer
	c            *coordinator.Coordinator
	log          *slog.Logger
	auth         *Auth      // nil: every caller is the default tenant (see WithAuth)
	open         *principal // the principal without auth; nil: open (see WithOpenUpstreams)
	noReflection bool
}

var _ coorddv1.CoordinatorServiceServer = (*Server)(nil)

// New returns a Server over c.
func New(c *coordinator.Coordinator, log *slog.Logger, opts ...Option) *Server {
	if log == nil {
		log = slog.Default()
	}
	s := &Server{c: c, log: log.With("component", "server")}
	for _, o := range opts {
		o(s)
	}
	return s
}

// GRPC is a ready-to-serve grpc.Server with coordd's service, health and
// reflection registered.
type GRPC struct {
	*grpc.Server
	Health *health.Server

	log      *slog.Logger
	stopping chan struct{} // closed when Drain's delay ends: ends health Watch streams
	stopOnce sync.Once     // closes stopping
	door     *httpDoor     // the HTTP door (HTTPHandler), sharing the limit and call log
}

// NewGRPC builds the grpc.Server for s as cfg says: interceptors for
// logging, the cap on calls in progress, refusing requests that do not
// decode (INVALID_ARGUMENT) and recovery; keepalive; the pass-through codec
// for pre-encoded chunks; the standard health service and server
// reflection. opts are appended.
func NewGRPC(s *Server, cfg Config, opts ...grpc.ServerOption) *GRPC {
	logger := newCallLogger(s.log)
	recoverOpt := recovery.WithRecoveryHandler(func(p any) error {
		s.log.Error("handler panicked", "panic", p)
		return toStatus(coordinator.ErrUnavailable)
	})
	limit := newCallLimit(cfg.MaxConcurrentCalls)
	base := []grpc.ServerOption{
		codecOption(),
		grpc.ChainUnaryInterceptor(
			requestIDUnary, // first: every later log line carries it
			logger.unary,
			recovery.UnaryServerInterceptor(recoverOpt), // covers auth too
		),
		grpc.ChainStreamInterceptor(
			requestIDStream,
			logger.stream,
			recovery.StreamServerInterceptor(recoverOpt),
		),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle:     5 * time.Minute,  // close idle client connections
			MaxConnectionAge:      5 * time.Minute,  // make clients re-resolve, so new instances get traffic
			MaxConnectionAgeGrace: 1 * time.Minute,  // let in-flight streams finish first
			Time:                  30 * time.Second, // ping a quiet client after this
			Timeout:               10 * time.Second, // and drop it if no ack by then
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             10 * time.Second, // clients may ping this often
			PermitWithoutStream: true,             // even with no active call
		}),
		grpc.MaxConcurrentStreams(10000), // many agents share few connections
	}
	// Authentication before the call cap: a caller without a valid token
	// is refused at once and never holds a slot.
	base = append(base, s.authOptions()...)
	base = append(base,
		grpc.ChainUnaryInterceptor(
			limit.unary, // grpc-go has read the whole request by now
			refuseUndecodableUnary,
		),
		grpc.ChainStreamInterceptor(
			limit.stream, // takes the slot once the request message is in
			refuseUndecodableStream,
		),
		// A connection must finish its TLS handshake and HTTP/2 preface
		// within this (grpc-go's default is 120s), as the HTTP door's
		// ReadHeaderTimeout bounds a caller that never finishes its headers.
		grpc.ConnectionTimeout(handshakeTimeout),
	)
	g := grpc.NewServer(append(base, opts...)...)
	coorddv1.RegisterCoordinatorServiceServer(g, s)
	hs := health.NewServer()
	stopping := make(chan struct{})
	healthpb.RegisterHealthServer(g, watchEnder{Server: hs, stopping: stopping})
	if !s.noReflection {
		reflection.Register(g)
	}
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(coorddv1.CoordinatorService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	door := &httpDoor{s: s, limit: limit, calls: logger, cfg: cfg.withDefaults()}
	return &GRPC{Server: g, Health: hs, log: s.log, stopping: stopping, door: door}
}

// SetRedisHealth records the Redis component's status.
func (g *GRPC) SetRedisHealth(up bool) {
	st := healthpb.HealthCheckResponse_SERVING
	if !up {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	g.Health.SetServingStatus(RedisHealthService, st)
}

// Drain takes the server out of rotation, then stops it. It marks every
// service NOT_SERVING at once and goes on serving, new connections and new
// calls included, for delay: load balancers and Kubernetes poll health, so
// they need that long to see the status and stop routing here, and the
// calls they still route meanwhile succeed instead of hitting a closed
// port. Then it closes the listener and stops gracefully, letting in-flight
// calls finish, and hard after grace. When hurry ends, the delay and the
// grace end at once (drain.Drain). Drain returns once stopped; Redis
// health changes during it are ignored.
func (g *GRPC) Drain(hurry context.Context, delay, grace time.Duration) {
	g.Health.Shutdown()
	g.log.Info("draining: health NOT_SERVING, still serving for the drain delay", "drain_delay", delay, "shutdown_grace", grace)
	_ = drain.Drain(hurry, &grpcStopper{g: g, grace: grace}, delay, grace) // grpcStopper logs the cut
}

// grpcStopper is g as a drain.Server.
type grpcStopper struct {
	g     *GRPC
	grace time.Duration
	done  chan struct{} // closed when GracefulStop returns
}

func (s *grpcStopper) Shutdown(ctx context.Context) error {
	s.g.log.Info("draining: delay over, stopping gracefully")
	s.g.stopOnce.Do(func() { close(s.g.stopping) })
	s.done = make(chan struct{})
	go func() {
		s.g.GracefulStop()
		close(s.done)
	}()
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *grpcStopper) Close() error {
	s.g.log.Warn("draining: grace over, cutting the calls still in flight", "shutdown_grace", s.grace)
	s.g.Stop()
	<-s.done
	return nil
}

// watchEnder is the health service, whose Watch streams end when Drain's
// delay does. grpc-go's own never end while the client stays, and every
// client doing gRPC client-side health checking keeps one open: a single
// such client would hold GracefulStop until shutdown_grace ran out.
type watchEnder struct {
	*health.Server
	stopping <-chan struct{}
}

func (h watchEnder) Watch(req *healthpb.HealthCheckRequest, stream grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	go func() {
		select {
		case <-h.stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := h.Server.Watch(req, watchStream{stream, ctx})
	select {
	case <-h.stopping:
		return status.Error(codes.Unavailable, "server stopping")
	default:
		return err
	}
}

// watchStream is a Watch stream whose context ends early.
type watchStream struct {
	grpc.ServerStreamingServer[healthpb.HealthCheckResponse]
	ctx context.Context
}

func (s watchStream) Context() context.Context { return s.ctx }

// GetOrFetch streams the document: progress events, one metadata, then the
// body in chunks of at most ChunkSize bytes.
func (s *Server) GetOrFetch(req *coorddv1.GetOrFetchRequest, stream grpc.ServerStreamingServer[coorddv1.GetOrFetchResponse]) error {
	p, err := s.principal(stream.Context())
	if err != nil {
		return err
	}
	r, err := request(req.GetUrl(), req.GetKey(), req.GetHeaders(), req.GetCredential())
	if err != nil {
		return err
	}
	opt, err := getOptions(req)
	if err != nil {
		return err
	}
	t, err := s.c.ResolveRequest(p.scope, r)
	if err != nil {
		return toStatus(err)
	}
	logctx.Add(stream.Context(), "key", t.Key)
	ctx := stream.Context()
	opt.Progress = func(p coordinator.Progress) {
		// A failed send means the caller is gone; ctx ends and Get returns.
		if p == hitProgress {
			_ = stream.SendMsg(hitProgressFrame) // every warm hit's: encoded once
			return
		}
		_ = stream.Send(&coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Progress{Progress: progressPB(p)}})
	}
	res, err := s.c.Get(ctx, t, opt)
	if err != nil {
		return toStatus(callerGone(ctx, err))
	}
	d := res.Doc
	if err := stream.SendMsg(metadataMsg(res, t.Private(), s.c.Now())); err != nil {
		return sendFailed(ctx, err)
	}
	if req.GetHead() {
		return nil
	}
	for _, f := range frames(d) {
		if err := stream.SendMsg(f); err != nil {
			return sendFailed(ctx, err)
		}
	}
	return nil
}

// Invalidate removes a document from L2 and from every instance's L1. A
// url names one document (with key: that custom key of the url's
// upstream); a key alone names that key in every upstream the caller is
// granted, or, if it is a url, that url's document. Either is held to the
// upstreams' allow-list and to the caller's tenant: its namespace, its
// upstreams, and the admin right, without which it is PERMISSION_DENIED.
func (s *Server) Invalidate(ctx context.Context, req *coorddv1.InvalidateRequest) (*coorddv1.InvalidateResponse, error) {
	p, err := s.principal(ctx)
	if err != nil {
		return nil, err
	}
	r, err := request(req.GetUrl(), req.GetKey(), req.GetHeaders(), req.GetCredential())
	if err != nil {
		return nil, err
	}
	return s.invalidate(ctx, p, r)
}

// invalidate is Invalidate for p, over gRPC or HTTP.
func (s *Server) invalidate(ctx context.Context, p *principal, r coordinator.Request) (*coorddv1.InvalidateResponse, error) {
	if !p.admin {
		return nil, status.Errorf(codes.PermissionDenied, "tenant %q may not invalidate: it has no admin right", p.scope.Tenant)
	}
	ts, err := s.c.ResolveInvalidationIn(p.scope, r)
	if err != nil {
		return nil, toStatus(err)
	}
	logctx.Add(ctx, "key", ts[0].Key)
	resp := &coorddv1.InvalidateResponse{Key: ts[0].Key}
	for _, t := range ts {
		existed, err := s.c.Invalidate(ctx, t)
		if err != nil {
			return nil, toStatus(callerGone(ctx, err))
		}
		resp.Existed = resp.Existed || existed
	}
	return resp, nil
}

func sourcePB(s coordinator.Source) coorddv1.Source {
	switch s {
	case coordinator.SourceL1:
		return coorddv1.Source_SOURCE_L1
	case coordinator.SourceL2:
		return coorddv1.Source_SOURCE_L2
	case coordinator.SourceUpstream:
		return coorddv1.Source_SOURCE_UPSTREAM
	}
	return coorddv1.Source_SOURCE_UNSPECIFIED
}

// hitProgress is the progress event of every fresh hit, and
// hitProgressFrame its message, encoded once.
var (
	hitProgress      = coordinator.Progress{Role: coordinator.RoleHit}
	hitProgressFrame = mustFrame(&coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Progress{Progress: progressPB(hitProgress)}})
)

func progressPB(p coordinator.Progress) *coorddv1.Progress {
	pb := &coorddv1.Progress{
		Role:    coorddv1.Role(p.Role), // the enums share their numbering
		Stage:   coorddv1.Stage(p.Stage),
		Detail:  p.Detail,
		Attempt: int32(p.Attempt),
	}
	if p.Wait > 0 {
		pb.Wait = durationpb.New(p.Wait)
	}
	return pb
}

// getOptions is the engine's GetOptions for req's no_stale, max_age and
// priority, without Progress. A negative or invalid max_age, or a priority
// that is none of Priority's, is INVALID_ARGUMENT.
func getOptions(req *coorddv1.GetOrFetchRequest) (coordinator.GetOptions, error) {
	var opt coordinator.GetOptions
	opt.NoStale = req.GetNoStale()
	if ma := req.GetMaxAge(); ma != nil {
		if err := ma.CheckValid(); err != nil || ma.AsDuration() < 0 {
			return opt, status.Errorf(codes.InvalidArgument, "max_age %v must be a valid, non-negative duration", ma.AsDuration())
		}
		opt.MaxAge = ma.AsDuration()
	}
	var err error
	opt.Background, err = background(req.GetPriority())
	return opt, err
}

// background reports whether a call of priority p is a background one:
// PRIORITY_UNSPECIFIED is PRIORITY_INTERACTIVE. A value that is none of
// Priority's (sent by a newer client, or garbage) is INVALID_ARGUMENT, not
// taken for either: a caller that asked for something else would not get
// it without a word.
func background(p coorddv1.Priority) (bool, error) {
	switch p {
	case coorddv1.Priority_PRIORITY_UNSPECIFIED, coorddv1.Priority_PRIORITY_INTERACTIVE:
		return false, nil
	case coorddv1.Priority_PRIORITY_BACKGROUND:
		return true, nil
	}
	return false, status.Errorf(codes.InvalidArgument, "priority %d is none of PRIORITY_UNSPECIFIED (0), PRIORITY_INTERACTIVE (1) and PRIORITY_BACKGROUND (2)", int32(p))
}

// maxRequestHeaders bounds the headers one call may carry, forwarded or
// not: a drop-in HTTP client sends a dozen.
const maxRequestHeaders = 256

// request is the engine's Request for a call's fields. Headers over
// maxRequestHeaders, or with a name that is no header name, are
// INVALID_ARGUMENT; the engine checks the values of those it forwards.
func request(url, key string, hs []*coorddv1.Header, credential string) (coordinator.Request, error) {
	r := coordinator.Request{URL: url, Key: key, Credential: secret.New(credential)}
	if len(hs) > maxRequestHeaders {
		return r, status.Errorf(codes.InvalidArgument, "headers: %d; at most %d", len(hs), maxRequestHeaders)
	}
	if len(hs) > 0 {
		r.Header = make(http.Header, len(hs))
		for _, h := range hs {
			if !httpguts.ValidHeaderFieldName(h.GetName()) {
				return r, status.Errorf(codes.InvalidArgument, "headers: %.64q is not a header name", h.GetName())
			}
			r.Header.Add(h.GetName(), h.GetValue())
		}
	}
	return r, nil
}

// headersPB is a document's kept response headers on the wire.
func headersPB(hs []document.Header) []*coorddv1.Header {
	if len(hs) == 0 {
		return nil
	}
	out := make([]*coorddv1.Header, len(hs))
	for i, h := range hs {
		out[i] = &coorddv1.Header{Name: h.Name, Value: h.Value}
	}
	return out
}
