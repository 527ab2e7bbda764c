package server_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/enginetest"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/redistest"
)

// The upstream protection tests that check what a gRPC caller sees (status
// codes, RetryInfo details); the engine's own protection tests are in
// coordinator/protection_test.go.

// TestBreakerSharedAcrossInstances: an upstream that always fails opens
// the breaker through instance A; both instances then fail fast without
// calling it. Once it recovers, half-open lets exactly one probe through at
// a time, across instances, and closes after close_after (2) successes.
func TestBreakerSharedAcrossInstances(t *testing.T) {
	const openFor = time.Second
	u := fakeupstream.New(t)
	rs := redistest.Start(t)
	var logs enginetest.SyncBuffer
	cfg := enginetest.Protected(u, coordinator.Protection{
		Retry:   coordinator.RetryPolicy{MaxAttempts: 1},
		Breaker: coordinator.BreakerPolicy{FailureThreshold: 3, FailureRate: -1, OpenFor: openFor},
	}, &logs)
	a := fleettest.Start(t, fleettest.Options{RedisURL: rs.URL(), Config: cfg})
	b := fleettest.Start(t, fleettest.Options{RedisURL: rs.URL(), Config: cfg})
	ins := []*fleettest.Instance{a, b}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := 0
	next := func() string { n++; return fmt.Sprintf("%s/k%d", u.URL(), n) }

	u.Set(fakeupstream.AllPaths, fakeupstream.Status(http.StatusServiceUnavailable))
	for range 3 {
		_, err := enginetest.Get(ctx, a.Coordinator, next(), "", coordinator.GetOptions{})
		if !errors.Is(err, coordinator.ErrUnavailable) || errors.Is(err, coordinator.ErrBreakerOpen) {
			t.Fatalf("closed breaker, failing upstream: err = %v; want ErrUnavailable", err)
		}
	}
	// Open: both instances fail at once, without a request.
	// Failing fast is shown by the error (ErrBreakerOpen, not a timeout) and
	// by the upstream count below, not by a wall-clock bound.
	for _, in := range ins {
		var told bool
		_, err := enginetest.Get(ctx, in.Coordinator, next(), "", coordinator.GetOptions{Progress: func(p coordinator.Progress) {
			told = told || p.Stage == coordinator.StageBreakerOpen
		}})
		if !errors.Is(err, coordinator.ErrBreakerOpen) {
			t.Fatalf("open breaker: err = %v; want ErrBreakerOpen", err)
		}
		if !told {
			t.Error("open breaker: no StageBreakerOpen progress")
		}
	}
	_, err := fleettest.Get(ctx, b.Dial(t), &coorddv1.GetOrFetchRequest{Url: next()})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("open breaker over gRPC: %v; want UNAVAILABLE", err)
	}
	var retryIn time.Duration
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			retryIn = ri.GetRetryDelay().AsDuration()
		}
	}
	if retryIn <= 0 || retryIn > openFor {
		t.Errorf("open breaker over gRPC: RetryInfo delay %v; want the time until half-open, in (0, %v]", retryIn, openFor)
	}
	if got := u.Total(); got != 3 {
		t.Fatalf("upstream requests = %d; want 3 (none while open)", got)
	}

	// probeRound has 2·per calls (per on each instance) at once against a
	// recovered but held upstream: exactly one gets through.
	probeRound := func(per int) {
		t.Helper()
		release := make(chan struct{})
		u.Set(fakeupstream.AllPaths, fakeupstream.Behavior{Block: release})
		before := u.Total()
		errs := make(chan error, 2*per)
		for _, in := range ins {
			for range per {
				url := next()
				go func() {
					_, err := enginetest.Get(ctx, in.Coordinator, url, "", coordinator.GetOptions{})
					errs <- err
				}()
			}
		}
		for range 2*per - 1 {
			if err := <-errs; !errors.Is(err, coordinator.ErrBreakerOpen) {
				t.Fatalf("half-open, probe under way: err = %v; want ErrBreakerOpen", err)
			}
		}
		// Every other call has failed: the probe is the only one left, and
		// its request arrives soon.
		for deadline := time.Now().Add(5 * time.Second); u.Total() == before && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		if got := u.Total() - before; got != 1 {
			t.Fatalf("half-open: %d requests reached the upstream; want 1 probe", got)
		}
		close(release)
		if err := <-errs; err != nil {
			t.Fatalf("probe: %v", err)
		}
	}
	time.Sleep(openFor + 100*time.Millisecond) // open → half-open
	probeRound(3)
	probeRound(2) // one success of two: still half-open

	// Closed: every call reaches the upstream.
	u.Clear(fakeupstream.AllPaths)
	before := u.Total()
	var wg sync.WaitGroup
	for _, in := range ins {
		for range 3 {
			url := next()
			wg.Go(func() {
				if _, err := enginetest.Get(ctx, in.Coordinator, url, "", coordinator.GetOptions{}); err != nil {
					t.Errorf("closed again: %v", err)
				}
			})
		}
	}
	wg.Wait()
	if got := u.Total() - before; got != 6 {
		t.Errorf("closed again: %d requests reached the upstream; want 6", got)
	}
	for _, want := range []string{`"circuit breaker open"`, `"circuit breaker half-open"`, `"circuit breaker closed"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no %s in the logs:\n%s", want, logs.String())
		}
	}
}

// TestRateLimitDeadline: a caller whose deadline ends before its slot gets
// RESOURCE_EXHAUSTED at once; one whose deadline allows waits and gets it.
func TestRateLimitDeadline(t *testing.T) {
	u := fakeupstream.New(t)
	in := fleettest.Start(t, fleettest.Options{Config: enginetest.Protected(u, coordinator.Protection{RateLimit: 1}, nil)})
	cl := in.Dial(t)
	get := func(path string, timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_, err := fleettest.Get(ctx, cl, &coorddv1.GetOrFetchRequest{Url: u.URL() + path})
		return err
	}
	if err := get("/x1", 5*time.Second); err != nil {
		t.Fatal(err) // takes the slot; the next one is 1s away
	}
	// RESOURCE_EXHAUSTED, not DEADLINE_EXCEEDED: refused at once rather
	// than left to wait out its deadline.
	if err := get("/x2", 300*time.Millisecond); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("slot past the deadline: %v; want RESOURCE_EXHAUSTED", err)
	}
	if err := get("/x3", 5*time.Second); err != nil {
		t.Errorf("slot within the deadline: %v", err)
	}
	if got := u.Count("/x2"); got != 0 {
		t.Errorf("the refused call reached the upstream %d times", got)
	}
}
