package storetest_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/store"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/redistest"
	"github.com/coordd/coordd/internal/testing/storetest"
)

// TestDefaultPrefix: a coordinator configured with no key prefix keeps its
// documents where storetest looks by default.
func TestDefaultPrefix(t *testing.T) {
	rs := redistest.Start(t)
	up := fakeupstream.New(t)
	in := fleettest.Start(t, fleettest.Options{RedisURL: rs.URL(),
		Config: coordinator.Config{Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: up.URL()}}}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := up.URL() + "/doc"
	st := storetest.New(rs.Client(t), "")
	// The landing follows the answer: its done event says when it is in.
	events, err := st.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer events.Close()
	if _, err := fleettest.Get(ctx, in.Dial(t), &coorddv1.GetOrFetchRequest{Url: url}); err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := events.Next(ctx)
		if err != nil {
			t.Fatalf("no done event of %s under prefix %q: %v", url, storetest.DefaultPrefix, err)
		}
		if ev.Type == storetest.EventDone && ev.Key == url {
			break
		}
	}
	if ok, err := st.DocStored(ctx, url); err != nil || !ok {
		t.Fatalf("no document of %s under prefix %q (%v)", url, storetest.DefaultPrefix, err)
	}
}

// TestStoreAsked: each question storetest asks Redis is answered as the
// store's own operations left it, and its events are the store's.
func TestStoreAsked(t *testing.T) {
	rs := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	back := make(chan struct{}, 1)
	r := store.Start(ctx, rs.Client(t), store.Config{Prefix: "p:", Timeout: 2 * time.Second, RetryInterval: 50 * time.Millisecond, ResultTTL: time.Minute,
		OnHealth: func(up bool) {
			if up {
				select {
				case back <- struct{}{}:
				default:
				}
			}
		}})
	t.Cleanup(func() {
		cancel()
		r.Wait()
	})
	// A busy machine can start the store down (its subscription late):
	// what is published before the store subscribes reaches nobody.
	if !r.Healthy() {
		select {
		case <-back:
		case <-ctx.Done():
			t.Fatal("the store never came up")
		}
	}
	st := storetest.New(rs.Client(t), "p:")
	evs, err := st.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer evs.Close()
	const id = "https://example.org/asked"
	if held, err := st.LockHeld(ctx, id); err != nil || held {
		t.Fatalf("LockHeld = %v, %v; want a free lock", held, err)
	}
	l, _, err := r.TryLock(ctx, id, time.Minute)
	if err != nil || l == nil {
		t.Fatalf("TryLock = %v, %v", l, err)
	}
	if tok, err := st.HolderToken(ctx, id); err != nil || tok != l.Token() {
		t.Fatalf("HolderToken = %q, %v; want %q", tok, err, l.Token())
	}
	if landed, err := r.Land(l, id, "", []byte("not a document, but bytes"), time.Hour, true); err != nil || !landed {
		t.Fatalf("Land = %v, %v", landed, err)
	}
	if ok, err := st.DocStored(ctx, id); err != nil || !ok {
		t.Fatalf("DocStored = %v, %v; want true", ok, err)
	}
	if held, err := st.LockHeld(ctx, id); err != nil || held {
		t.Fatalf("LockHeld after Land = %v, %v; want a free lock", held, err)
	}
	ev, err := evs.Next(ctx)
	if err != nil || ev.Type != storetest.EventDone || ev.Key != id || ev.Token != l.Token() {
		t.Fatalf("Next = %+v, %v; want the done event", ev, err)
	}
	w := r.Register(id)
	defer r.Unregister(w)
	if err := st.Publish(ctx, storetest.Event{Type: storetest.EventFail, Key: id, Token: "t", Msg: "m"}); err != nil {
		t.Fatal(err)
	}
	for {
		var ev storetest.Event
		select {
		case ev = <-w.Events():
		case <-ctx.Done():
			t.Fatal("the store never read the event published")
		}
		if ev.Type == storetest.EventFail {
			if ev.Token != "t" || ev.Msg != "m" {
				t.Fatalf("the store read %+v; want the event published", ev)
			}
			break
		}
	}
	got, err := evs.Sync(ctx)
	if err != nil || len(got) != 1 || got[0].Type != storetest.EventFail {
		t.Fatalf("Sync = %+v, %v; want the fail event only", got, err)
	}
	if got, err := evs.Sync(ctx); err != nil || len(got) != 0 {
		t.Fatalf("second Sync = %+v, %v; want nothing new", got, err)
	}
}

// TestCalls: each Call picks out the command of its operation (the proxy
// drops its reply, and go-redis replays it), and not the command of
// another operation on the same keys, run first.
func TestCalls(t *testing.T) {
	rs := redistest.Start(t)
	proxy := redistest.StartProxy(t, rs.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr()})
	defer rdb.Close()
	ctx, cancel := context.WithCancel(context.Background())
	r := store.Start(ctx, rdb, store.Config{Prefix: "p:", Timeout: 2 * time.Second, RetryInterval: 50 * time.Millisecond, ResultTTL: time.Minute})
	t.Cleanup(func() {
		cancel()
		r.Wait()
	})
	st := storetest.New(nil, "p:")
	const id, claimed, upstream = "https://example.org/calls", "https://example.org/claimed", "up"
	lock := func(ttl time.Duration) *store.Lease {
		l, _, err := r.TryLock(ctx, id, ttl)
		if err != nil || l == nil {
			t.Fatalf("TryLock = %v, %v", l, err)
		}
		t.Cleanup(l.StopWatchdog)
		return l
	}
	var l *store.Lease
	for _, tt := range []struct {
		name    string
		call    []string
		not, op func()
	}{
		{"claim", st.ClaimCall(claimed, upstream), func() {
			_, _ = r.Admit(ctx, upstream, store.Admit{TTL: time.Minute})
			_, _, _ = r.TryLock(ctx, claimed+"/other", time.Minute)
		}, func() {
			c := r.ClaimAdmitting(ctx, claimed, time.Minute, true, &store.AdmitAsk{Upstream: upstream, Admit: store.Admit{TTL: time.Minute}})
			if c.Lease != nil {
				t.Cleanup(c.Lease.StopWatchdog)
			}
		}},
		{"lock", st.LockCall(id), func() { _, _ = r.HolderOf(ctx, id) }, func() { l = lock(time.Minute) }},
		{"holder", st.HolderCall(id), func() { _, _, _ = r.TryLock(ctx, id, time.Minute) }, func() { _, _ = r.HolderOf(ctx, id) }},
		{"handoff", st.HandOffCall(id), func() { _, _ = r.HolderOf(ctx, id) }, func() { l.HandOff(store.Event{Type: store.EventRelease}) }},
		{"extend", st.ExtendCall(id), nil, func() { lock(300 * time.Millisecond) }}, // the watchdog's, every 100ms
		{"land", st.LandCall(id), func() { _, _ = r.Invalidate(ctx, id, time.Minute) }, func() {
			_, _ = r.Land(lock(time.Minute), id, "", []byte("x"), time.Hour, true)
		}},
		{"invalidate", st.InvalidateCall(id), func() {
			_, _ = r.Land(lock(time.Minute), id, "", []byte("x"), time.Hour, true)
		}, func() { _, _ = r.Invalidate(ctx, id, time.Minute) }},
		{"admit", st.AdmitCall(upstream), func() {
			_, _, _ = r.Record(ctx, upstream, store.Record{Outcome: "s", TTL: time.Minute})
		}, func() { _, _ = r.Admit(ctx, upstream, store.Admit{TTL: time.Minute}) }},
		{"record", st.RecordCall(upstream, false), func() { _, _ = r.Admit(ctx, upstream, store.Admit{TTL: time.Minute}) }, func() {
			_, _, _ = r.Record(ctx, upstream, store.Record{Outcome: "s", TTL: time.Minute})
		}},
		{"record failure", st.RecordCall(upstream, true), func() {
			_, _, _ = r.Record(ctx, upstream, store.Record{Outcome: "s", TTL: time.Minute})
		}, func() { _, _, _ = r.Record(ctx, upstream, store.Record{Outcome: "f", TTL: time.Minute}) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dropped := proxy.DropNext(tt.call...)
			if tt.not != nil {
				tt.not()
				select {
				case <-dropped:
					t.Fatalf("%q picked out another operation's command", tt.call)
				default:
				}
			}
			tt.op()
			select {
			case <-dropped:
			case <-time.After(15 * time.Second):
				t.Fatalf("the proxy saw no command matching %q", tt.call)
			}
		})
	}
}

// TestRoundTripsLeaveOutDials: a command that makes the pool dial is one
// round trip; the new connection's HELLO and CLIENT SETINFO, which
// go-redis sends whatever the traffic, are not counted (a lease's
// renewal dialling mid-burst on a loaded machine made
// TestColdPathRoundTrips count them).
func TestRoundTripsLeaveOutDials(t *testing.T) {
	rs := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer rdb.Close()
	var rt storetest.RoundTrips
	rdb.AddHook(rt.Hook())
	ctx := context.Background()
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil { // dials
		t.Fatal(err)
	}
	if got := storetest.Steps(rt.Take()); len(got) != 1 || got[0] != "set" {
		t.Fatalf("steps = %v; want [set]", got)
	}
}
