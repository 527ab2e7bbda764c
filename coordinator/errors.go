package coordinator

import (
	"errors"
	"fmt"

	"github.com/coordd/coordd/internal/store"
	"github.com/coordd/coordd/internal/upstream"
)

// Sentinel errors returned by the Coordinator. Errors carry detail through
// %w wrapping; compare with errors.Is. The server package maps each to a
// gRPC status code.
var (
	// ErrInvalidArgument reports malformed input: an empty, relative or
	// oversized url, a scheme other than http(s), userinfo, control
	// characters, or an oversized key. It is returned before any I/O.
	ErrInvalidArgument = upstream.ErrInvalidArgument
	// ErrForbidden reports a url outside every configured upstream, or of
	// an upstream the caller's Scope does not grant. It is returned before
	// any I/O.
	ErrForbidden = errors.New("coordinator: forbidden")
	// ErrUnavailable reports that the upstream could not be reached or
	// answered 5xx, and no usable stale copy exists.
	ErrUnavailable = upstream.ErrUnavailable
	// ErrTooLarge reports a body larger than the upstream's max_body_bytes.
	// Such a body is never cached.
	ErrTooLarge = upstream.ErrTooLarge
	// ErrBreakerOpen reports that the upstream's circuit breaker is open and
	// no stale copy exists. It wraps ErrUnavailable.
	ErrBreakerOpen = upstream.ErrBreakerOpen
	// ErrRateLimited reports that the caller's deadline ends before the
	// upstream's rate limit grants it a slot, and no stale copy exists.
	ErrRateLimited = upstream.ErrRateLimited
	// ErrRedisUnavailable reports that an operation needed Redis and Redis
	// is down; the coordinator keeps serving in-process meanwhile.
	ErrRedisUnavailable = store.ErrUnavailable
	// ErrClosed reports a call on a closed Coordinator.
	ErrClosed = errors.New("coordinator: closed")
)

// The kinds of ErrForbidden, for a door to tell its callers which one
// (a drop-in client does not carry a request outside every upstream, or
// with a credential its upstream refuses, but it must not route around a
// tenant's grants). An error of each kind is also ErrForbidden.
var (
	// ErrOutsideUpstreams: the url is outside every configured upstream.
	ErrOutsideUpstreams = errors.New("coordinator: outside every configured upstream")
	// ErrCallerCredentialsRefused: the request carries a caller's
	// credential and its upstream does not accept caller credentials.
	ErrCallerCredentialsRefused = errors.New("coordinator: caller credentials refused")
	// ErrNotGranted: the caller's Scope does not grant the upstream.
	ErrNotGranted = errors.New("coordinator: upstream not granted")
)

// kindError is err, also of kind: its message is err's alone.
type kindError struct{ err, kind error }

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.err, e.kind} }

// ofKind returns err as also being kind (errors.Is finds both).
func ofKind(err, kind error) error { return &kindError{err: err, kind: kind} }

// errorKind names a sentinel on the wire between instances, so that a
// follower on another instance gets the same class of error as the leader.
func errorKind(err error) string {
	switch {
	case errors.Is(err, ErrBreakerOpen):
		return "breaker_open"
	case errors.Is(err, ErrTooLarge):
		return "too_large"
	case errors.Is(err, ErrRateLimited):
		return "rate_limited"
	default:
		return "unavailable"
	}
}

// errorFromKind rebuilds an error published by another instance.
func errorFromKind(kind, msg string) error {
	var base error
	switch kind {
	case "breaker_open":
		base = ErrBreakerOpen
	case "too_large":
		base = ErrTooLarge
	case "rate_limited":
		base = ErrRateLimited
	default:
		base = ErrUnavailable
	}
	if msg == "" {
		return base
	}
	return fmt.Errorf("%w (from leader: %s)", base, msg)
}

// RetryAfterError wraps an error with how long the caller should wait
// before asking again: until the breaker turns half-open, or until the next
// rate-limit slot. The server passes it on as a RetryInfo status detail.
type RetryAfterError = upstream.RetryAfterError
