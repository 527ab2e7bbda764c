package server

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordd/coordd/coordinator"
)

// toStatus chooses the gRPC status for an error from the coordinator. This
// is the only place that chooses status codes.
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
	return status.Error(c, err.Error())
}
