package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Event types on the completion channel.
const (
	evDone    = "done"    // the document landed; R names the Redis key holding it
	evFail    = "fail"    // the fetch failed; E and M say how
	evRelease = "release" // the leader gave up without a result; try again
	evInval   = "inval"   // drop K from L1 and fence its fills
	evReset   = "reset"   // local only: the subscription was (re)established or Redis went down; re-check
)

// event is one message on the completion channel, or a local reset. Key
// is the cache id; Token is the fill lock token of the leader that sent
// it, so that a follower takes a fail or a release only from the leader it
// waits for, never from an earlier one.
type event struct {
	Type   string `json:"t"`
	Key    string `json:"k"`
	Token  string `json:"o,omitempty"`
	Result string `json:"r,omitempty"`
	Drop   bool   `json:"x,omitempty"` // done: the url turned uncacheable; drop K's old copy from L1
	Kind   string `json:"e,omitempty"`
	Msg    string `json:"m,omitempty"`
	Wait   int64  `json:"w,omitempty"` // fail: retry-after in ms
	// Doc is the landed document's encoding, carried inline when small, so
	// that followers need no L2 read. On the wire it follows the JSON
	// header and a newline (compact JSON has no raw newline).
	Doc []byte `json:"-"`
}

func (e event) encode() []byte {
	b, _ := json.Marshal(e)
	if len(e.Doc) > 0 {
		b = append(append(b, '\n'), e.Doc...)
	}
	return b
}

// decodeEvent parses a message of the completion channel.
func decodeEvent(payload string) (event, bool) {
	head, doc, _ := strings.Cut(payload, "\n")
	var ev event
	if json.Unmarshal([]byte(head), &ev) != nil || ev.Key == "" {
		return event{}, false
	}
	if doc != "" {
		ev.Doc = []byte(doc)
	}
	return ev, true
}

// waiter receives the events of one key. ch has room for one event; a
// waiter that already has an event pending needs no other to re-check.
type waiter struct {
	key string
	ch  chan event
}

// hub is this instance's single subscriber connection to the completion
// channel, multiplexing every key: it dispatches each event to the local
// waiters registered for its key. Callers register, then re-check L2, then
// wait, so no wakeup is lost; whenever the subscription is (re)established
// every waiter gets a reset, since events may have been missed meanwhile.
type hub struct {
	rdb     rediser
	channel string
	log     *slog.Logger
	onInval func(key string) // an inval event: fence and drop
	onDrop  func(key string) // a done event with Drop: drop from L1
	onUp    func()           // called once the subscription is confirmed

	mu      sync.Mutex // protects waiters
	waiters map[string]map[*waiter]struct{}

	ready atomic.Bool // subscription confirmed and not since broken
}

func newHub(rdb rediser, channel string, log *slog.Logger, onInval func(string)) *hub {
	return &hub{rdb: rdb, channel: channel, log: log, onInval: onInval, waiters: make(map[string]map[*waiter]struct{})}
}

func (h *hub) subscribed() bool { return h.ready.Load() }

// register returns a waiter for key; the caller must unregister it.
func (h *hub) register(key string) *waiter {
	w := &waiter{key: key, ch: make(chan event, 1)}
	h.mu.Lock()
	m := h.waiters[key]
	if m == nil {
		m = make(map[*waiter]struct{})
		h.waiters[key] = m
	}
	m[w] = struct{}{}
	h.mu.Unlock()
	return w
}

func (h *hub) unregister(w *waiter) {
	if w == nil {
		return
	}
	h.mu.Lock()
	if m := h.waiters[w.key]; m != nil {
		delete(m, w)
		if len(m) == 0 {
			delete(h.waiters, w.key)
		}
	}
	h.mu.Unlock()
}

func (h *hub) dispatch(ev event) {
	h.mu.Lock()
	for w := range h.waiters[ev.Key] {
		select {
		case w.ch <- ev:
		default:
		}
	}
	h.mu.Unlock()
}

// resetAll wakes every waiter to re-check.
func (h *hub) resetAll() {
	h.mu.Lock()
	for _, m := range h.waiters {
		for w := range m {
			select {
			case w.ch <- event{Type: evReset, Key: w.key}:
			default:
			}
		}
	}
	h.mu.Unlock()
}

// run keeps the subscription alive until ctx ends. go-redis reconnects and
// resubscribes a broken PubSub on the next Receive; each confirmation is
// followed by resetAll. A ping every interval detects a frozen Redis. When
// the subscription breaks, every waiter re-checks and onBroken is called.
func (h *hub) run(ctx context.Context, interval time.Duration, onBroken func(error)) {
	var psMu sync.Mutex // protects ps, which Close of ctx must be able to interrupt
	ps := h.rdb.Subscribe(ctx, h.channel)
	stop := context.AfterFunc(ctx, func() {
		psMu.Lock()
		_ = ps.Close() // unblocks a pending Receive
		psMu.Unlock()
	})
	defer stop()
	defer func() {
		psMu.Lock()
		_ = ps.Close()
		psMu.Unlock()
	}()
	pinged := false
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		msg, err := ps.ReceiveTimeout(ctx, interval)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if isTimeout(err) && !pinged {
				// Quiet channel: ask for a pong; no pong by the next
				// timeout means the connection is dead or frozen.
				pinged = true
				if perr := ps.Ping(ctx); perr == nil {
					continue
				}
			}
			if h.ready.CompareAndSwap(true, false) {
				h.log.Warn("redis subscription broken; reconnecting", "err", err)
				onBroken(err)
				h.resetAll()
			}
			pinged = false
			// A frozen connection must be dropped; a dead one is already.
			psMu.Lock()
			_ = ps.Close()
			ps = h.rdb.Subscribe(ctx, h.channel)
			psMu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, time.Second)
			continue
		}
		pinged = false
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				backoff = 50 * time.Millisecond
				h.ready.Store(true)
				if h.onUp != nil {
					h.onUp()
				}
				h.resetAll()
			}
		case *redis.Message:
			ev, ok := decodeEvent(m.Payload)
			if !ok {
				continue
			}
			if ev.Type == evDone && ev.Drop && h.onDrop != nil {
				h.onDrop(ev.Key)
			}
			if ev.Type == evInval && h.onInval != nil {
				h.onInval(ev.Key)
			}
			h.dispatch(ev)
		case *redis.Pong:
		}
	}
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}
