package coordd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// BreakerPolicy says when the Client's circuit breaker around coordd opens.
//
// The breaker counts attempts that reached no coordd: UNAVAILABLE or
// DEADLINE_EXCEEDED with nothing at all received from the server (refused
// or cut connections, no address, a frozen instance). An error that coordd
// itself sent, such as UNAVAILABLE because an upstream is down, shows that
// coordd is up and counts as a success. After Failures such attempts in a
// row the breaker opens: calls fail at once with ErrCircuitOpen, without
// any network I/O. After OpenFor it lets one probe attempt through
// (half-open); the probe's outcome closes or reopens it.
//
// Zero fields take the defaults written beside them.
type BreakerPolicy struct {
	// Failures is how many consecutive attempts reaching no coordd open the
	// breaker. Default: 5.
	Failures uint32
	// OpenFor is how long the breaker stays open before its probe.
	// Default: 5s.
	OpenFor time.Duration
}

// breaker wraps each attempt in a gobreaker circuit breaker that allows one
// probe when half-open, and classifies the attempt's outcome.
type breaker struct {
	target  string
	openFor time.Duration
	cb      *gobreaker.TwoStepCircuitBreaker[struct{}]

	mu   sync.Mutex // protects last
	last error      // the latest failure counted, quoted by ErrCircuitOpen
}

// errNotCounted marks an attempt outcome the breaker ignores: the caller
// cancelled, or an error that says nothing of coordd's health.
var errNotCounted = errors.New("coordd: outcome not counted")

func newBreaker(target string, p BreakerPolicy) *breaker {
	if p.Failures == 0 {
		p.Failures = 5
	}
	if p.OpenFor <= 0 {
		p.OpenFor = 5 * time.Second
	}
	b := &breaker{target: target, openFor: p.OpenFor}
	b.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        target,
		MaxRequests: 1, // one probe when half-open
		Timeout:     p.OpenFor,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= p.Failures },
		IsExcluded:  func(err error) bool { return errors.Is(err, errNotCounted) },
	})
	return b
}

// run makes one attempt if the breaker allows it. An attempt that reached
// no coordd returns its error wrapped in ErrUnreachable.
func (b *breaker) run(ctx context.Context, attempt func(context.Context) error) error {
	done, err := b.cb.Allow()
	if err != nil {
		return b.openError()
	}
	var answered atomic.Bool
	err = attempt(context.WithValue(ctx, answeredKey{}, &answered))
	o := b.outcome(ctx, err, answered.Load())
	done(o)
	if o != nil && !errors.Is(o, errNotCounted) {
		return fmt.Errorf("%w: %s: %w", ErrUnreachable, b.target, err)
	}
	return err
}

// outcome is what the breaker records for an attempt that ended with err:
// nil for a success, errNotCounted for an outcome to ignore, or err for a
// failure to reach coordd.
func (b *breaker) outcome(ctx context.Context, err error, answered bool) error {
	if err == nil || answered {
		return nil
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		if errors.Is(ctx.Err(), context.Canceled) {
			return errNotCounted
		}
		b.mu.Lock()
		b.last = err
		b.mu.Unlock()
		return err
	}
	return errNotCounted
}

// openError is the error of a call the breaker refuses. It wraps
// ErrCircuitOpen and the last failure counted.
func (b *breaker) openError() error {
	b.mu.Lock()
	last := b.last
	b.mu.Unlock()
	if last == nil {
		last = status.Error(codes.Unavailable, "coordd unreachable")
	}
	return fmt.Errorf("%w (%s; failing fast for up to %v; last error: %w)", ErrCircuitOpen, b.target, b.openFor, last)
}

// answeredKey is the context key of the *atomic.Bool that answerRecorder
// sets when the server sends anything.
type answeredKey struct{}

// answerRecorder is a stats.Handler that records, in the flag under
// answeredKey, whether the server sent headers or trailers: a status the
// server chose, as opposed to one the client made up for a connection that
// failed. gRPC reports both as the same codes.
type answerRecorder struct{}

func (answerRecorder) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (answerRecorder) HandleRPC(ctx context.Context, s stats.RPCStats) {
	switch s.(type) {
	case *stats.InHeader, *stats.InTrailer:
		if f, ok := ctx.Value(answeredKey{}).(*atomic.Bool); ok {
			f.Store(true)
		}
	}
}

func (answerRecorder) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}

func (answerRecorder) HandleConn(context.Context, stats.ConnStats) {}
