package drain_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/drain"
)

// server is a drain.Server whose calls in progress end when finish is
// closed; it records what Drain did.
type server struct {
	finish    chan struct{}
	shutdowns chan struct{} // closed by Shutdown
	closed    chan struct{} // closed by Close
}

func newServer() *server {
	return &server{finish: make(chan struct{}), shutdowns: make(chan struct{}), closed: make(chan struct{})}
}

func (s *server) Shutdown(ctx context.Context) error {
	close(s.shutdowns)
	select {
	case <-s.finish:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *server) Close() error {
	close(s.closed)
	return nil
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// drainAsync runs Drain in a goroutine and returns its result channel.
func drainAsync(hurry context.Context, s *server, delay, grace time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() { done <- drain.Drain(hurry, s, delay, grace) }()
	return done
}

// TestHurryEndsDelay: the delay (an hour) goes on serving until hurry
// ends; then the server stops at once, its calls in progress cut.
func TestHurryEndsDelay(t *testing.T) {
	s := newServer()
	hurry, cancel := context.WithCancel(context.Background())
	done := drainAsync(hurry, s, time.Hour, time.Hour)
	select {
	case <-s.shutdowns:
		t.Fatal("Shutdown during the delay")
	case err := <-done:
		t.Fatalf("Drain returned during the delay: %v", err)
	default:
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Drain = %v; want the calls cut by the hurry (context.Canceled)", err)
	}
	if !isClosed(s.shutdowns) || !isClosed(s.closed) {
		t.Fatal("the server was not shut down and closed")
	}
}

// TestCallsFinishWithinGrace: once the delay is over, calls in progress
// are let finish; the server is not cut.
func TestCallsFinishWithinGrace(t *testing.T) {
	s := newServer()
	done := drainAsync(context.Background(), s, 0, time.Hour)
	<-s.shutdowns
	close(s.finish)
	if err := <-done; err != nil {
		t.Fatalf("Drain = %v; want nil", err)
	}
	if isClosed(s.closed) {
		t.Fatal("Close called though every call finished")
	}
}

// TestGraceOverCuts: calls still in progress when the grace runs out are
// cut.
func TestGraceOverCuts(t *testing.T) {
	s := newServer()
	if err := drain.Drain(context.Background(), s, 0, time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Drain = %v; want the calls cut when the grace ran out", err)
	}
	if !isClosed(s.closed) {
		t.Fatal("Close not called when the grace ran out")
	}
}

// TestHurryCutsGrace: hurry during the grace cuts the calls at once.
func TestHurryCutsGrace(t *testing.T) {
	s := newServer()
	hurry, cancel := context.WithCancel(context.Background())
	done := drainAsync(hurry, s, 0, time.Hour)
	<-s.shutdowns
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Drain = %v; want the calls cut by the hurry", err)
	}
}
