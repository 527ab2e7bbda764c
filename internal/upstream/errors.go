package upstream

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors of a fetch, and of a url that cannot be fetched. The
// coordinator returns them as its own (coordinator.ErrUnavailable is
// ErrUnavailable); their text keeps its "coordinator:" prefix for that
// reason. Compare with errors.Is.
var (
	// ErrInvalidArgument reports a url CanonicalURL refuses.
	ErrInvalidArgument = errors.New("coordinator: invalid argument")
	// ErrUnavailable reports that the upstream could not be reached or
	// answered 5xx.
	ErrUnavailable = errors.New("coordinator: upstream unavailable")
	// ErrTooLarge reports a body larger than the upstream's MaxBodyBytes.
	ErrTooLarge = errors.New("coordinator: body exceeds max_body_bytes")
	// ErrBreakerOpen reports that the upstream's circuit breaker is open.
	// It wraps ErrUnavailable.
	ErrBreakerOpen = fmt.Errorf("%w: circuit breaker open", ErrUnavailable)
	// ErrRateLimited reports that the fetch's wait bound ends before the
	// upstream's rate limit grants it a slot.
	ErrRateLimited = errors.New("coordinator: rate limit slot beyond deadline")
)

// RetryAfterError wraps an error with how long the caller should wait
// before asking again: until the breaker turns half-open, or until the next
// rate-limit slot. The server passes it on as a RetryInfo status detail.
type RetryAfterError struct {
	Err   error
	After time.Duration
}

func (e *RetryAfterError) Error() string { return e.Err.Error() }
func (e *RetryAfterError) Unwrap() error { return e.Err }

// WithRetryAfter wraps err with a wait, if positive.
func WithRetryAfter(err error, after time.Duration) error {
	if after <= 0 {
		return err
	}
	return &RetryAfterError{Err: err, After: after}
}

// RetryAfter returns the wait err carries, or 0.
func RetryAfter(err error) time.Duration {
	var ra *RetryAfterError
	if errors.As(err, &ra) {
		return ra.After
	}
	return 0
}
