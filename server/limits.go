package server

import (
	"context"
	"strings"
	"time"

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

	// HTTPBodyTimeout bounds how long the HTTP door waits for a request's
	// body once its headers are in: a caller that stalls is answered 408
	// and its connection closed. No call slot is held meanwhile. Default:
	// 5s.
	HTTPBodyTimeout time.Duration

	// HTTPMaxPendingConns bounds, per listener served by NewHTTPServer,
	// the connections that have not yet finished a request's headers
	// (new ones, and kept-alive ones that started the next request). Past
	// it, the oldest such connection is closed: a fast caller gets in, a
	// slow one goes. ReadHeaderTimeout (10s) bounds how long each may
	// take. Default: 1,024.
	HTTPMaxPendingConns int

	// HTTPMaxIdleConns bounds, per listener served by NewHTTPServer, the
	// kept-alive connections waiting for their next request. Past it, the
	// oldest idle connection is closed (its client opens a new one when it
	// next calls). IdleTimeout (5 minutes) bounds how long each may wait.
	// Default: 1,024.
	HTTPMaxIdleConns int
}

// Defaults of Config's HTTP bounds.
const (
	DefaultHTTPBodyTimeout     = 5 * time.Second
	DefaultHTTPMaxPendingConns = 1024
	DefaultHTTPMaxIdleConns    = 1024
)

func (c Config) withDefaults() Config {
	if c.HTTPBodyTimeout <= 0 {
		c.HTTPBodyTimeout = DefaultHTTPBodyTimeout
	}
	if c.HTTPMaxPendingConns <= 0 {
		c.HTTPMaxPendingConns = DefaultHTTPMaxPendingConns
	}
	if c.HTTPMaxIdleConns <= 0 {
		c.HTTPMaxIdleConns = DefaultHTTPMaxIdleConns
	}
	return c
}

// callLimit refuses calls of coordd's service past a number in progress.
// Hand-rolled over a semaphore: go-grpc-middleware's ratelimit interceptor
// only asks its Limiter whether a call may start (Limit(ctx) error) and
// never says when the call ends, which a cap on calls in progress needs.
type callLimit struct {
	max     int64
	sem     *semaphore.Weighted // nil: no cap
	release func()              // l.releaseSlot
}

func newCallLimit(n int) *callLimit {
	if n == 0 {
		n = DefaultMaxConcurrentCalls
	}
	if n < 0 {
		return &callLimit{}
	}
	l := &callLimit{max: int64(n), sem: semaphore.NewWeighted(int64(n))}
	l.release = l.releaseSlot
	return l
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
	return l.release, nil
}

// release gives back a slot acquire took. A method value made once
// (newCallLimit), so that acquire allocates no closure per call.
func (l *callLimit) releaseSlot() { l.sem.Release(1) }

func (l *callLimit) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	release, err := l.acquire(info.FullMethod)
	if err != nil {
		return nil, err
	}
	defer release()
	return handler(ctx, req)
}

// stream takes the call's slot only once its request message is in (the
// first RecvMsg returns it): a caller that opens a stream and stalls before
// sending its request holds no slot. Interceptors before this one (auth)
// have already refused callers without a valid token.
func (l *callLimit) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if l.sem == nil || !strings.HasPrefix(info.FullMethod, limitedPrefix) {
		return handler(srv, ss)
	}
	s := &slotStream{ServerStream: ss, limit: l, method: info.FullMethod}
	defer func() {
		if s.release != nil {
			s.release()
		}
	}()
	return handler(srv, s)
}

// slotStream takes its call's slot when the first request message has been
// received. RecvMsg is called by the handler's goroutine only, so release
// needs no lock.
type slotStream struct {
	grpc.ServerStream
	limit   *callLimit
	method  string
	release func() // set once the slot is taken
}

func (s *slotStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if s.release != nil {
		return nil
	}
	release, err := s.limit.acquire(s.method)
	if err != nil {
		return err
	}
	s.release = release
	return nil
}
