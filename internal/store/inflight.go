package store

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/coordd/coordd/internal/guardwire"
)

// Slots in flight: a semaphore shared by every instance, one per upstream
// and credential scope (upstream.Protection.MaxInFlight). It is a sorted
// set of holder tokens scored by the end of their lease (µs of Redis's
// clock, or of the one passed in ARGV[1]), so that a holder that dies, or
// loses Redis, frees its slot when its lease ends; its key shares the
// upstream's hash tag with the guard (guardKey), so it lives in the same
// Redis Cluster slot. Beside the sets, one index per upstream scores each
// scope by its latest lease end, so that a status page finds the scopes
// in flight without a SCAN.
//
// A waiter does not poll: it registers with the hub for its set's key,
// then tries, and waits for a slot event, which a release publishes on
// the completion channel (sharded in Redis Cluster, like every event)
// when the set was full, or for the earliest lease end (the backstop for
// a holder that died), and tries again. A release only publishes when
// the set was full before it: a waiter found it full, and the first slot
// freed since is either released, which then finds it full and wakes it,
// or expired, at the earliest lease end its timer waits for.

// EventSlot is a completion channel event: a slot in flight was freed;
// Key names the semaphore (slotKey). Instances that predate it have no
// waiter for such a key and drop it.
const EventSlot = "slot"

// acquireSlotScript drops the expired leases and takes a slot if fewer
// than max are held, else answers how long until the earliest lease
// ends. KEYS: the scope's set, the upstream's index. ARGV = now, token,
// max, lease µs, scope. It returns {1, slots held} or {0, slots held, µs
// until the earliest lease ends}.
var acquireSlotScript = replaySafe(luaNow + `
local z, idx = KEYS[1], KEYS[2]
local token, maxn, lease, scope = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
redis.call('ZREMRANGEBYSCORE', z, '-inf', fmt(now))
local n = redis.call('ZCARD', z)
if n >= maxn then
  local first = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
  return {0, n, tonumber(first[2]) - now}
end
local e = now + lease
local ttl = math.ceil(lease / 1000) + 1000
redis.call('ZADD', z, fmt(e), token)
if redis.call('PTTL', z) < ttl then redis.call('PEXPIRE', z, ttl) end
redis.call('ZREMRANGEBYSCORE', idx, '-inf', fmt(now))
local s = tonumber(redis.call('ZSCORE', idx, scope))
if not s or s < e then redis.call('ZADD', idx, fmt(e), scope) end
if redis.call('PTTL', idx) < ttl then redis.call('PEXPIRE', idx, ttl) end
return {1, n + 1}
`)

// releaseSlotScript gives a slot back, and publishes a slot event when
// the set was full before (someone may wait). KEYS: the scope's set.
// ARGV = now, token, max, channel, event. It returns 1 when a waiter is
// to be woken (the caller announces it in Redis Cluster), else 0; a
// slot already gone (its lease ended) wakes nobody.
var releaseSlotScript = replaySafe(luaNow + `
local z = KEYS[1]
redis.call('ZREMRANGEBYSCORE', z, '-inf', fmt(now))
local n = redis.call('ZCARD', z)
if redis.call('ZREM', z, ARGV[2]) == 0 or n < tonumber(ARGV[3]) then return 0 end
if ARGV[4] ~= '' then redis.call('PUBLISH', ARGV[4], ARGV[5]) end
return 1
`)

// inFlightScopesScript lists the scopes of KEYS[1], an upstream's index,
// whose latest lease has not ended. ARGV = now.
var inFlightScopesScript = redis.NewScript(luaNow + `
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. fmt(now), '+inf')`)

// inFlightCountScript counts the live leases of each of KEYS, scope sets
// of one upstream. ARGV = now.
var inFlightCountScript = redis.NewScript(luaNow + `
local c = {}
for i, k in ipairs(KEYS) do c[i] = redis.call('ZCOUNT', k, '(' .. fmt(now), '+inf') end
return c`)

// slotKey is the set of upstream's slots in flight for scope ("" for the
// fetches without a credential); inFlightKey is upstream's index of
// scopes. Both carry the guard's hash tag.
func (r *Redis) slotKey(upstream, scope string) string {
	return r.prefix + "inflight:{" + upstream + "}:" + scope
}
func (r *Redis) inFlightKey(upstream string) string { return r.prefix + "inflight:{" + upstream + "}" }

// The semaphore's messages, shared with package upstream.
type (
	// Acquire is what AcquireSlot is asked: see guardwire.Acquire.
	Acquire = guardwire.Acquire
	// Slot is AcquireSlot's answer.
	Slot = guardwire.Slot
	// Release is what ReleaseSlot is told.
	Release = guardwire.Release
	// InFlight is what SlotsInFlight reads.
	InFlight = guardwire.InFlight
)

// clockOf is ARGV[1] from a clock: empty for Redis's.
func clockOf(now func() time.Time) string {
	if now == nil {
		return ""
	}
	return clock(now())
}

// AcquireSlot takes one of a.Max slots in flight of upstream's scope,
// shared by every instance, for a.Lease; the holder gives it back with
// ReleaseSlot. When every slot is taken it waits up to a.MaxWait (calling
// a.Waiting once) for a release on any instance, which wakes it over
// pub/sub, or for the earliest lease to end, and tries again; it never
// polls. It returns the slot, or, when none freed in time, a Slot without
// Token that says how long until the earliest lease ends. It fails fast
// while Redis is down, and with ErrUnavailable when Redis fails or is
// found down while it waits (the caller then falls back to an in-process
// semaphore); with ctx's error when ctx ends first. A slot whose reply was
// lost (a timeout) is held until its lease ends.
func (r *Redis) AcquireSlot(ctx context.Context, upstream, scope string, a Acquire) (Slot, error) {
	if a.Max < 1 {
		return Slot{}, fmt.Errorf("coordinator: %d slots in flight: want at least 1", a.Max)
	}
	key, idx := r.slotKey(upstream, scope), r.inFlightKey(upstream)
	var w *Waiter
	var bound <-chan time.Time
	if a.MaxWait > 0 {
		// Registered before the first try, so that no release after it is
		// missed.
		w = r.hub.register(key)
		defer r.hub.unregister(w)
		t := time.NewTimer(a.MaxWait)
		defer t.Stop()
		bound = t.C
	}
	for told := false; ; told = true {
		tried := time.Now()
		s, err := r.tryAcquireSlot(ctx, key, idx, scope, a)
		if err != nil || s.Token != "" || w == nil {
			return s, err
		}
		if !told && a.Waiting != nil {
			a.Waiting(s.Held, s.Wait)
		}
		// One timer, at the earliest lease end: the backstop for a holder
		// that died without releasing.
		ends := time.NewTimer(s.Wait)
		select {
		case <-w.Events(): // a slot freed, or the hub asks to re-check
		case <-ends.C:
		case <-bound:
			ends.Stop()
			s.Wait = max(s.Wait-time.Since(tried), 0)
			return s, nil
		case <-ctx.Done():
			ends.Stop()
			return Slot{}, ctx.Err()
		}
		ends.Stop()
	}
}

// tryAcquireSlot runs acquireSlotScript once.
func (r *Redis) tryAcquireSlot(ctx context.Context, key, idx, scope string, a Acquire) (Slot, error) {
	token := newToken()
	var res []any
	err := r.ifUp(ctx, func(ctx context.Context) (err error) {
		res, err = r.runOnce(ctx, acquireSlotScript, key, []string{key, idx},
			clockOf(a.Now), token, a.Max, a.Lease.Microseconds(), scope).Slice()
		return err
	})
	if err != nil {
		return Slot{}, err
	}
	switch {
	case len(res) == 2 && asInt(res[0]) == 1:
		return Slot{Token: token, Held: int(asInt(res[1]))}, nil
	case len(res) == 3 && asInt(res[0]) == 0:
		return Slot{Held: int(asInt(res[1])), Wait: time.Duration(asInt(res[2])) * time.Microsecond}, nil
	}
	return Slot{}, fmt.Errorf("%w: acquire slot script answered %v", ErrUnavailable, res)
}

// ReleaseSlot gives back the slot rl.Token holds in upstream's scope, and
// wakes the waiters of every instance if all rl.Max slots were taken. It is idempotent, and runs whatever the health state says,
// bounded by the timeout, even once ctx has ended (a holder cut off
// frees its slot): others wait for it. Its error is only for the caller's
// logs; the slot frees itself when its lease ends anyway.
func (r *Redis) ReleaseSlot(ctx context.Context, upstream, scope string, rl Release) error {
	key := r.slotKey(upstream, scope)
	payload := Event{Type: EventSlot, Key: key}.encode()
	channel, msg := r.scriptPublish(payload)
	return r.evenIfDown(context.WithoutCancel(ctx), 0, func(ctx context.Context) error {
		n, err := r.runOnce(ctx, releaseSlotScript, key, []string{key}, clock(rl.Now), rl.Token, rl.Max, channel, msg).Int64()
		if err == nil && n == 1 {
			err = r.announce(ctx, key, payload)
		}
		return err
	})
}

// SlotsInFlight reads the live slots in flight of each of upstream's
// scopes that holds one, in two read-only round trips, within ctx and the
// Redis timeout. now is the clock the slots were taken by (zero: Redis's).
// It fails fast while Redis is down.
func (r *Redis) SlotsInFlight(ctx context.Context, upstream string, now time.Time) (InFlight, error) {
	in := InFlight{}
	err := r.ifUp(ctx, func(ctx context.Context) error {
		scopes, err := inFlightScopesScript.Run(ctx, r.rdb, []string{r.inFlightKey(upstream)}, clock(now)).StringSlice()
		if err != nil || len(scopes) == 0 {
			return err
		}
		keys := make([]string, len(scopes))
		for i, s := range scopes {
			keys[i] = r.slotKey(upstream, s)
		}
		counts, err := inFlightCountScript.Run(ctx, r.rdb, keys, clock(now)).Int64Slice()
		if err != nil {
			return err
		}
		if len(counts) != len(scopes) {
			return fmt.Errorf("%w: in-flight count script answered %v", ErrUnavailable, counts)
		}
		for i, s := range scopes {
			if counts[i] > 0 {
				in[s] = int(counts[i])
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return in, nil
}
