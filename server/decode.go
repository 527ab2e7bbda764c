package server

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// undecodableMark starts the unknown fields of a request that did not
// decode, followed by the decoder's error. No decoded message can hold it:
// a zero byte would be a tag of field number 0, which the decoder refuses.
// The mark travels in the message because grpc-go gives the codec nothing
// else (no context) to carry it in, and a table keyed by message would
// leak the entries of calls that end before an interceptor reads them.
const undecodableMark = 0x00

// maxDecodeErr bounds the decoder's error kept in the mark.
const maxDecodeErr = 200

func markUndecodable(m proto.Message, err error) {
	msg := err.Error()
	m.ProtoReflect().SetUnknown(append([]byte{undecodableMark}, msg[:min(len(msg), maxDecodeErr)]...))
}

// undecodable returns an INVALID_ARGUMENT status if m was marked by
// markUndecodable, nil otherwise.
func undecodable(m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil
	}
	u := pm.ProtoReflect().GetUnknown()
	if len(u) == 0 || u[0] != undecodableMark {
		return nil
	}
	return status.Errorf(codes.InvalidArgument, "request does not decode: %s", u[1:])
}

// refuseUndecodableUnary refuses a unary call whose request did not decode.
func refuseUndecodableUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := undecodable(req); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// refuseUndecodableStream makes every message received on a stream that
// did not decode an INVALID_ARGUMENT error of RecvMsg.
func refuseUndecodableStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, decodedStream{ss})
}

type decodedStream struct{ grpc.ServerStream }

func (s decodedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return undecodable(m)
}
