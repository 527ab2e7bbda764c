package gateway

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// progressHub carries a coalesced execution's progress to the callers
// waiting for it on the other instances (the executing instance's own
// have it at once, before the result): the instance that runs it publishes
// each notification of the server's on the call's channel, and each
// instance has one subscription (this hub's) over which it hands them to
// its own waiters, who answer them under their own progress tokens. The
// channel names a digest of the call's key, credential scope included,
// so that a scope never sees another's progress. Progress is best
// effort: while Redis does not answer, it is lost, not the call.
// Hand-rolled beside the engine's hub: the engine's events are its own,
// and it learns nothing of MCP.
type progressHub struct {
	rdb    redis.UniversalClient
	prefix string
	id     string // this instance's: its own messages are not handed back (its waiters had them at once)

	mu    sync.Mutex
	ps    *redis.PubSub // nil until the first subscription
	sinks map[string]map[*replier]bool
}

func newProgressHub(rdb redis.UniversalClient, prefix string) *progressHub {
	return &progressHub{rdb: rdb, prefix: prefix, id: rand.Text(), sinks: map[string]map[*replier]bool{}}
}

// channel is k's progress channel.
func (h *progressHub) channel(k callKey) string {
	s := sha256.Sum256([]byte(k.server + "\x00" + k.tool + "\x00" + k.hash + "\x00" + k.cred))
	return h.prefix + "mcp-progress:" + hex.EncodeToString(s[:16])
}

// watch hands the progress published on k's channel to out until the
// returned function is called. It returns once the subscription is in
// place (or Redis failed to answer: then out gets none).
func (h *progressHub) watch(ctx context.Context, g *Gateway, k callKey, out *replier) func() {
	ch := h.channel(k)
	h.mu.Lock()
	first := h.ps == nil
	if first {
		h.ps = h.rdb.Subscribe(g.ctx)
		ps := h.ps
		g.wg.Go(func() { h.run(g.ctx, ps) })
	}
	ps := h.ps
	fresh := len(h.sinks[ch]) == 0
	if h.sinks[ch] == nil {
		h.sinks[ch] = map[*replier]bool{}
	}
	h.sinks[ch][out] = true
	h.mu.Unlock()
	if fresh {
		_ = ps.Subscribe(ctx, ch) // best effort: without it, only progress is lost
	}
	return func() {
		h.mu.Lock()
		delete(h.sinks[ch], out)
		last := len(h.sinks[ch]) == 0
		if last {
			delete(h.sinks, ch)
		}
		h.mu.Unlock()
		if last {
			_ = ps.Unsubscribe(context.WithoutCancel(ctx), ch)
		}
	}
}

// run hands every message of ps to the sinks of its channel, until ctx
// (the gateway's) ends.
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
			from, params, ok := strings.Cut(m.Payload, "\n")
			if !ok || from == h.id {
				continue
			}
			h.mu.Lock()
			outs := make([]*replier, 0, len(h.sinks[m.Channel]))
			for o := range h.sinks[m.Channel] {
				outs = append(outs, o)
			}
			h.mu.Unlock()
			for _, o := range outs {
				o.progress(json.RawMessage(params))
			}
		}
	}
}

// publish sends one progress notification's params on k's channel, for
// the other instances' waiters.
func (h *progressHub) publish(ctx context.Context, k callKey, params json.RawMessage) {
	_ = h.rdb.Publish(context.WithoutCancel(ctx), h.channel(k), h.id+"\n"+string(params)).Err()
}
