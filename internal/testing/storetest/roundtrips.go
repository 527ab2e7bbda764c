package storetest

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/coordd/coordd/internal/store"
)

// scriptNames are the store's scripts, as store.ScriptHash names them.
var scriptNames = []string{"lock", "holder", "extend", "land", "handoff", "invalidate", "admit", "record", "lock+admit"}

// Trip is one round trip a client made to Redis: a command, or a
// pipeline of them.
type Trip struct {
	At   time.Time // when it was sent
	Step string    // what it did; see RoundTrips
}

// RoundTrips is a go-redis hook (redis.Client.AddHook) that counts the
// round trips its client makes, counted at the client: a pipeline or a
// transaction is one round trip, and a script one however many commands
// it runs inside Redis (which INFO commandstats would count). Each trip is
// named for what it does: a script of the store by its name ("lock",
// "land", "admit"…), a script run as EVAL after a NOSCRIPT by its name and
// "(eval)", another command by its name in lower case ("mget", "get",
// "spublish"); the commands of a pipeline joined with "+". PING is left
// out: the health checks and the connection warm-up send it whatever the
// traffic; so are a new connection's HELLO and CLIENT SETINFO, and a
// command whose context had ended, which go-redis does not send. Pub/sub connections do not pass through the hook: a
// subscription is per instance, not per key. It is safe for concurrent
// use.
type RoundTrips struct {
	mu    sync.Mutex // protects trips
	trips []Trip
}

// Hook returns the hook to add to a client.
func (rt *RoundTrips) Hook() redis.Hook { return roundTripHook{rt} }

// Take returns the trips counted since the last Take, in the order they
// were sent, and forgets them.
func (rt *RoundTrips) Take() []Trip {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	t := rt.trips
	rt.trips = nil
	return t
}

// Seen returns the trips counted since the last Take, and keeps them.
func (rt *RoundTrips) Seen() []Trip {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return append([]Trip(nil), rt.trips...)
}

func (rt *RoundTrips) add(step string) {
	if step == "" {
		return
	}
	rt.mu.Lock()
	rt.trips = append(rt.trips, Trip{At: time.Now(), Step: step})
	rt.mu.Unlock()
}

// Count returns how many of trips did step.
func Count(trips []Trip, step string) int {
	n := 0
	for _, t := range trips {
		if t.Step == step {
			n++
		}
	}
	return n
}

// Steps returns the steps of trips, in order.
func Steps(trips []Trip) []string {
	s := make([]string, len(trips))
	for i, t := range trips {
		s[i] = t.Step
	}
	return s
}

type roundTripHook struct{ rt *RoundTrips }

func (h roundTripHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h roundTripHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if ctx.Err() == nil { // else go-redis sends nothing
			h.rt.add(stepOf(cmd))
		}
		return next(ctx, cmd)
	}
}

func (h roundTripHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if ctx.Err() != nil {
			return next(ctx, cmds) // go-redis sends nothing
		}
		var names []string
		for _, c := range cmds {
			switch s := stepOf(c); s {
			case "", "multi", "exec":
			default:
				names = append(names, s)
			}
		}
		h.rt.add(strings.Join(names, "+"))
		return next(ctx, cmds)
	}
}

var (
	byHash     map[string]string
	byHashOnce sync.Once
)

// stepOf names cmd; "" for one left out.
func stepOf(cmd redis.Cmder) string {
	name := cmd.Name()
	args := cmd.Args()
	switch name {
	case "ping":
		return ""
	case "hello", "client":
		// A new connection's set-up (HELLO, CLIENT SETINFO), sent when the
		// pool dials, whatever the traffic: a lease's renewal needing a
		// connection while the others are busy, on a loaded machine.
		return ""
	case "evalsha", "evalsha_ro", "eval", "eval_ro":
		byHashOnce.Do(func() {
			byHash = make(map[string]string, len(scriptNames))
			for _, n := range scriptNames {
				byHash[store.ScriptHash(n)] = n
			}
		})
		if len(args) < 2 {
			return name
		}
		s, _ := args[1].(string)
		if strings.HasPrefix(name, "eval_") || name == "eval" {
			sum := sha1.Sum([]byte(s))
			if n, ok := byHash[hex.EncodeToString(sum[:])]; ok {
				return n + " (eval)"
			}
			return name
		}
		if n, ok := byHash[s]; ok {
			return n
		}
	case "script":
		return "" // SCRIPT LOAD at start
	}
	return name
}
