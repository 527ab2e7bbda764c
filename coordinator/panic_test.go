package coordinator_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/coordd/coordd/coordinator"
)

// panickingTransport panics on every request, as a bug under a flight
// would.
type panickingTransport struct{}

func (panickingTransport) RoundTrip(*http.Request) (*http.Response, error) {
	panic("transport bug")
}

// syncBuffer is a bytes.Buffer safe for the engine's goroutines to log to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestFlightPanicLogsStack: a panic under a flight answers its callers
// ErrUnavailable, and the log carries the panic's value and the stack
// where it happened, so that the bug can be found.
func TestFlightPanicLogsStack(t *testing.T) {
	var logs syncBuffer
	c, err := coordinator.New(coordinator.Config{
		Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: "http://upstream.invalid"}},
		Logger:    slog.New(slog.NewTextHandler(&logs, nil)),
	}, coordinator.Options{Transport: panickingTransport{}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := get(t, context.Background(), c, "http://upstream.invalid/a"); !errors.Is(err, coordinator.ErrUnavailable) {
		t.Fatalf("Get err = %v; want ErrUnavailable", err)
	}
	out := logs.String()
	for _, want := range []string{"flight panicked", "transport bug", "panickingTransport.RoundTrip", "panic_test.go"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}
