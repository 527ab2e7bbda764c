package redistest_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/coordd/coordd/internal/testing/redistest"
)

// fastFail makes a client give up quickly and not retry, so fault tests
// see the fault on the first command.
func fastFail(o *redis.Options) {
	o.DialTimeout = 300 * time.Millisecond
	o.ReadTimeout = 300 * time.Millisecond
	o.WriteTimeout = 300 * time.Millisecond
	o.MaxRetries = -1
}

func TestStartServesOwnRedis(t *testing.T) {
	a := redistest.Start(t)
	b := redistest.Start(t, redistest.WithArgs("--maxmemory", "10mb"))
	if a.Addr() == b.Addr() {
		t.Fatalf("two servers share %s", a.Addr())
	}
	if strings.HasSuffix(a.Addr(), ":6379") {
		t.Fatalf("Addr() = %s; want a private port", a.Addr())
	}
	if got, want := a.URL(), "redis://"+a.Addr()+"/0"; got != want {
		t.Fatalf("URL() = %q; want %q", got, want)
	}
	opt, err := redis.ParseURL(a.URL())
	if err != nil || opt.Addr != a.Addr() || opt.DB != 0 {
		t.Fatalf("ParseURL(%q) = %+v, %v; want Addr %s DB 0", a.URL(), opt, err, a.Addr())
	}

	ctx := context.Background()
	ca, cb := a.Client(t), b.Client(t)
	if err := ca.Set(ctx, "k", "a", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if err := cb.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET k on the other server: err %v; want redis.Nil", err)
	}
	got, err := cb.ConfigGet(ctx, "maxmemory").Result()
	if err != nil || got["maxmemory"] != "10485760" {
		t.Fatalf("CONFIG GET maxmemory = %v, %v; want 10485760 (from WithArgs)", got, err)
	}
	for name, want := range map[string]string{"save": "", "appendonly": "no"} {
		got, err := ca.ConfigGet(ctx, name).Result()
		if err != nil || got[name] != want {
			t.Errorf("CONFIG GET %s = %v, %v; want %q", name, got, err, want)
		}
	}
	if !a.Running() {
		t.Errorf("Running() = false; want true")
	}
	if !strings.Contains(a.Output(), "Ready to accept connections") {
		t.Errorf("Output() lacks the ready line:\n%s", a.Output())
	}
}

func TestKillThenRestart(t *testing.T) {
	s := redistest.Start(t)
	c := s.Client(t, fastFail)
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}

	s.Kill()
	s.Kill() // idempotent
	if s.Running() {
		t.Fatalf("Running() after Kill = true; want false")
	}
	err := c.Ping(ctx).Err()
	if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.ECONNRESET) && !isEOF(err) {
		t.Fatalf("PING after Kill: err %v; want connection refused/reset", err)
	}

	s.Restart()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
	if err := c.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET k after Restart: err %v; want redis.Nil (data lost)", err)
	}

	// Restart of a running server also works, on the same address.
	addr := s.Addr()
	s.Restart()
	if s.Addr() != addr {
		t.Fatalf("Addr() after Restart = %s; want %s", s.Addr(), addr)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after second Restart: %v", err)
	}
}

func isEOF(err error) bool {
	return err != nil && strings.Contains(err.Error(), "EOF")
}

func TestPauseResume(t *testing.T) {
	s := redistest.Start(t)
	c := s.Client(t, fastFail)
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}

	s.Pause()
	s.Pause() // idempotent
	err := c.Ping(ctx).Err()
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("PING while paused: err %v; want a timeout", err)
	}

	// A command sent while paused is answered once resumed.
	slow := s.Client(t, func(o *redis.Options) { o.ReadTimeout = 10 * time.Second })
	s.Resume() // reconnect the slow client's pool while running
	if err := slow.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	s.Pause()
	res := make(chan error, 1)
	go func() { res <- slow.Set(ctx, "k", "v", 0).Err() }()
	select {
	case err := <-res:
		t.Fatalf("SET answered while paused: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	s.Resume()
	s.Resume() // idempotent
	if err := <-res; err != nil {
		t.Fatalf("SET queued during pause: %v", err)
	}
	if err := c.Get(ctx, "k").Err(); err != nil {
		t.Fatalf("GET after Resume: %v", err)
	}
}

func TestKillWhilePaused(t *testing.T) {
	s := redistest.Start(t)
	s.Pause()
	s.Kill()
	if s.Running() {
		t.Fatalf("Running() = true after Kill of a paused server")
	}
	s.Restart()
	if err := s.Client(t).Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
}

func TestStop(t *testing.T) {
	tests := []struct {
		name  string
		pause bool
	}{
		{"running", false},
		{"paused", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := redistest.Start(t)
			if tt.pause {
				s.Pause()
			}
			s.Stop()
			s.Stop() // idempotent
			if s.Running() {
				t.Fatalf("Running() after Stop = true")
			}
			if !strings.Contains(s.Output(), "ready to exit, bye bye") {
				t.Errorf("Stop was not graceful; output:\n%s", s.Output())
			}
		})
	}
}

func TestConcurrentFaults(t *testing.T) {
	s := redistest.Start(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 4 {
		wg.Go(func() {
			s.Pause()
			s.Resume()
			s.Kill()
			if err := s.TryRestart(); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := s.Client(t).Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING after concurrent faults: %v", err)
	}
}
