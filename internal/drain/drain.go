// Package drain stops a server that has been taken out of rotation: the
// one drain of coordd's gRPC server, its HTTP door and mdn-mcp.
package drain

import (
	"context"
	"fmt"
	"time"
)

// Server is what Drain stops; *http.Server is one.
type Server interface {
	// Shutdown stops accepting and returns nil once every call in
	// progress has ended, or ctx's error when ctx ends first.
	Shutdown(ctx context.Context) error
	// Close cuts the calls still in progress. Drain calls it only after
	// a Shutdown that failed.
	Close() error
}

// Drain goes on serving with s for delay, while the balancers, told by
// the caller (health NOT_SERVING), stop routing here; then shuts s down,
// letting the calls in progress finish within grace, and cuts those left
// after it. When hurry ends, the delay and the grace end at once: s stops
// now, cutting the calls in progress. Drain returns when s has stopped:
// nil if every call finished, else an error saying they were cut.
func Drain(hurry context.Context, s Server, delay, grace time.Duration) error {
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-hurry.Done():
			t.Stop()
		}
	}
	ctx, cancel := context.WithTimeout(hurry, grace)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		_ = s.Close()
		return fmt.Errorf("calls still in flight after the %v grace were cut: %w", grace, err)
	}
	return nil
}
