package server

import (
	"context"
	"path"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// The interceptors below log one line per finished call, with the field
// names of go-grpc-middleware's logging interceptor ("finished call",
// grpc.service, grpc.method, grpc.code, grpc.time_ms, peer.address,
// grpc.error).
// Hand-rolled because that interceptor builds its fields when each call
// starts, whatever the level its end will log at: successful calls, the
// hot path, log at DEBUG, usually disabled, and here cost a clock read and
// a level check.

func (l *callLogger) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := next(ctx, req)
	l.finished(ctx, info.FullMethod, "unary", start, err)
	return resp, err
}

func (l *callLogger) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) error {
	start := time.Now()
	err := next(srv, ss)
	l.finished(ss.Context(), info.FullMethod, "server_stream", start, err)
	return err
}

// finished logs a call's line, if its level is enabled.
func (l *callLogger) finished(ctx context.Context, fullMethod, kind string, start time.Time, err error) {
	code := status.Code(err)
	lvl := callLevel(code)
	if !l.enabled(ctx, lvl) {
		return
	}
	service, method := path.Split(fullMethod)
	fields := []any{
		"protocol", "grpc", "grpc.component", "server",
		"grpc.service", path.Clean(service)[1:], "grpc.method", method, "grpc.method_type", kind,
		"grpc.start_time", start.Format(time.RFC3339), "grpc.code", code.String(),
		"grpc.time_ms", float64(time.Since(start).Microseconds()) / 1000,
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		fields = append(fields, "peer.address", p.Addr.String())
	}
	if err != nil {
		fields = append(fields, "grpc.error", err.Error())
	}
	l.Log(ctx, lvl, "finished call", fields...)
}
