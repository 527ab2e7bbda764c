package store

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/testing/redistest"
)

// BenchmarkColdClaim is a leader's look at Redis before its fetch, on a
// cold id: "3trips" as it was (GetDoc, the lock, GetDoc again under the
// lock), "claim" as it is (one script). Each run releases the lock, so
// every iteration is cold.
func BenchmarkColdClaim(b *testing.B) {
	srv := redistest.Start(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := Start(ctx, srv.Client(b), Config{Prefix: "bench:", Timeout: 5 * time.Second, RetryInterval: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer r.Wait()
	defer cancel()
	rdb := srv.Client(b)
	for _, mode := range []string{"3trips", "claim"} {
		b.Run(mode, func(b *testing.B) {
			i := 0
			for b.Loop() {
				i++
				id := fmt.Sprintf("https://example.org/%s/%d", mode, i)
				var l *Lease
				if mode == "claim" {
					l = r.Claim(ctx, id, time.Minute, true).Lease
				} else {
					_, _, _ = r.GetDoc(ctx, id)
					l, _, _ = r.TryLock(ctx, id, time.Minute)
					_, _, _ = r.GetDoc(ctx, id)
				}
				if l == nil {
					b.Fatal("no lease")
				}
				b.StopTimer()
				l.StopWatchdog()
				_ = rdb.Del(ctx, r.lockKey(id)).Err()
				b.StartTimer()
			}
		})
	}
}
