package server

import (
	"context"
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/coordd/coordd/coordinator"
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
	var ra *coordinator.RetryAfterError
	if errors.As(err, &ra) {
		// Tell the client when asking again is worth it (breaker half-open,
		// next rate-limit slot), as Google's APIs do.
		if d, derr := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(ra.After)}); derr == nil {
			st = d
		}
	}
	return st.Err()
}
