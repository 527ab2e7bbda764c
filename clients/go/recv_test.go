package coordd

import (
	"bytes"
	"errors"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
)

func chunkMsg(data []byte) *coorddv1.GetOrFetchResponse {
	return &coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Chunk{Chunk: &coorddv1.Chunk{Data: data}}}
}

// split cuts b into a BufferSlice at the given offsets, as gRPC's
// transport hands over a message received in several HTTP/2 frames.
func split(b []byte, at ...int) mem.BufferSlice {
	var bs mem.BufferSlice
	prev := 0
	for _, i := range at {
		bs = append(bs, mem.SliceBuffer(b[prev:i]))
		prev = i
	}
	return append(bs, mem.SliceBuffer(b[prev:]))
}

func TestChunkFieldNumbers(t *testing.T) {
	data := []byte("abc")
	var want []byte
	want = protowire.AppendTag(want, responseChunkField, protowire.BytesType)
	want = protowire.AppendVarint(want, uint64(2+len(data)))
	want = protowire.AppendTag(want, chunkDataField, protowire.BytesType)
	want = protowire.AppendBytes(want, data)
	got, err := proto.Marshal(chunkMsg(data))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("proto.Marshal(chunk) = %x; want %x", got, want)
	}
	if int(got[0]) != chunkTag {
		t.Errorf("first byte %#x; want chunkTag %#x", got[0], chunkTag)
	}
}

// TestChunkDataAcrossBuffers locates and copies the data of chunk
// messages cut into two and three buffers at every possible place.
func TestChunkDataAcrossBuffers(t *testing.T) {
	for _, size := range []int{1, 5, 127, 128, 300} {
		data := bytes.Repeat([]byte("0123456789"), size/10+1)[:size]
		wire, _ := proto.Marshal(chunkMsg(data))
		for i := 0; i <= len(wire); i++ {
			for _, at := range [][]int{{i}, {i / 2, i}} {
				raw := split(wire, at...)
				off, n, ok := chunkData(raw)
				if !ok || n != size {
					t.Fatalf("size %d, cut at %v: chunkData = %d, %d, %v; want %d bytes", size, at, off, n, ok, size)
				}
				got := make([]byte, n)
				copyFrom(got, raw, off)
				if !bytes.Equal(got, data) {
					t.Fatalf("size %d, cut at %v: copied %q; want %q", size, at, got, data)
				}
			}
		}
	}
}

func TestChunkDataOtherShapes(t *testing.T) {
	marshal := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	withUnknown := &coorddv1.Chunk{Data: []byte("abcd")}
	withUnknown.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 15, protowire.VarintType), 1))
	good := marshal(chunkMsg([]byte("abcd")))
	tests := []struct {
		name string
		wire []byte
	}{
		{"empty", nil},
		{"chunk without data", marshal(chunkMsg(nil))},
		{"unknown field in chunk", marshal(&coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Chunk{Chunk: withUnknown}})},
		{"chunk repeated", append(append([]byte{}, good...), good...)},
		{"truncated", good[:len(good)-1]},
		{"metadata", marshal(&coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Metadata{Metadata: &coorddv1.Metadata{Size: 4}}})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if off, n, ok := chunkData(split(tt.wire)); ok {
				t.Errorf("chunkData(%x) = %d, %d, true; want false", tt.wire, off, n)
			}
		})
	}
}

// TestGrow checks a body that outgrows its preallocation: it grows, never
// past the announced size, and refuses a byte more.
func TestGrow(t *testing.T) {
	d := &Document{Metadata: &coorddv1.Metadata{Size: 10}, Body: make([]byte, 0, 4)}
	var want []byte
	for i := range 3 {
		part := bytes.Repeat([]byte{byte('a' + i)}, 3)
		if err := d.appendData(part); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		want = append(want, part...)
		if cap(d.Body) > 10 {
			t.Fatalf("append %d: cap %d; want at most the announced 10", i, cap(d.Body))
		}
	}
	if err := d.appendData([]byte("x")); err != nil {
		t.Fatalf("last byte: %v", err)
	}
	want = append(want, 'x')
	if !bytes.Equal(d.Body, want) {
		t.Errorf("body = %q; want %q", d.Body, want)
	}
	if err := d.appendData([]byte("y")); !errors.Is(err, ErrBadStream) {
		t.Errorf("byte past the size: err = %v; want ErrBadStream", err)
	}
}
