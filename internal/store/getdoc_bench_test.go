package store

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/document"
	"github.com/coordd/coordd/internal/testing/redistest"
)

// BenchmarkGetDoc reads a document of each size from L2, as a flight does
// once per document (not once per caller): the cost of its body's copy
// out of go-redis's string.
func BenchmarkGetDoc(b *testing.B) {
	srv := redistest.Start(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := Start(ctx, srv.Client(b), Config{Prefix: "bench:", Timeout: 5 * time.Second, RetryInterval: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer r.Wait()
	defer cancel()
	now := time.Now()
	for _, size := range []int{1 << 10, 100 << 10, 1 << 20} {
		d := &document.Document{Key: fmt.Sprint(size), URL: fmt.Sprint(size), StatusCode: 200, FetchedAt: now, FreshUntil: now.Add(time.Hour), StaleUntil: now.Add(time.Hour), Body: bytes.Repeat([]byte("x"), size)}
		id := d.ID()
		if err := srv.Client(b).Set(ctx, r.docKey(id), d.Encode(), time.Hour).Err(); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(size))
			for b.Loop() {
				if got, _, _ := r.GetDoc(ctx, id); got == nil {
					b.Fatal("no document")
				}
			}
		})
	}
}
