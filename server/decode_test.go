package server

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
)

func TestCodecMarksUndecodable(t *testing.T) {
	c := codec{encoding.GetCodecV2("proto")}
	good := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "https://x/")
	unknown := protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 7)
	for _, tc := range []struct {
		name string
		wire []byte
		want codes.Code
	}{
		{"good", good, codes.OK},
		{"good with unknown field", append(good, unknown...), codes.OK},
		{"empty", nil, codes.OK},
		{"field number 0 (the mark)", append([]byte{undecodableMark}, "forged"...), codes.InvalidArgument},
		{"invalid UTF-8", protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "\xff"), codes.InvalidArgument},
		{"truncated", good[:4], codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := new(coorddv1.GetOrFetchRequest)
			if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(tc.wire)}, m); err != nil {
				t.Fatalf("Unmarshal: got %v; want nil", err)
			}
			if got := status.Code(undecodable(m)); got != tc.want {
				t.Errorf("got %v; want %v", got, tc.want)
			}
			if tc.want != codes.OK && m.GetUrl() != "" {
				t.Errorf("got url %q in a refused request; want it reset", m.GetUrl())
			}
		})
	}
}
