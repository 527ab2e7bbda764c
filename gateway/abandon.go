package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"
)

// A coalesced execution runs for its callers: the engine's flight goes on
// when they leave (it fills the cache), but a tool call nobody waits for
// is work for nobody, so the executing instance cancels it on the server
// once no caller is left on any instance. Its own callers it counts
// (pendingCall.refs); the other instances' it learns from the call's
// waiting set in Redis, which an instance joins when its flight follows
// the executing one, and from the "left" each says on the call's channel
// when its last caller has gone (progressHub). An instance whose callers
// arrive just as the execution is cancelled gets statusAbandoned and runs
// the call again for them: no caller is ever answered "cancelled" for
// another's leaving.

// statusAbandoned is the document the engine gets of an execution
// cancelled because no caller was left, and of a call no caller of this
// instance waits for (nothing to run it with): delivered, never kept,
// and the callers that still wait run the call again. 425 (Too Early)
// because the engine treats it as an answer (not an error to retry or
// count against the breaker, nor a 404 or 410 to keep).
const statusAbandoned = http.StatusTooEarly

// abandonRetries bounds how many times one caller runs a call again after
// statusAbandoned.
const abandonRetries = 3

// checkAbandoned cancels pc's execution if no caller is left: none on
// this instance, none on another.
func (g *Gateway) checkAbandoned(k callKey, pc *pendingCall) {
	pc.mu.Lock()
	live := pc.refs > 0 || pc.abandon == nil
	pc.mu.Unlock()
	if live || (g.progress != nil && g.progress.othersWaiting(g.ctx, k)) {
		return
	}
	pc.mu.Lock()
	if pc.refs <= 0 && pc.abandon != nil {
		pc.abandoned = true
		pc.abandon()
		g.m.abandoned(k.server, k.tool)
	}
	pc.mu.Unlock()
}

// execution prepares pc's execution: its context, cancelled when no
// caller is left, and the function that ends it, which reports whether it
// was.
func (g *Gateway) execution(ctx context.Context, k callKey, pc *pendingCall) (context.Context, func() bool) {
	ctx, cancel := context.WithCancel(ctx)
	var stop func()
	if g.progress != nil {
		stop = g.progress.onLeft(ctx, g, k, func() { g.checkAbandoned(k, pc) })
	}
	pc.mu.Lock()
	pc.abandon = cancel
	gone := pc.refs <= 0
	pc.mu.Unlock()
	if gone { // every caller left before it started
		g.checkAbandoned(k, pc)
	}
	return ctx, func() bool {
		if stop != nil {
			stop()
		}
		pc.mu.Lock()
		pc.abandon = nil
		abandoned := pc.abandoned
		pc.mu.Unlock()
		cancel()
		return abandoned
	}
}

// keptArgs remembers the arguments of the coalesced calls of servers
// that keep results (a ttl), until their results can no longer be served
// stale: a refresh the engine runs after every caller left
// (stale-while-revalidate) finds them here. Bounded in bytes; past the
// bound a call's arguments are not kept, and its refresh is abandoned
// (the next caller runs the call).
type keptArgs struct {
	mu    sync.Mutex
	m     map[callKey]keptEntry
	bytes int
}

type keptEntry struct {
	args  json.RawMessage
	until time.Time
}

// maxKeptBytes bounds the arguments keptArgs holds.
const maxKeptBytes = 64 << 20

func (a *keptArgs) keep(k callKey, args json.RawMessage, until time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = map[callKey]keptEntry{}
	}
	if e, ok := a.m[k]; ok {
		e.until = until
		a.m[k] = e
		return
	}
	if a.bytes+len(args) > maxKeptBytes {
		return
	}
	a.m[k] = keptEntry{args: args, until: until}
	a.bytes += len(args)
}

func (a *keptArgs) get(k callKey) (json.RawMessage, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.m[k]
	return e.args, ok
}

// expire forgets the arguments kept until before now.
func (a *keptArgs) expire(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, e := range a.m {
		if e.until.Before(now) {
			delete(a.m, k)
			a.bytes -= len(e.args)
		}
	}
}
