package enginetest_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/testing/enginetest"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
)

// TestRecorderCountsFetchesAndFlights: a burst of one key starts one
// fetch and one flight, which ends; an Invalidate that detaches a running
// flight counts it gone once, not again when it ends. Single-node: no
// process needed.
func TestRecorderCountsFetchesAndFlights(t *testing.T) {
	up := fakeupstream.New(t)
	rec := enginetest.NewRecorder(nil)
	c, err := coordinator.New(coordinator.Config{
		Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: up.URL()}},
	}, coordinator.Options{Metrics: rec})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	get := func(path string) error {
		tg, err := c.Resolve(up.URL()+path, "")
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Get(context.Background(), tg, coordinator.GetOptions{})
		return err
	}
	waitFlights := func(want int64) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); rec.RunningFlights() != want; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("RunningFlights = %d; want %d", rec.RunningFlights(), want)
			}
		}
	}

	release := make(chan struct{})
	up.Set("/a", fakeupstream.Behavior{Block: release})
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			if err := get("/a"); err != nil {
				t.Errorf("get /a: %v", err)
			}
		})
	}
	if err := up.WaitCount(context.Background(), "/a", 1); err != nil {
		t.Fatal(err)
	}
	if got := rec.RunningFlights(); got != 1 {
		t.Errorf("RunningFlights during the burst = %d; want 1", got)
	}
	close(release)
	wg.Wait()
	waitFlights(0)
	if got := rec.Fetches(); got != 1 {
		t.Errorf("Fetches after the burst = %d; want 1", got)
	}

	// Invalidate detaches a running flight: -1 then, nothing when it ends.
	release = make(chan struct{})
	up.Set("/b", fakeupstream.Behavior{Block: release})
	done := make(chan error, 1)
	go func() { done <- get("/b") }()
	if err := up.WaitCount(context.Background(), "/b", 1); err != nil {
		t.Fatal(err)
	}
	tg, err := c.Resolve(up.URL()+"/b", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Invalidate(context.Background(), tg); err != nil {
		t.Fatal(err)
	}
	if got := rec.RunningFlights(); got != 0 {
		t.Errorf("RunningFlights after Invalidate = %d; want 0", got)
	}
	close(release)
	if err := <-done; err != nil {
		t.Errorf("get /b: %v", err)
	}
	if err := c.Close(); err != nil { // waits for the detached flight
		t.Fatal(err)
	}
	if got, fetches := rec.RunningFlights(), rec.Fetches(); got != 0 || fetches != 2 {
		t.Errorf("after Close: RunningFlights = %d, Fetches = %d; want 0, 2", got, fetches)
	}
}
