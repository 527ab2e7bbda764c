package server

import (
	"testing"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/grpc/codes"
)

func TestCallLevel(t *testing.T) {
	for _, tc := range []struct {
		code codes.Code
		want logging.Level
	}{
		{codes.OK, logging.LevelDebug},
		{codes.InvalidArgument, logging.LevelInfo},
		{codes.Canceled, logging.LevelDebug},
		{codes.PermissionDenied, logging.LevelWarn},
		{codes.ResourceExhausted, logging.LevelWarn},
		{codes.Unimplemented, logging.LevelWarn},
		{codes.Internal, logging.LevelError},
		{codes.Unknown, logging.LevelError},
		{codes.Unavailable, logging.LevelWarn},
	} {
		if got := callLevel(tc.code); got != tc.want {
			t.Errorf("%v: got %v; want %v", tc.code, got, tc.want)
		}
	}
}

func TestFieldCode(t *testing.T) {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		got, ok := fieldCode([]any{"grpc.method", "X", "grpc.code", c.String()})
		if !ok || got != c {
			t.Errorf("got %v, %v; want %v, true", got, ok, c)
		}
	}
	if _, ok := fieldCode([]any{"grpc.method", "X"}); ok {
		t.Error("found a code in fields without one")
	}
}
