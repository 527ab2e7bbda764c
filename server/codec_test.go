package server

import (
	"bytes"
	"runtime"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/document"
)

func TestFramesAreChunkMessages(t *testing.T) {
	for _, size := range []int{0, 1, 127, 128, ChunkSize - 1, ChunkSize, ChunkSize + 1, 3*ChunkSize + 17} {
		body := bytes.Repeat([]byte{0xab, 0x01}, size/2+1)[:size]
		d := &coordinator.Document{Body: body}
		fs := frames(d)
		var got []byte
		for i, f := range fs {
			var m coorddv1.GetOrFetchResponse
			if err := proto.Unmarshal(f.bufs.Materialize(), &m); err != nil {
				t.Fatalf("size %d frame %d: %v", size, i, err)
			}
			data := m.GetChunk().GetData()
			if len(data) == 0 || len(data) > ChunkSize {
				t.Fatalf("size %d frame %d: chunk of %d bytes", size, i, len(data))
			}
			// The frame is exactly what the proto codec would produce.
			want, _ := proto.Marshal(&coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Chunk{Chunk: &coorddv1.Chunk{Data: data}}})
			if !bytes.Equal(f.bufs.Materialize(), want) {
				t.Fatalf("size %d frame %d: wire form differs from proto.Marshal", size, i)
			}
			got = append(got, data...)
		}
		if !bytes.Equal(got, body) {
			t.Fatalf("size %d: reassembled body differs", size)
		}
		if again := frames(d); len(fs) > 0 && &again[0] != &fs[0] {
			t.Fatalf("size %d: frames rebuilt for the same document", size)
		}
	}
}

func TestFramesShareTheBody(t *testing.T) {
	body := make([]byte, 2*ChunkSize)
	fs := frames(&coordinator.Document{Body: body})
	data := fs[1].bufs[1].ReadOnlyData()
	if &data[0] != &body[ChunkSize] {
		t.Fatal("frame copies the body; want a slice of it")
	}
}

// TestFrameCacheForgetsCollectedDocuments: the cache builds a Document's
// frames once for every caller, and holds them no longer than the
// Document lives.
func TestFrameCacheForgetsCollectedDocuments(t *testing.T) {
	var c frameCache
	d := &coordinator.Document{Body: make([]byte, 3*ChunkSize)}
	fs := c.get(d)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if again := c.get(d); &again[0] != &fs[0] {
				t.Error("frames rebuilt for the same document")
			}
		})
	}
	wg.Wait()
	other := &coordinator.Document{Body: make([]byte, 1)}
	if c.get(other); c.len() != 2 {
		t.Fatalf("documents held = %d; want 2", c.len())
	}
	runtime.KeepAlive(d)
	d, fs = nil, nil
	// The cleanup runs after a GC finds d unreachable, on a goroutine of
	// its own: collect until it has (a cleanup that never runs fails).
	for deadline := time.Now().Add(10 * time.Second); c.len() != 1; {
		if time.Now().After(deadline) {
			t.Fatalf("documents held after d was collected = %d; want 1", c.len())
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	runtime.KeepAlive(other)
}

func TestEnumsShareNumbering(t *testing.T) {
	roles := map[coordinator.Role]coorddv1.Role{
		coordinator.RoleLeader: coorddv1.Role_ROLE_LEADER, coordinator.RoleFollower: coorddv1.Role_ROLE_FOLLOWER, coordinator.RoleHit: coorddv1.Role_ROLE_HIT,
	}
	for r, want := range roles {
		if got := progressPB(coordinator.Progress{Role: r}).GetRole(); got != want {
			t.Errorf("role %v → %v; want %v", r, got, want)
		}
	}
	stages := map[coordinator.Stage]coorddv1.Stage{
		coordinator.StageJoined: coorddv1.Stage_STAGE_JOINED, coordinator.StageFetching: coorddv1.Stage_STAGE_FETCHING,
		coordinator.StageWaitingLeader: coorddv1.Stage_STAGE_WAITING_LEADER, coordinator.StageRateLimited: coorddv1.Stage_STAGE_RATE_LIMITED,
		coordinator.StageRetrying: coorddv1.Stage_STAGE_RETRYING, coordinator.StageBreakerOpen: coorddv1.Stage_STAGE_BREAKER_OPEN,
		coordinator.StageServingStale: coorddv1.Stage_STAGE_SERVING_STALE, coordinator.StageDegraded: coorddv1.Stage_STAGE_DEGRADED,
	}
	for s, want := range stages {
		if got := progressPB(coordinator.Progress{Stage: s}).GetStage(); got != want {
			t.Errorf("stage %v → %v; want %v", s, got, want)
		}
	}
	if len(stages) != len(coorddv1.Stage_name)-1 {
		t.Errorf("proto has %d stages; the coordinator maps %d", len(coorddv1.Stage_name)-1, len(stages))
	}
}

// BenchmarkFrames measures what a caller pays to find a document's frames:
// hot, every caller of a document already framed (the fan-out's case);
// first, the first caller of each new 1 MiB document, which builds them.
func BenchmarkFrames(b *testing.B) {
	body := make([]byte, 1<<20)
	b.Run("hot", func(b *testing.B) {
		d := &coordinator.Document{Body: body}
		frames(d)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if len(frames(d)) != 16 {
					b.Fatal("wrong frames")
				}
			}
		})
	})
	b.Run("first", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if len(frames(&coordinator.Document{Body: body})) != 16 {
				b.Fatal("wrong frames")
			}
		}
	})
}

// TestMetadataWireIsProtoMarshal: a metadata message put together from a
// Document's pre-encoded fields and the call's own is exactly what
// proto.Marshal makes of the message built field by field.
func TestMetadataWireIsProtoMarshal(t *testing.T) {
	now := time.Unix(1_700_000_000, 123_456_789)
	docs := []*coordinator.Document{
		{},
		{Body: []byte("x"), StatusCode: 200, ContentType: "text/html; charset=utf-8", Key: "https://a.example/p", Upstream: "a",
			ETag: `"v1"`, LastModified: "Mon, 02 Jan 2006 15:04:05 GMT", FetchedAt: now.Add(-1500 * time.Millisecond), FreshUntil: now.Add(90 * time.Second),
			Header: []document.Header{{Name: "Cache-Control", Value: "max-age=90"}, {Name: "X-Empty"}}},
		{Body: make([]byte, 3*ChunkSize+5), StatusCode: 404, FetchedAt: now.Add(time.Hour), FreshUntil: now.Add(-time.Second)},      // fetched "later" (skew), stale
		{Body: make([]byte, 300), StatusCode: 200, FetchedAt: now.Add(-400 * 24 * time.Hour), FreshUntil: now.Add(time.Nanosecond)}, // a year old, ttl 1ns
	}
	for i, d := range docs {
		for _, src := range []coordinator.Source{coordinator.SourceL1, coordinator.SourceL2, coordinator.SourceUpstream, coordinator.Source(0)} {
			for _, flags := range []int{0, 1, 2, 3} {
				res := &coordinator.Result{Doc: d, Source: src, Stale: flags&1 != 0}
				private := flags&2 != 0
				want, err := proto.Marshal(metadataPB(res, private, now))
				if err != nil {
					t.Fatal(err)
				}
				f, ok := metadataMsg(res, private, now).(*frame)
				if !ok {
					t.Fatalf("doc %d: not pre-encoded", i)
				}
				if got := f.bufs.Materialize(); !bytes.Equal(got, want) {
					t.Errorf("doc %d source %v flags %d: wire form\n%x\nwant (proto.Marshal)\n%x", i, src, flags, got, want)
				}
			}
		}
	}
	// A field that does not encode: the message itself goes to the codec,
	// which fails as it did.
	bad := &coordinator.Document{ContentType: "\xff"}
	if _, ok := metadataMsg(&coordinator.Result{Doc: bad}, false, now).(*coorddv1.GetOrFetchResponse); !ok {
		t.Error("invalid UTF-8: pre-encoded; want the message, for the codec to refuse")
	}
}

func TestHitProgressFrame(t *testing.T) {
	want, _ := proto.Marshal(&coorddv1.GetOrFetchResponse{Event: &coorddv1.GetOrFetchResponse_Progress{Progress: &coorddv1.Progress{Role: coorddv1.Role_ROLE_HIT}}})
	if got := hitProgressFrame.bufs.Materialize(); !bytes.Equal(got, want) {
		t.Errorf("hit progress %x; want %x", got, want)
	}
}
