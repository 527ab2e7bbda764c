package enginetest

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
)

// Protected is a configuration with one upstream, u, named "fake" and
// protected by p, with a 300ms Redis timeout. Logs go to logs at info level
// when it is not nil, else nowhere.
func Protected(u *fakeupstream.Upstream, p coordinator.Protection, logs io.Writer) coordinator.Config {
	h := slog.Handler(slog.DiscardHandler)
	if logs != nil {
		h = slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})
	}
	return coordinator.Config{
		Upstreams:    []coordinator.Upstream{{Name: "fake", BaseURL: u.URL(), Protection: p}},
		RedisTimeout: 300 * time.Millisecond,
		Logger:       slog.New(h),
	}
}

// New returns a single-node coordinator (no Redis), closed when t ends.
func New(t testing.TB, cfg coordinator.Config) *coordinator.Coordinator {
	t.Helper()
	c, err := coordinator.New(cfg, coordinator.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Get gets url under key (empty: the url) from c, as a caller of the
// engine does: Resolve, then Get.
func Get(ctx context.Context, c *coordinator.Coordinator, url, key string, opt coordinator.GetOptions) (*coordinator.Result, error) {
	tg, err := c.Resolve(url, key)
	if err != nil {
		return nil, err
	}
	return c.Get(ctx, tg, opt)
}

// SyncBuffer is a bytes.Buffer safe for concurrent use: a log sink the
// engine writes from its goroutines while the test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer // protected by mu
}

// Write implements io.Writer.
func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
