package server

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	middleware "github.com/grpc-ecosystem/go-grpc-middleware/v2"

	"github.com/coordd/coordd/internal/logctx"
	"github.com/coordd/coordd/internal/requestid"
)

// RequestIDHeader is the metadata key of a call's request id. A caller may
// send one (at most 128 visible ASCII characters); otherwise coordd makes
// one up. Either way it is sent back in the response header, and every
// log line of the call carries it as request_id, with the cache key as
// key once known, when the logger's handler is a logctx.Handler.
const RequestIDHeader = "x-request-id"

// requestID returns the caller's request id from ctx's metadata, if
// valid, or a new random one.
func requestID(ctx context.Context) string {
	// ValueFromIncomingContext copies the one key's values, not the
	// whole metadata as FromIncomingContext does.
	if v := metadata.ValueFromIncomingContext(ctx, RequestIDHeader); len(v) > 0 && validRequestID(v[0]) {
		return v[0]
	}
	return requestid.New()
}

func validRequestID(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// withRequestID starts the call's log attributes with its request id.
func withRequestID(ctx context.Context) (context.Context, string) {
	id := requestID(ctx)
	return logctx.New(ctx, "request_id", id), id
}

func requestIDUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	ctx, id := withRequestID(ctx)
	_ = grpc.SetHeader(ctx, metadata.Pairs(RequestIDHeader, id))
	return next(ctx, req)
}

func requestIDStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, next grpc.StreamHandler) error {
	growStack(1) // first: the stack is shallowest here
	w := middleware.WrapServerStream(ss)
	var id string
	w.WrappedContext, id = withRequestID(ss.Context())
	_ = ss.SetHeader(metadata.Pairs(RequestIDHeader, id))
	return next(srv, w)
}
