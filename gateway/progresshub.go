package gateway

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// progressHub carries what the instances of one Redis tell each other
// about a coalesced execution, on the call's channel:
//   - its progress, for the callers waiting on the other instances (the
//     executing instance's own have it at once, before the result): the
//     instance that runs it publishes each notification of the server's,
//     and each instance hands them to its own waiters, who answer them
//     under their own progress tokens;
//   - that callers of an instance wait for it (a member of the call's
//     waiting set, added when the instance's flight follows another's),
//     and that they have all left ("left" on the channel), so that the
//     executing instance cancels the execution once no caller is left
//     anywhere (abandon.go).
//
// Each instance has one subscription (this hub's). The channel and the
// set name a digest of the call's key, credential scope included, so that
// a scope never sees another's progress. All of it is best effort: while
// Redis does not answer, progress is lost, and an execution is never
// cancelled for want of an answer, but no call is lost. Hand-rolled beside
// the engine's hub: the engine's events are its own, and it learns
// nothing of MCP.
type progressHub struct {
	rdb    redis.UniversalClient
	prefix string
	id     string // this instance's: its own messages are not handed back (its waiters had them at once)

	mu      sync.Mutex
	ps      *redis.PubSub // nil until the first subscription
	chans   map[string]*hubChannel
	waiting map[string]int // this instance's waiters of each call run elsewhere, by set
}

// hubChannel is what listens on one call's channel on this instance.
type hubChannel struct {
	outs map[*replier]bool // waiters with a progress token
	left map[*func()]bool  // executions of this instance, told when another instance's waiters left
}

// leftMsg is the payload that says an instance's waiters have all left.
const leftMsg = "left"

func newProgressHub(rdb redis.UniversalClient, prefix string) *progressHub {
	return &progressHub{rdb: rdb, prefix: prefix, id: rand.Text(), chans: map[string]*hubChannel{}, waiting: map[string]int{}}
}

func (h *progressHub) digest(k callKey) string {
	s := sha256.Sum256([]byte(k.server + "\x00" + k.tool + "\x00" + k.hash + "\x00" + k.cred))
	return hex.EncodeToString(s[:16])
}

// channel is k's channel.
func (h *progressHub) channel(k callKey) string { return h.prefix + "mcp-progress:" + h.digest(k) }

// waitingSet is the set of the instances whose callers wait for k's
// execution elsewhere.
func (h *progressHub) waitingSet(k callKey) string { return h.prefix + "mcp-waiting:" + h.digest(k) }

// attach runs add on k's channel's listeners and subscribes to it if it
// is the first; the returned function runs remove and unsubscribes after
// the last. It returns once the subscription is asked for (a failure
// loses only what the channel would have carried).
func (h *progressHub) attach(ctx context.Context, g *Gateway, k callKey, add, remove func(*hubChannel)) func() {
	ch := h.channel(k)
	h.mu.Lock()
	if h.ps == nil {
		h.ps = h.rdb.Subscribe(g.ctx)
		ps := h.ps
		g.wg.Go(func() { h.run(g.ctx, ps) })
	}
	ps := h.ps
	c := h.chans[ch]
	fresh := c == nil
	if fresh {
		c = &hubChannel{outs: map[*replier]bool{}, left: map[*func()]bool{}}
		h.chans[ch] = c
	}
	add(c)
	h.mu.Unlock()
	if fresh {
		_ = ps.Subscribe(ctx, ch)
	}
	return func() {
		h.mu.Lock()
		remove(c)
		last := len(c.outs) == 0 && len(c.left) == 0 && h.chans[ch] == c
		if last {
			delete(h.chans, ch)
		}
		h.mu.Unlock()
		if last {
			_ = ps.Unsubscribe(context.WithoutCancel(ctx), ch)
		}
	}
}

// watch hands the progress published on k's channel to out until the
// returned function is called.
func (h *progressHub) watch(ctx context.Context, g *Gateway, k callKey, out *replier) func() {
	return h.attach(ctx, g, k, func(c *hubChannel) { c.outs[out] = true }, func(c *hubChannel) { delete(c.outs, out) })
}

// onLeft calls fn whenever another instance's waiters of k have all left,
// until the returned function is called.
func (h *progressHub) onLeft(ctx context.Context, g *Gateway, k callKey, fn func()) func() {
	p := &fn
	return h.attach(ctx, g, k, func(c *hubChannel) { c.left[p] = true }, func(c *hubChannel) { delete(c.left, p) })
}

// run hands every message of ps to the listeners of its channel, until
// ctx (the gateway's) ends.
func (h *progressHub) run(ctx context.Context, ps *redis.PubSub) {
	defer ps.Close()
	msgs := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-msgs:
			if !ok {
				return
			}
			from, payload, ok := strings.Cut(m.Payload, "\n")
			if !ok || from == h.id {
				continue
			}
			var outs []*replier
			var lefts []*func()
			h.mu.Lock()
			if c := h.chans[m.Channel]; c != nil {
				if payload == leftMsg {
					for f := range c.left {
						lefts = append(lefts, f)
					}
				} else {
					for o := range c.outs {
						outs = append(outs, o)
					}
				}
			}
			h.mu.Unlock()
			for _, o := range outs {
				o.progress(json.RawMessage(payload))
			}
			for _, f := range lefts {
				(*f)()
			}
		}
	}
}

// publish sends one progress notification's params on k's channel, for
// the other instances' waiters.
func (h *progressHub) publish(ctx context.Context, k callKey, params json.RawMessage) {
	_ = h.rdb.Publish(context.WithoutCancel(ctx), h.channel(k), h.id+"\n"+string(params)).Err()
}

// waitingElsewhere records that a caller of this instance waits for k's
// execution on another instance, for at most bound; the returned
// function ends that. The first such caller of the instance adds it to
// k's waiting set; the last to leave removes it and says so on k's
// channel. Redis is asked once per call and instance, not per caller.
func (h *progressHub) waitingElsewhere(ctx context.Context, k callKey, bound time.Duration) func() {
	set := h.waitingSet(k)
	h.mu.Lock()
	h.waiting[set]++
	first := h.waiting[set] == 1
	h.mu.Unlock()
	if first {
		_, _ = h.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.SAdd(ctx, set, h.id)
			p.PExpire(ctx, set, bound) // an instance that dies leaves no waiter for longer
			return nil
		})
	}
	return func() {
		h.mu.Lock()
		h.waiting[set]--
		last := h.waiting[set] == 0
		if last {
			delete(h.waiting, set)
		}
		h.mu.Unlock()
		if last {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			_ = h.rdb.SRem(ctx, set, h.id).Err()
			_ = h.rdb.Publish(ctx, h.channel(k), h.id+"\n"+leftMsg).Err()
		}
	}
}

// othersWaiting reports whether callers of another instance wait for k's
// execution; true when Redis does not answer, so that an execution is
// never cancelled for want of an answer.
func (h *progressHub) othersWaiting(ctx context.Context, k callKey) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	ids, err := h.rdb.SMembers(ctx, h.waitingSet(k)).Result()
	if err != nil {
		return true
	}
	for _, id := range ids {
		if id != h.id {
			return true
		}
	}
	return false
}
