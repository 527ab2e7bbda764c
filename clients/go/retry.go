package coordd

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// RetryPolicy says how a Client retries a failed attempt. Its shape and
// semantics are those of gRPC's retry design (gRFC A6): an attempt that
// fails with UNAVAILABLE or RESOURCE_EXHAUSTED is retried after a random
// wait between zero and min(InitialBackoff*Multiplier^(n-1), MaxBackoff)
// (capped exponential backoff with full jitter), while the Client-wide
// token bucket allows it. Every other code, such as INVALID_ARGUMENT or
// PERMISSION_DENIED, is returned at once.
//
// Zero fields take the defaults written beside them.
type RetryPolicy struct {
	// MaxAttempts is the most attempts per call, the first included.
	// Default: 4. 1 disables retries.
	MaxAttempts int
	// InitialBackoff is the bound of the wait before the first retry.
	// Default: 100ms.
	InitialBackoff time.Duration
	// MaxBackoff caps the bound of any wait. Default: 2s.
	MaxBackoff time.Duration
	// Multiplier grows the bound after each retry. Default: 2.
	Multiplier float64
	// MaxTokens is the size of the retry-throttling token bucket, shared by
	// every call of the Client. It starts full; each attempt that fails with
	// a retryable code takes one token, each call that succeeds puts back
	// TokenRatio, and retries happen only while more than MaxTokens/2
	// remain. So a coordd that keeps failing gets at most one attempt per
	// call once the bucket has drained, instead of MaxAttempts.
	// Default: 10. Negative: retries are never throttled.
	MaxTokens float64
	// TokenRatio is what a successful call puts back. Default: 0.1.
	TokenRatio float64
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts == 0 {
		p.MaxAttempts = 4
	}
	if p.InitialBackoff == 0 {
		p.InitialBackoff = 100 * time.Millisecond
	}
	if p.MaxBackoff == 0 {
		p.MaxBackoff = 2 * time.Second
	}
	if p.Multiplier == 0 {
		p.Multiplier = 2
	}
	if p.MaxTokens == 0 {
		p.MaxTokens = 10
	}
	if p.TokenRatio == 0 {
		p.TokenRatio = 0.1
	}
	return p
}

func (p RetryPolicy) validate() error {
	switch {
	case p.MaxAttempts < 1:
		return fmt.Errorf("coordd: RetryPolicy.MaxAttempts: %d is below 1", p.MaxAttempts)
	case p.InitialBackoff < 0:
		return fmt.Errorf("coordd: RetryPolicy.InitialBackoff: must not be negative")
	case p.MaxBackoff < p.InitialBackoff:
		return fmt.Errorf("coordd: RetryPolicy.MaxBackoff: %v is below InitialBackoff %v", p.MaxBackoff, p.InitialBackoff)
	case p.Multiplier < 1:
		return fmt.Errorf("coordd: RetryPolicy.Multiplier: %v is below 1", p.Multiplier)
	case p.TokenRatio <= 0:
		return fmt.Errorf("coordd: RetryPolicy.TokenRatio: must be positive")
	}
	return nil
}

// backoff returns the wait before retry n (1 for the first retry): a
// uniformly random duration in [0, min(InitialBackoff*Multiplier^(n-1),
// MaxBackoff)).
func (p RetryPolicy) backoff(n int) time.Duration {
	bound := float64(p.InitialBackoff) * math.Pow(p.Multiplier, float64(n-1))
	if bound > float64(p.MaxBackoff) || math.IsInf(bound, 0) || math.IsNaN(bound) {
		bound = float64(p.MaxBackoff)
	}
	if bound < 1 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(bound)))
}

// retryable reports whether an attempt that failed with code may be retried.
func retryable(code codes.Code) bool {
	return code == codes.Unavailable || code == codes.ResourceExhausted
}

// do runs attempt, through the circuit breaker, until it succeeds, fails
// with a code that is not retryable, runs out of attempts or tokens, or ctx
// would end during the backoff. It returns the last attempt's error. Every
// attempt carries the trace context of ctx's span (withTraceparent).
//
// Each attempt is a whole call: a GetOrFetch attempt that fails after part
// of the document arrived is discarded and the next one starts over. This
// is the only choice that keeps Get's contract (one complete, consistent
// document) when the retry may land on another instance, or find a newer
// version of the document; and it is cheap, because coordd has cached the
// document by the time it streams any of it.
//
// Hand-rolled rather than gRPC's built-in retries because gRPC commits a
// stream as soon as the server sends its first message, and coordd sends
// progress events long before the document: a call cut while it waits (an
// instance draining in a rolling deploy, say) would not be retried.
func (c *Client) do(ctx context.Context, attempt func(context.Context) error) error {
	ctx = withTraceparent(ctx)
	for n := 1; ; n++ {
		err := c.breaker.run(ctx, attempt)
		if err == nil {
			c.bucket.success()
			return nil
		}
		if errors.Is(err, ErrCircuitOpen) || !retryable(status.Code(err)) {
			return err
		}
		if !c.bucket.failure() || n >= c.retry.MaxAttempts {
			return err
		}
		wait := max(c.retry.backoff(n), retryDelay(err))
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= wait {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
	}
}

// maxRetryDelay caps the wait a server's RetryInfo can impose.
const maxRetryDelay = time.Minute

// retryDelay is the wait the server asked for in a RetryInfo detail (its
// breaker turns half-open then, or its rate limit has a slot), or 0. The
// full-jitter backoff never retries sooner than that.
func retryDelay(err error) time.Duration {
	return min(retryInfo(err), maxRetryDelay)
}

// retryInfo is the delay of err's RetryInfo detail, uncapped, or 0.
func retryInfo(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return max(ri.GetRetryDelay().AsDuration(), 0)
		}
	}
	return 0
}

// throttle is the retry-throttling token bucket of gRFC A6. Hand-rolled
// because grpc-go keeps its own inside its built-in retries, which this
// package does not use (see do). A nil *throttle never throttles.
type throttle struct {
	max   float64
	ratio float64

	mu     sync.Mutex // protects tokens
	tokens float64
}

// newThrottle returns a full bucket, or nil if maxTokens is negative.
func newThrottle(maxTokens, ratio float64) *throttle {
	if maxTokens < 0 {
		return nil
	}
	return &throttle{max: maxTokens, ratio: ratio, tokens: maxTokens}
}

// failure takes a token for a failed attempt and reports whether a retry
// may follow.
func (t *throttle) failure() bool {
	if t == nil {
		return true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.tokens = max(t.tokens-1, 0)
	return t.tokens > t.max/2
}

// success puts back the ratio for a successful call.
func (t *throttle) success() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.tokens = min(t.tokens+t.ratio, t.max)
}
