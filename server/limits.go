package server

import (
	"context"
	"strings"

	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
)

// DefaultMaxConcurrentCalls is Config.MaxConcurrentCalls when not set.
const DefaultMaxConcurrentCalls = 10000

// Config configures NewGRPC. Its zero value is ready to use.
type Config struct {
	// MaxConcurrentCalls caps the calls of coordd's service (GetOrFetch,
	// Invalidate) in progress at once on this instance, over all
	// connections. A call past it fails at once with RESOURCE_EXHAUSTED,
	// before it reaches the coordinator. Health and reflection calls are
	// neither counted nor refused. Negative: no cap. Default: 10,000.
	MaxConcurrentCalls int
}

// callLimit refuses calls of coordd's service past a number in progress.
// Hand-rolled over a semaphore: go-grpc-middleware's ratelimit interceptor
// only asks its Limiter whether a call may start (Limit(ctx) error) and
// never says when the call ends, which a cap on calls in progress needs.
type callLimit struct {
	max int64
	sem *semaphore.Weighted // nil: no cap
}

func newCallLimit(n int) *callLimit {
	if n == 0 {
		n = DefaultMaxConcurrentCalls
	}
	if n < 0 {
		return &callLimit{}
	}
	return &callLimit{max: int64(n), sem: semaphore.NewWeighted(int64(n))}
}

var limitedPrefix = "/" + coorddv1.CoordinatorService_ServiceDesc.ServiceName + "/"

// acquire takes a slot for a call of method, or returns RESOURCE_EXHAUSTED.
// The caller must call release once the call ends.
func (l *callLimit) acquire(method string) (release func(), err error) {
	if l.sem == nil || !strings.HasPrefix(method, limitedPrefix) {
		return func() {}, nil
	}
	if !l.sem.TryAcquire(1) {
		return nil, status.Errorf(codes.ResourceExhausted, "this instance has %d calls in progress, its limit; retry later", l.max)
	}
	return func() { l.sem.Release(1) }, nil
}

func (l *callLimit) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	release, err := l.acquire(info.FullMethod)
	if err != nil {
		return nil, err
	}
	defer release()
	return handler(ctx, req)
}

func (l *callLimit) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	release, err := l.acquire(info.FullMethod)
	if err != nil {
		return err
	}
	defer release()
	return handler(srv, ss)
}
