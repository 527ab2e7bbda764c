package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/httprender"
)

// toStatus chooses the gRPC status for an error from the coordinator: the
// only place that maps engine errors to codes. Refusals made before the
// engine is asked choose their own where they are made: auth.go
// (Unauthenticated), limits.go (the call cap), decode.go and server.go
// (malformed requests, a server stopping, a tenant without admin rights).
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	var c codes.Code
	switch {
	case errors.Is(err, coordinator.ErrInvalidArgument):
		c = codes.InvalidArgument
	case errors.Is(err, coordinator.ErrForbidden):
		c = codes.PermissionDenied
	case errors.Is(err, coordinator.ErrTooLarge):
		c = codes.FailedPrecondition
	case errors.Is(err, coordinator.ErrRateLimited):
		c = codes.ResourceExhausted
	case errors.Is(err, coordinator.ErrUnavailable),
		errors.Is(err, coordinator.ErrRedisUnavailable),
		errors.Is(err, coordinator.ErrClosed):
		c = codes.Unavailable
	case errors.Is(err, context.DeadlineExceeded):
		c = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		c = codes.Canceled
	default:
		c = codes.Internal
	}
	st := status.New(c, err.Error())
	var details []protoadapt.MessageV1
	if r := reasonOf(err); r != "" {
		// What the error is, for a client to act on without reading its
		// message (a drop-in's fallback, say).
		details = append(details, &errdetails.ErrorInfo{Reason: r, Domain: httprender.Domain})
	}
	var ra *coordinator.RetryAfterError
	if errors.As(err, &ra) {
		// Tell the client when asking again is worth it (breaker half-open,
		// next rate-limit slot), as Google's APIs do.
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(ra.After)})
	}
	if len(details) > 0 {
		if d, derr := st.WithDetails(details...); derr == nil {
			st = d
		}
	}
	return st.Err()
}

// reasonOf is the ErrorInfo reason of an engine error, or "".
func reasonOf(err error) string {
	switch {
	case errors.Is(err, coordinator.ErrOutsideUpstreams):
		return httprender.ReasonOutsideUpstreams
	case errors.Is(err, coordinator.ErrCallerCredentialsRefused):
		return httprender.ReasonCallerCredentialsRefused
	case errors.Is(err, coordinator.ErrNotGranted):
		return httprender.ReasonNotGranted
	case errors.Is(err, coordinator.ErrRateLimited):
		return httprender.ReasonRateLimited
	case errors.Is(err, coordinator.ErrBreakerOpen):
		return httprender.ReasonBreakerOpen
	case errors.Is(err, coordinator.ErrTooLarge):
		return httprender.ReasonTooLarge
	case errors.Is(err, coordinator.ErrUnavailable):
		return httprender.ReasonUpstreamUnavailable
	}
	return ""
}

// callerGone returns err as the caller's doing when the call's context ctx
// has ended: Canceled when the caller canceled or hung up, DeadlineExceeded
// when its deadline passed, whatever failed inside meanwhile (a Redis read
// cut short, say). Such calls are not coordd's errors: they log at DEBUG
// and stay out of the error ratio (docs/observability.md). err is kept in
// the message.
func callerGone(ctx context.Context, err error) error {
	if err == nil || ctx.Err() == nil {
		return err
	}
	if errors.Is(err, ctx.Err()) {
		return err
	}
	return fmt.Errorf("%w: %v", ctx.Err(), err)
}

// sendGoneWait bounds sendFailed's wait for the stream's context to end.
const sendGoneWait = 5 * time.Second

// sendFailed returns the status of a call whose Send to the caller failed
// with err. A Send fails when the stream is gone: the caller canceled or
// closed its connection (or a hard stop cut it). grpc-go then answers
// UNAVAILABLE "transport is closing" when the connection went, and cancels
// the stream's context an instant later (http2Server.Close closes the
// transport before it cancels its streams); it waits for that, bounded, so
// that a hang-up reads as Canceled like a cancel. Any other failure (a
// message over the size limit) is returned as is.
func sendFailed(ctx context.Context, err error) error {
	if status.Code(err) == codes.Unavailable {
		t := time.NewTimer(sendGoneWait)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	return err
}
