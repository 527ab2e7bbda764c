package store

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
	EventDone    = "done"    // the document landed; R names the Redis key holding it
	EventFail    = "fail"    // the fetch failed; E and M say how
	EventRelease = "release" // the leader gave up without a result; try again
	EventInval   = "inval"   // drop K from L1 and fence its fills
	EventReset   = "reset"   // local only: the subscription was (re)established or Redis went down; re-check
)

// Event is one message on the completion channel, or a local reset. Key
// is the cache id; Token is the fill lock token of the leader that sent
// it, so that a follower takes a fail or a release only from the leader it
// waits for, never from an earlier one.
type Event struct {
	Type   string `json:"t"`
	Key    string `json:"k"`
	Token  string `json:"o,omitempty"`
	Result string `json:"r,omitempty"`
	Drop   bool   `json:"x,omitempty"` // done: the url turned uncacheable; drop K's old copy from L1
	Kind   string `json:"e,omitempty"`
	Msg    string `json:"m,omitempty"`
	Wait   int64  `json:"w,omitempty"` // fail: retry-after in ms
	// Trace is the W3C traceparent of the leader's upstream fetch span
	// (done and fail events of a traced leader), which a follower's span
	// links to; "" when the leader does not trace. Instances that predate
	// it ignore the field (encoding/json skips unknown names), and events
	// of such instances lack it: followers then link to nothing.
	Trace string `json:"tp,omitempty"`
	// Doc is the landed document's encoding, carried inline when small, so
	// that followers need no L2 read. On the wire it follows the JSON
	// header and a newline (compact JSON has no raw newline).
	Doc []byte `json:"-"`
}

func (e Event) encode() []byte {
	b, _ := json.Marshal(e)
	if len(e.Doc) > 0 {
		b = append(append(b, '\n'), e.Doc...)
	}
	return b
}

// decodeEvent parses a message of the completion channel.
func decodeEvent(payload string) (Event, bool) {
	head, doc, _ := strings.Cut(payload, "\n")
	var ev Event
	if json.Unmarshal([]byte(head), &ev) != nil || ev.Key == "" {
		return Event{}, false
	}
	if doc != "" {
		ev.Doc = bytesOf(doc)
	}
	return ev, true
}

// Waiter receives the events of one key. Its channel has room for one
// event; a waiter that already has an event pending needs no other to
// re-check.
type Waiter struct {
	key string
	ch  chan Event
}

// Events is the channel of w's events. It is never closed.
func (w *Waiter) Events() <-chan Event { return w.ch }

// hub is this instance's subscriber to the completion channels,
// multiplexing every key: it dispatches each event to the local waiters
// registered for its key. Callers register, then re-check L2, then wait, so
// no wakeup is lost; whenever a subscription is (re)established every
// waiter of its channel gets a reset, since events may have been missed
// meanwhile.
//
// On a single Redis (or Sentinel) there is one channel and one subscriber
// connection. In Redis Cluster there is one shard channel per shard of the
// ids (see shard.go), each on a connection of its own to the node that
// owns the channel's slot, since SSUBSCRIBE takes channels of one slot only.
type hub struct {
	channels  []string // one per shard of the ids; shardOf picks a key's
	subscribe func(ctx context.Context, channel string) *redis.PubSub
	reroute   func(ctx context.Context) // if set, called before subscribing again after a failure
	log       *slog.Logger
	onInval   func(key string) // an inval event: fence and drop
	onDrop    func(key string) // a done event with Drop: drop from L1
	onUp      func()           // called whenever every subscription is confirmed

	mu      sync.Mutex // protects waiters
	waiters map[string]map[*Waiter]struct{}

	ready []atomic.Bool // per channel: subscription confirmed and not since broken
}

// newHub returns a hub on one plain pub/sub channel.
func newHub(rdb rediser, channel string, log *slog.Logger, onInval func(string)) *hub {
	return &hub{
		channels: []string{channel}, log: log, onInval: onInval,
		subscribe: func(ctx context.Context, ch string) *redis.PubSub { return rdb.Subscribe(ctx, ch) },
		waiters:   make(map[string]map[*Waiter]struct{}),
		ready:     make([]atomic.Bool, 1),
	}
}

// subscribed reports whether every subscription is confirmed.
func (h *hub) subscribed() bool {
	for i := range h.ready {
		if !h.ready[i].Load() {
			return false
		}
	}
	return true
}

// shard returns the index of key's channel.
func (h *hub) shard(key string) int { return shardOf(key, len(h.channels)) }

// register returns a waiter for key; the caller must unregister it.
func (h *hub) register(key string) *Waiter {
	w := &Waiter{key: key, ch: make(chan Event, 1)}
	h.mu.Lock()
	m := h.waiters[key]
	if m == nil {
		m = make(map[*Waiter]struct{})
		h.waiters[key] = m
	}
	m[w] = struct{}{}
	h.mu.Unlock()
	return w
}

func (h *hub) unregister(w *Waiter) {
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

func (h *hub) dispatch(ev Event) {
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
func (h *hub) resetAll() { h.resetShard(-1) }

// resetShard wakes the waiters of channel i (every waiter if i < 0) to
// re-check.
func (h *hub) resetShard(i int) {
	h.mu.Lock()
	for key, m := range h.waiters {
		if i >= 0 && len(h.channels) > 1 && h.shard(key) != i {
			continue
		}
		for w := range m {
			select {
			case w.ch <- Event{Type: EventReset, Key: w.key}:
			default:
			}
		}
	}
	h.mu.Unlock()
}

// run keeps every subscription alive until ctx ends, one goroutine per
// channel; see runOne.
func (h *hub) run(ctx context.Context, interval time.Duration, onBroken func(error)) {
	var wg sync.WaitGroup
	for i := range h.channels {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.runOne(ctx, i, interval, onBroken)
		}()
	}
	wg.Wait()
}

// runOne keeps the subscription to channel i alive until ctx ends.
// go-redis reconnects and resubscribes a broken PubSub on the next
// Receive; each confirmation is followed by a reset of the channel's
// waiters. A ping every interval detects a frozen Redis. When the
// subscription breaks, the channel's waiters re-check and onBroken is
// called.
func (h *hub) runOne(ctx context.Context, i int, interval time.Duration, onBroken func(error)) {
	channel := h.channels[i]
	var psMu sync.Mutex // protects ps, which Close of ctx must be able to interrupt
	ps := h.subscribe(ctx, channel)
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
		if err == nil {
			if s, ok := msg.(*redis.Subscription); ok && s.Kind == "sunsubscribe" {
				// The server dropped a shard channel whose slot moved to
				// another node: subscribe again where it lives now.
				err = errSlotMoved
			}
		}
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
			if h.ready[i].CompareAndSwap(true, false) {
				h.log.Warn("redis subscription broken; reconnecting", "channel", channel, "err", err)
				onBroken(err)
				h.resetShard(i)
			}
			pinged = false
			if h.reroute != nil {
				h.reroute(ctx)
			}
			// A frozen connection must be dropped; a dead one is already.
			psMu.Lock()
			_ = ps.Close()
			ps = h.subscribe(ctx, channel)
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
			if m.Kind == "subscribe" || m.Kind == "ssubscribe" {
				backoff = 50 * time.Millisecond
				h.ready[i].Store(true)
				if h.onUp != nil && h.subscribed() {
					h.onUp()
				}
				h.resetShard(i)
			}
		case *redis.Message:
			ev, ok := decodeEvent(m.Payload)
			if !ok {
				continue
			}
			if ev.Type == EventDone && ev.Drop && h.onDrop != nil {
				h.onDrop(ev.Key)
			}
			if ev.Type == EventInval && h.onInval != nil {
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
