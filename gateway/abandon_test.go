package gateway_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/coordd/coordd/gateway"
	"github.com/coordd/coordd/internal/testing/enginetest"
	"github.com/coordd/coordd/internal/testing/fakemcp"
	"github.com/coordd/coordd/internal/testing/testclock"
)

// lookupOn calls lookup(q) on s and returns its text, failing on an error.
func lookupOn(t *testing.T, s *mcp.ClientSession, q string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "lookup", Arguments: map[string]any{"q": q}})
	if err != nil {
		t.Fatalf("lookup(%s): %v", q, err)
	}
	if r.IsError {
		t.Fatalf("lookup(%s): tool error %q", q, text(t, r))
	}
	return text(t, r)
}

// TestStaleWhileRevalidate: a kept result past its ttl is served stale
// at once, and refreshed in the background by one execution although
// its caller has gone; the refreshed copy then serves every instance.
func TestStaleWhileRevalidate(t *testing.T) {
	fm := fakemcp.Start(t, fakemcp.Options{Token: "remote-token-0123456789"})
	s := remote(t, fm.URL)
	s.TTL, s.StaleTTL = time.Minute, time.Hour
	clock := testclock.New(time.Now())
	in := fleetWith(t, 2, []gateway.Server{s}, gateway.Options{}, nil, clock.Now)
	a := agent(t, in[0].url+"/mcp/docs", nil)
	b := agent(t, in[1].url+"/mcp/docs", nil)
	if got := lookupOn(t, a, "q"); got != "answer to q" {
		t.Fatalf("first call: %q", got)
	}
	clock.Advance(2 * time.Minute) // past the ttl, within the stale ttl
	if got := lookupOn(t, a, "q"); got != "answer to q" {
		t.Fatalf("stale call: %q", got)
	}
	waitFor(t, func() bool { return fm.ExecutionsOf("q") == 2 && len(enginetest.Flights(in[0].co)) == 0 })
	for i, sess := range []*mcp.ClientSession{a, b, a, b} {
		if got := lookupOn(t, sess, "q"); got != "answer to q" {
			t.Fatalf("call %d after the refresh: %q", i, got)
		}
	}
	if n := fm.ExecutionsOf("q"); n != 2 {
		t.Fatalf("executions = %d; want 2 (the first and one refresh)", n)
	}
}

// holdCall is one agent's call of the remote server's hold tool.
type holdCall struct {
	cancel context.CancelFunc
	done   chan error
	res    *mcp.CallToolResult
}

// wait returns the call's error, failing the test if it has not ended
// within a minute.
func (h *holdCall) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-h.done:
		return err
	case <-time.After(time.Minute):
		t.Fatal("the call did not end within a minute")
		return nil
	}
}

func startHold(s *mcp.ClientSession, q string) *holdCall {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	h := &holdCall{cancel: cancel, done: make(chan error, 1)}
	go func() {
		r, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "hold", Arguments: map[string]any{"q": q}})
		if err == nil && r.IsError {
			err = fmt.Errorf("tool error: %v", r.Content)
		}
		h.res = r
		h.done <- err
	}()
	return h
}

// waitingElsewhere counts the instances that have said, in Redis, that
// callers of theirs wait on an execution another instance runs.
func waitingElsewhere(t *testing.T, in *instance) int {
	t.Helper()
	rdb := in.rd.Client(t)
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, "*mcp-waiting:*").Result()
	if err != nil {
		return -1
	}
	n := 0
	for _, k := range keys {
		c, _ := rdb.SCard(ctx, k).Result()
		n += int(c)
	}
	return n
}

// TestCancelledWhenNoCallerLeft: a coalesced execution goes on while any
// caller on any instance waits for it, and is cancelled on the server
// (notifications/cancelled) once the last one has left.
func TestCancelledWhenNoCallerLeft(t *testing.T) {
	fm := fakemcp.Start(t, fakemcp.Options{Token: "remote-token-0123456789"})
	in := fleet(t, 2, []gateway.Server{remote(t, fm.URL)}, gateway.Options{})
	defer fm.ReleaseAll()
	a := agent(t, in[0].url+"/mcp/docs", nil)
	b := agent(t, in[1].url+"/mcp/docs", nil)

	// Alone: the only caller leaves, the execution is cancelled.
	c := startHold(a, "one")
	waitFor(t, func() bool { return fm.Holding("one") == 1 })
	c.cancel()
	if err := c.wait(t); err == nil {
		t.Fatal("the cancelled call returned no error")
	}
	waitFor(t, func() bool { return fm.Cancelled() == 1 })

	// A caller on each instance; the executing instance's leaves: the
	// execution goes on for the other, which gets its result.
	ca := startHold(a, "two")
	waitFor(t, func() bool { return fm.Holding("two") == 1 })
	cb := startHold(b, "two")
	defer cb.cancel()
	waitFor(t, func() bool { return waitingElsewhere(t, in[0]) == 1 })
	ca.cancel()
	if err := ca.wait(t); err == nil {
		t.Fatal("the cancelled call returned no error")
	}
	fm.Release("two")
	if err := cb.wait(t); err != nil {
		t.Fatalf("the caller still waiting: %v", err)
	}
	if got := text(t, cb.res); got != "held two" {
		t.Fatalf("the caller still waiting got %q", got)
	}
	if n, k := fm.ExecutionsOf("two"), fm.Cancelled(); n != 1 || k != 1 {
		t.Fatalf("executions of two = %d, cancelled = %d; want 1 and 1 (the first part's)", n, k)
	}

	// Both leave, the executing instance's caller first: the execution
	// is cancelled when the other instance's leaves.
	ca = startHold(a, "three")
	waitFor(t, func() bool { return fm.Holding("three") == 1 })
	cb = startHold(b, "three")
	defer cb.cancel()
	waitFor(t, func() bool { return waitingElsewhere(t, in[0]) == 1 })
	ca.cancel()
	ca.wait(t)
	cb.cancel()
	cb.wait(t)
	waitFor(t, func() bool { return fm.Cancelled() == 2 && fm.Holding("three") == 0 })
	if n := fm.ExecutionsOf("three"); n != 1 {
		t.Fatalf("executions of three = %d; want 1", n)
	}
	if n := sum(in, func(c *counts) int64 { return c.abandoned.Load() }); n != 2 {
		t.Fatalf("executions counted abandoned = %d; want 2", n)
	}
	waitFor(t, func() bool { return waitingElsewhere(t, in[0]) == 0 })
}
