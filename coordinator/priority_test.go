package coordinator

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/testing/fakeupstream"
)

// TestFlightBackgroundWhileNoCallerWaits: a flight is background work
// (upstream.FetchRequest.Background) while only background calls wait
// for it, or none (a stale-while-revalidate refresh); an interactive
// caller joining makes it interactive, and leaving makes it background
// again.
func TestFlightBackgroundWhileNoCallerWaits(t *testing.T) {
	u := fakeupstream.New(t)
	release := make(chan struct{})
	u.Set("/doc", fakeupstream.Behavior{Block: release})
	u.Set("/swr", fakeupstream.Behavior{Block: release})
	c, err := New(Config{Upstreams: []Upstream{{Name: "fake", BaseURL: u.URL()}}, Logger: slog.New(slog.DiscardHandler)}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	defer close(release)
	flightOf := func(tg Target) *flight {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.flights[tg.flightKey()]
	}
	// signal returns a Progress func that closes ch on stage, once.
	signal := func(stage Stage, ch chan struct{}) func(Progress) {
		return func(p Progress) {
			if p.Stage == stage {
				select {
				case <-ch:
				default:
					close(ch)
				}
			}
		}
	}

	tg, err := c.Resolve(u.URL()+"/doc", "")
	if err != nil {
		t.Fatal(err)
	}
	fetching := make(chan struct{})
	bgDone := make(chan error, 1)
	go func() {
		_, err := c.Get(context.Background(), tg, GetOptions{Background: true, Progress: signal(StageFetching, fetching)})
		bgDone <- err
	}()
	<-fetching
	f := flightOf(tg)
	if !f.background() {
		t.Fatal("a flight only a background call waits for is interactive")
	}

	ctx, cancel := context.WithCancel(context.Background())
	joined := make(chan struct{})
	fgDone := make(chan error, 1)
	go func() {
		_, err := c.Get(ctx, tg, GetOptions{Progress: signal(StageJoined, joined)})
		fgDone <- err
	}()
	<-joined
	if f.background() {
		t.Fatal("a flight an interactive caller joined is still background")
	}
	cancel()
	if err := <-fgDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("interactive caller: %v; want context.Canceled", err)
	}
	if !f.background() {
		t.Fatal("the interactive caller left, and the flight is not background again")
	}

	// A stale-while-revalidate refresh: nobody waits.
	swr, err := c.Resolve(u.URL()+"/swr", "")
	if err != nil {
		t.Fatal(err)
	}
	if f, _ := c.join(context.Background(), swr, nil, time.Time{}, false); !f.background() {
		t.Fatal("a refresh nobody waits for is interactive")
	}
}
