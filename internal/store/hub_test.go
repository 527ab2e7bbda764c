package store

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/testing/redistest"
)

// newTestHub returns a hub on channel of rs. up receives a value whenever
// every subscription is confirmed, broken whenever one breaks (once
// startHub runs it), inval the id of every inval event.
func newTestHub(t *testing.T, rs *redistest.Server, channel string) (h *hub, up chan struct{}, broken chan error, inval chan string) {
	t.Helper()
	up, broken, inval = make(chan struct{}, 16), make(chan error, 16), make(chan string, 16)
	h = newHub(rs.Client(t), channel, quiet(), func(id string) { inval <- id })
	h.onUp = func() { up <- struct{}{} }
	return h, up, broken, inval
}

// startHub starts h.run, stopped and waited for when the test ends.
func startHub(t *testing.T, h *hub, interval time.Duration, broken chan error) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { h.run(ctx, interval, func(err error) { broken <- err }) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
}

// recv waits for a value on ch.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitTimeout):
		t.Fatalf("no %s within %v", what, waitTimeout)
		var zero T
		return zero
	}
}

// TestHubResubscribesAfterRestart: every confirmation of the subscription,
// the first and the one after Redis came back, wakes every waiter to
// re-check (events may have been missed meanwhile), and so does the
// subscription breaking; once back, events reach the waiters again.
func TestHubResubscribesAfterRestart(t *testing.T) {
	rs := redistest.Start(t)
	const channel, id = "test:events", "https://example.org/hub"
	h, up, broken, inval := newTestHub(t, rs, channel)
	w := h.register(id) // before the first subscription: it is reset by it
	defer h.unregister(w)
	other := h.register("https://example.org/other")
	defer h.unregister(other)
	startHub(t, h, 5*time.Second, broken) // no ping on a quiet channel in this test

	recv(t, up, "subscription")
	for _, w := range []*Waiter{w, other} {
		if ev := nextEvent(t, w); ev.Type != EventReset || ev.Key != w.key {
			t.Fatalf("event %+v on subscribing; want a reset of %s", ev, w.key)
		}
	}
	if !h.subscribed() {
		t.Fatal("subscribed() = false after the confirmation")
	}

	rs.Kill()
	recv(t, broken, "broken subscription")
	if h.subscribed() {
		t.Fatal("subscribed() = true with Redis dead")
	}
	if ev := nextEvent(t, w); ev.Type != EventReset {
		t.Fatalf("event %+v when the subscription broke; want a reset", ev)
	}

	rs.Restart()
	recv(t, up, "resubscription")
	if ev := nextEvent(t, w); ev.Type != EventReset {
		t.Fatalf("event %+v on resubscribing; want a reset", ev)
	}

	// Events flow again, each to the waiters of its key only (a waiter
	// may be told to re-check at any time).
	rdb := rs.Client(t)
	ev := deliver(t, w, EventInval, func() {
		if err := rdb.Publish(context.Background(), channel, Event{Type: EventInval, Key: id}.encode()).Err(); err != nil {
			t.Fatal(err)
		}
	})
	if ev.Key != id {
		t.Fatalf("event %+v; want the inval published", ev)
	}
	if got := recv(t, inval, "OnInvalidate"); got != id {
		t.Fatalf("OnInvalidate(%q); want %q", got, id)
	}
	for pending := true; pending; {
		select {
		case ev := <-other.Events():
			if ev.Type != EventReset {
				t.Fatalf("the waiter of another key got %+v; want resets only", ev)
			}
		default:
			pending = false
		}
	}
}

// TestHubCutSubscriptionDegradesNothing: a subscription that alone was
// cut (CLIENT KILL, a proxy) is re-established, its waiters told to
// re-check, and Redis is not marked down: its ping answers.
func TestHubCutSubscriptionDegradesNothing(t *testing.T) {
	rs := redistest.Start(t)
	a, ma := startStore(t, rs.Client(t))
	b, _ := startStore(t, rs.Client(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const id = "https://example.org/cut"
	w := a.Register(id)
	defer a.Unregister(w)
	rdb := rs.Client(t)
	if err := rdb.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	nextOf(t, w, EventReset)
	// Both hubs subscribe again.
	for deadline := time.Now().Add(waitTimeout); ; {
		subs, err := rdb.PubSubNumSub(ctx, a.channel()).Result()
		if err == nil && subs[a.channel()] == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("PUBSUB NUMSUB = %v, %v; want both hubs subscribed again", subs, err)
		}
		time.Sleep(10 * time.Millisecond) // polling Redis's view; it sends no notice
	}
	deliver(t, w, EventInval, func() {
		if _, err := b.Invalidate(ctx, id, time.Minute); err != nil {
			t.Fatal(err)
		}
	})
	if !a.Healthy() || a.Downs() != 0 || ma.count("health false") != 0 {
		t.Fatalf("Healthy %v, Downs %d; want Redis never marked down", a.Healthy(), a.Downs())
	}
}

// TestStoreRecoversAfterRestart: Redis killed, every instance marks it
// down and wakes its waiters to re-check; restarted, every instance
// marks it up once its subscription is back, and events flow between
// them again.
func TestStoreRecoversAfterRestart(t *testing.T) {
	rs := redistest.Start(t)
	upA, upB := make(health, 4), make(health, 4)
	a, ma := startStore(t, rs.Client(t), func(c *Config) { c.OnHealth = upA.onHealth })
	b, _ := startStore(t, rs.Client(t), func(c *Config) { c.OnHealth = upB.onHealth })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const id = "https://example.org/restarted"
	w := a.Register(id)
	defer a.Unregister(w)

	rs.Kill()
	upA.wait(t, false)
	upB.wait(t, false)
	nextOf(t, w, EventReset)
	if a.Healthy() || ma.count("health false") != 1 {
		t.Fatalf("Healthy %v, %d downs counted; want down, counted once", a.Healthy(), ma.count("health false"))
	}

	rs.Restart()
	upA.wait(t, true)
	upB.wait(t, true)
	if !a.hub.subscribed() || !b.hub.subscribed() {
		t.Fatal("marked up before the subscription was back")
	}
	deliver(t, w, EventInval, func() {
		if _, err := b.Invalidate(ctx, id, time.Minute); err != nil {
			t.Fatal(err)
		}
	})
	if a.Downs() != 1 || ma.count("health true") != 1 {
		t.Fatalf("Downs %d, %d ups counted; want one of each", a.Downs(), ma.count("health true"))
	}
}

// TestHubFrozenRedis: a frozen Redis (SIGSTOP: connections accepted,
// nothing answered) is found by the hub's ping on its quiet subscription
// and marked down with no request in flight; thawed, it is marked up.
func TestHubFrozenRedis(t *testing.T) {
	rs := redistest.Start(t)
	up := make(health, 4)
	cfg := testConfig()
	cfg.OnHealth = up.onHealth
	cfg.Timeout = 250 * time.Millisecond // the hub pings after 1s of quiet
	ctx, cancel := context.WithCancel(context.Background())
	r := Start(ctx, rs.Client(t), cfg)
	t.Cleanup(func() {
		cancel()
		r.Wait()
	})
	select {
	case <-up: // a busy machine took more than 4 timeouts to subscribe
		up.wait(t, true)
	default:
	}
	rs.Pause()
	up.wait(t, false)
	if r.hub.subscribed() {
		t.Fatal("subscribed() = true with Redis frozen")
	}
	rs.Resume()
	up.wait(t, true)
}
