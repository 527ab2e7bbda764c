package store

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/coordd/coordd/internal/document"
	"github.com/coordd/coordd/internal/observe"
	"github.com/coordd/coordd/internal/testing/redistest"
)

// waitTimeout bounds every wait on an event in these tests: far beyond
// what any of them takes on a busy machine, so that only a lost event
// fails a test.
const waitTimeout = 15 * time.Second

// recorder is a Metrics that counts what the store reports, and lets a
// test wait for a count.
type recorder struct {
	observe.Nop            // the events the store does not send
	mu          sync.Mutex // protects counts and changed
	counts      map[string]int
	changed     chan struct{} // closed, and replaced, on every count
}

func newRecorder() *recorder {
	return &recorder{counts: make(map[string]int), changed: make(chan struct{})}
}

func (m *recorder) add(k string) {
	m.mu.Lock()
	m.counts[k]++
	close(m.changed)
	m.changed = make(chan struct{})
	m.mu.Unlock()
}

func (m *recorder) Lock(outcome string)         { m.add("lock " + outcome) }
func (m *recorder) LockExtension(result string) { m.add("extension " + result) }
func (m *recorder) RedisError(kind string)      { m.add("error " + kind) }
func (m *recorder) RedisHealth(up bool)         { m.add(fmt.Sprint("health ", up)) }
func (m *recorder) count(k string) int          { m.mu.Lock(); defer m.mu.Unlock(); return m.counts[k] }
func (m *recorder) snapshot() (map[string]int, <-chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := make(map[string]int, len(m.counts))
	for k, v := range m.counts {
		c[k] = v
	}
	return c, m.changed
}

// waitCount waits until k has been counted at least n times.
func (m *recorder) waitCount(t testing.TB, k string, n int) {
	t.Helper()
	deadline := time.After(waitTimeout)
	for {
		counts, changed := m.snapshot()
		if counts[k] >= n {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("%q counted %d times; want at least %d (counts: %v)", k, counts[k], n, counts)
		}
	}
}

// health records the store's OnHealth calls on a channel.
type health chan bool

func (h health) onHealth(up bool) { h <- up }

// wait waits for OnHealth(want), skipping nothing: a call with the other
// value first fails the test.
func (h health) wait(t testing.TB, want bool) {
	t.Helper()
	select {
	case got := <-h:
		if got != want {
			t.Fatalf("OnHealth(%v); want OnHealth(%v)", got, want)
		}
	case <-time.After(waitTimeout):
		t.Fatalf("no OnHealth(%v) within %v", want, waitTimeout)
	}
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// testConfig is the configuration of a store under test: generous
// timeouts, so that a busy machine fails no operation, and a short retry
// interval, so that recovery is quick.
func testConfig() Config {
	return Config{
		Prefix:         "test:",
		Timeout:        2 * time.Second,
		RetryInterval:  50 * time.Millisecond,
		ResultTTL:      time.Minute,
		InlineMaxBytes: 1 << 10,
		Logger:         quiet(),
	}
}

// startStore starts a store over rdb, stopped when the test ends, and
// checks that it came up.
func startStore(t testing.TB, rdb redis.UniversalClient, tune ...func(*Config)) (*Redis, *recorder) {
	t.Helper()
	m := newRecorder()
	cfg := testConfig()
	cfg.Metrics = m
	for _, f := range tune {
		f(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := Start(ctx, rdb, cfg)
	t.Cleanup(func() {
		cancel()
		r.Wait()
	})
	if !r.Healthy() {
		t.Fatal("the store did not come up")
	}
	return r, m
}

// backend is a Redis deployment the store runs on.
type backend struct {
	name string
	// client returns a new client of the deployment, closed when t ends.
	client func(t testing.TB) redis.UniversalClient
}

// backends returns a single redis-server and a Redis Cluster of three
// masters, started for t.
func backends(t *testing.T) []backend {
	rs := redistest.Start(t)
	rc := redistest.StartCluster(t, 3)
	return []backend{
		{"redis", func(t testing.TB) redis.UniversalClient { return rs.Client(t) }},
		{"cluster", func(t testing.TB) redis.UniversalClient { return rc.Client(t) }},
	}
}

// doc returns a document of id's url with body, and its encoding.
func doc(url, body string) (*document.Document, []byte) {
	now := time.Now().Truncate(time.Second)
	d := &document.Document{
		URL: url, Upstream: "up", StatusCode: 200, ContentType: "text/plain",
		FetchedAt: now, FreshUntil: now.Add(time.Hour), StaleUntil: now.Add(time.Hour),
		Body: []byte(body),
	}
	return d, d.Encode()
}

// nextEvent waits for w's next event.
func nextEvent(t testing.TB, w *Waiter) Event {
	t.Helper()
	select {
	case ev := <-w.Events():
		return ev
	case <-time.After(waitTimeout):
		t.Fatalf("no event for %s within %v", w.key, waitTimeout)
		return Event{}
	}
}

// nextOf waits for w's next event of type typ, skipping resets (a waiter
// may be woken to re-check at any time).
func nextOf(t testing.TB, w *Waiter, typ string) Event {
	t.Helper()
	for {
		ev := nextEvent(t, w)
		if ev.Type == EventReset && typ != EventReset {
			continue
		}
		if ev.Type != typ {
			t.Fatalf("event %+v; want a %s event", ev, typ)
		}
		return ev
	}
}

// deliver sends an event with send until w receives one of type typ. A
// waiter with a reset pending is given no other event (it re-checks
// anyway), and a (re)subscription may reset it at any time: each reset
// means "send again".
func deliver(t testing.TB, w *Waiter, typ string, send func()) Event {
	t.Helper()
	deadline := time.After(waitTimeout)
	for {
		for pending := true; pending; {
			select {
			case <-w.Events():
			default:
				pending = false
			}
		}
		send()
		select {
		case ev := <-w.Events():
			if ev.Type == typ {
				return ev
			}
			if ev.Type != EventReset {
				t.Fatalf("event %+v; want a %s event", ev, typ)
			}
		case <-deadline:
			t.Fatalf("no %s event for %s within %v", typ, w.key, waitTimeout)
		}
	}
}

// eventLog counts the events published on a single Redis's channel, by
// type and key, as another instance's subscriber would see them.
type eventLog struct {
	rdb     *redis.Client
	channel string
	mu      sync.Mutex // protects counts
	counts  map[string]int
	marks   chan string
}

// watchEvents subscribes to r's channel on rs.
func watchEvents(t *testing.T, rs *redistest.Server, r *Redis) *eventLog {
	t.Helper()
	l := &eventLog{rdb: rs.Client(t), channel: r.channel(), counts: make(map[string]int), marks: make(chan string, 1)}
	sub := l.rdb.Subscribe(context.Background(), l.channel)
	t.Cleanup(func() { _ = sub.Close() })
	if _, err := sub.Receive(context.Background()); err != nil { // subscribed
		t.Fatal(err)
	}
	go func() {
		for m := range sub.Channel() {
			if strings.HasPrefix(m.Payload, "mark:") {
				l.marks <- m.Payload
				continue
			}
			if ev, ok := decodeEvent(m.Payload); ok {
				l.mu.Lock()
				l.counts[ev.Type+" "+ev.Key]++
				l.mu.Unlock()
			}
		}
	}()
	return l
}

// count returns how many events of typ about key were published before
// count was called: a mark published now arrives after every one of them.
func (l *eventLog) count(t testing.TB, typ, key string) int {
	t.Helper()
	mark := "mark:" + typ + " " + key
	if err := l.rdb.Publish(context.Background(), l.channel, mark).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-l.marks:
		if got != mark {
			t.Fatalf("mark %q; want %q", got, mark)
		}
	case <-time.After(waitTimeout):
		t.Fatalf("mark %q not received within %v", mark, waitTimeout)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.counts[typ+" "+key]
}

// waitID waits until ch names id; the calls before it, about other ids,
// are skipped.
func waitID(t testing.TB, ch <-chan string, id, what string) {
	t.Helper()
	deadline := time.After(waitTimeout)
	for {
		select {
		case got := <-ch:
			if got == id {
				return
			}
		case <-deadline:
			t.Fatalf("no %s(%q) within %v", what, id, waitTimeout)
		}
	}
}

// loadScripts loads every script into rs, so that each runs as one
// EVALSHA: the command a Proxy rule naming its hash picks out.
func loadScripts(t testing.TB, rs *redistest.Server) {
	t.Helper()
	rdb := rs.Client(t)
	for _, s := range append(scripts(), guardStateScript) {
		if err := s.Load(context.Background(), rdb).Err(); err != nil {
			t.Fatalf("SCRIPT LOAD: %v", err)
		}
	}
}

// proxyClient returns a client that reaches Redis through p, closed when
// t ends. go-redis replays a command whose connection dropped
// (MaxRetries), which is what the replay tests are about.
func proxyClient(t testing.TB, p *redistest.Proxy) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// waitFired waits until a Proxy rule has fired: the command it picked
// out ran, and its reply was dropped or held.
func waitFired(t testing.TB, fired <-chan struct{}) {
	t.Helper()
	select {
	case <-fired:
	case <-time.After(waitTimeout):
		t.Fatalf("the proxy saw no matching command within %v", waitTimeout)
	}
}
