package server_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/server"
)

// Past max_concurrent_calls a call fails at once with RESOURCE_EXHAUSTED and
// reaches no upstream; health is exempt; once calls end, calls succeed again.
func TestMaxConcurrentCalls(t *testing.T) {
	const limit = 5
	u := fakeupstream.New(t)
	release := make(chan struct{})
	u.Set(fakeupstream.AllPaths, fakeupstream.Behavior{Block: release})
	in := fleettest.Start(t, fleettest.Options{
		Config: coordinator.Config{
			Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: u.URL()}},
			Logger:    slog.New(slog.DiscardHandler),
		},
		Server: server.Config{MaxConcurrentCalls: limit},
	})
	cl := in.Dial(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	releaseOnce := sync.OnceFunc(func() { close(release) })
	defer releaseOnce()

	// hold starts limit calls under prefix and returns once each is in
	// progress at the upstream; their outcomes arrive on the channel.
	hold := func(prefix string) <-chan error {
		done := make(chan error, limit)
		for i := range limit {
			go func() {
				_, err := fleettest.Get(ctx, cl, &coorddv1.GetOrFetchRequest{Url: fmt.Sprintf("%s%s%d", u.URL(), prefix, i)})
				done <- err
			}()
		}
		for i := range limit {
			if err := u.WaitCount(ctx, fmt.Sprintf("%s%d", prefix, i), 1); err != nil {
				t.Fatalf("call %s%d never reached the upstream: %v", prefix, i, err)
			}
		}
		return done
	}
	held := hold("/held/")

	// One more call of each method is refused without reaching the upstream.
	extra := []struct {
		name, path string
		call       func(url string) error
	}{
		{"GetOrFetch", "/extra/get", func(url string) error {
			_, err := fleettest.Get(ctx, cl, &coorddv1.GetOrFetchRequest{Url: url})
			return err
		}},
		{"Invalidate", "/extra/invalidate", func(url string) error {
			_, err := cl.Invalidate(ctx, &coorddv1.InvalidateRequest{Url: url})
			return err
		}},
	}
	for _, tc := range extra {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() { done <- tc.call(u.URL() + tc.path) }()
			reached := make(chan error, 1)
			waitCtx, stop := context.WithCancel(ctx)
			defer stop()
			go func() { reached <- u.WaitCount(waitCtx, tc.path, 1) }()
			select {
			case err := <-done:
				if got := status.Code(err); got != codes.ResourceExhausted {
					t.Errorf("got %v (%v); want %v", got, err, codes.ResourceExhausted)
				}
			case <-reached:
				t.Fatal("the call past the limit reached the upstream; want it refused")
			}
		})
	}
	// Health is neither counted nor refused.
	cc, err := grpc.NewClient(in.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("health check at the limit: got %v; want OK", err)
	}

	// Once the held calls end, their slots are free again: limit new calls
	// are in progress at once.
	releaseOnce()
	for range limit {
		if err := <-held; err != nil {
			t.Errorf("held call: got %v; want OK", err)
		}
	}
	again := make(chan struct{})
	u.Set(fakeupstream.AllPaths, fakeupstream.Behavior{Block: again})
	held = hold("/again/")
	close(again)
	for range limit {
		if err := <-held; err != nil {
			t.Errorf("call after release: got %v; want OK", err)
		}
	}
	if _, err := cl.Invalidate(ctx, &coorddv1.InvalidateRequest{Url: u.URL() + "/extra/invalidate"}); err != nil {
		t.Errorf("Invalidate after release: got %v; want OK", err)
	}
	for _, tc := range extra {
		if n := u.Count(tc.path); n != 0 {
			t.Errorf("upstream got %d requests for %s; want 0", n, tc.path)
		}
	}
}
