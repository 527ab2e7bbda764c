package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A guard admits attempts to one upstream and learns from their outcomes:
// the circuit breaker, the backoff the upstream asked for, and the rate
// limit, checked together and in that order. redisGuard shares them
// between every instance; localGuard keeps them in-process.

// verdict is a guard's answer to an attempt.
type verdict int

const (
	verdictAdmitted  verdict = iota // go, after admission.wait
	verdictOpen                     // the breaker is open (or its probe slots are taken): fail at once
	verdictOverLimit                // the slot starts past the wait bound: nothing was booked
)

// admission is a guard's answer, carried back to it with the outcome.
type admission struct {
	verdict verdict
	wait    time.Duration // until the slot starts; open: until half-open, when known
	backoff time.Duration // how much of wait is the upstream's backoff
	gen     int64         // the breaker generation the attempt belongs to
	probe   int           // half-open probe slot held, 1-based; 0: none
	shared  bool          // admitted by the redisGuard
}

// probeLease bounds how long a half-open probe holds its slot after its
// start, so that a probe whose result is lost (its instance died) cannot
// keep the breaker half-open for good.
func probeLease(up *Upstream) time.Duration { return up.Timeout + time.Second }

// logTransition logs a breaker state change of upstream, and counts it
// in m.
func logTransition(log *slog.Logger, m Metrics, upstream, scope, from, to string) {
	m.BreakerTransition(upstream, scope, from, to)
	lvl := slog.LevelInfo
	if to == breakerOpen.String() {
		lvl = slog.LevelWarn
	}
	log.Log(context.Background(), lvl, "circuit breaker "+to, "from", from, "scope", scope)
}

// localGuard is the in-process guard: in single-node mode, and in every
// instance while Redis is down, when each one limits only its own
// requests. It is safe for concurrent use.
type localGuard struct {
	now  func() time.Time
	log  *slog.Logger
	m    Metrics
	name string // the upstream's

	mu sync.Mutex // protects br and rl
	br *breaker
	rl *gcra
}

// newLocalGuard returns up's in-process guard; degraded selects the rate
// limit for a Redis that is down over the one for single-node mode. m
// (nil: none) counts its breaker's transitions.
func newLocalGuard(up *Upstream, degraded bool, now func() time.Time, log *slog.Logger, m Metrics) *localGuard {
	p := &up.Protection
	rate := p.RateLimit
	if degraded {
		rate = p.DegradedRateLimit
	}
	return &localGuard{now: now, log: log, m: orNop(m), name: up.Name, br: newBreaker(p.Breaker, probeLease(up)), rl: newGCRA(rate, p.Burst)}
}

func (g *localGuard) admit(maxWait time.Duration) admission {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	ok, slot, open, changed := g.br.check(now)
	if changed {
		logTransition(g.log, g.m, g.name, "instance", breakerOpen.String(), breakerHalfOpen.String())
	}
	if !ok {
		return admission{verdict: verdictOpen, wait: open, gen: g.br.gen}
	}
	wait, backoff, ok := g.rl.reserve(now, maxWait)
	if !ok {
		return admission{verdict: verdictOverLimit, wait: wait, backoff: backoff, gen: g.br.gen}
	}
	g.br.take(slot, now.Add(wait))
	return admission{verdict: verdictAdmitted, wait: wait, backoff: backoff, gen: g.br.gen, probe: slot}
}

func (g *localGuard) record(a admission, o outcome, backoff time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	if backoff > 0 {
		g.rl.backOff(now, backoff)
	}
	from := g.br.state
	if g.br.record(now, a.gen, a.probe, o) {
		logTransition(g.log, g.m, g.name, "instance", from.String(), g.br.state.String())
	}
}

// state is the breaker's state.
func (g *localGuard) state() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.br.state.String()
}

// backOff holds every slot until d from now.
func (g *localGuard) backOff(d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.rl.backOff(g.now(), d)
}

// The shared guard keeps one Redis hash per upstream, so that a script
// touches a single key (and a single Redis Cluster slot). Fields: state,
// gen, until (open: µs when it turns half-open), consec, succ, p1..pN
// (half-open probe slot lease ends), i0..i9/r0..r9/f0..f9 (failure-rate
// window buckets: slice number, attempts, failures), tat (GCRA theoretical
// arrival time, µs), backoff (µs before which no slot starts). Times are in
// microseconds of Redis's clock (TIME) unless a clock is passed in ARGV[1],
// so that instances with skewed clocks share one schedule.
const luaNow = `
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function fmt(n) return string.format('%.0f', n) end
`

// admitScript: ARGV = now, interval µs (0: no limit), tau µs, max wait
// µs, probe slots, probe lease µs, key ttl ms. It returns {verdict, wait
// µs, gen, the state it changed to (empty if none), probe slot, backoff
// µs}.
var admitScript = replaySafe(luaNow + `
local h = KEYS[1]
local interval, tau, maxwait = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local probes, lease, ttl = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local v = redis.call('HMGET', h, 'state', 'until', 'gen', 'tat', 'backoff')
local state = v[1] or 'closed'
local untl, gen = tonumber(v[2]) or 0, tonumber(v[3]) or 0
local tat, backoff = tonumber(v[4]) or 0, tonumber(v[5]) or 0
local changed = ''
if state == 'open' then
  if now < untl then
    return {'open', untl - now, gen, '', 0, 0}
  end
  state, gen, changed = 'half', gen + 1, 'half'
  redis.call('HSET', h, 'state', state, 'gen', gen, 'succ', 0)
  for i = 1, probes do redis.call('HDEL', h, 'p' .. i) end
end
local slot = 0
if state == 'half' then
  for i = 1, probes do
    if (tonumber(redis.call('HGET', h, 'p' .. i)) or 0) <= now then
      slot = i
      break
    end
  end
  if slot == 0 then
    redis.call('PEXPIRE', h, ttl)
    return {'open', 0, gen, changed, 0, 0}
  end
end
local at = math.max(now, backoff)
if interval > 0 then at = math.max(at, tat - tau) end
local boff = math.max(backoff - now, 0)
if at - now > maxwait then
  redis.call('PEXPIRE', h, ttl)
  return {'limited', at - now, gen, changed, 0, boff}
end
if interval > 0 then redis.call('HSET', h, 'tat', fmt(math.max(tat, at) + interval)) end
if slot > 0 then redis.call('HSET', h, 'p' .. slot, fmt(at + lease)) end
redis.call('PEXPIRE', h, ttl)
return {'ok', at - now, gen, changed, slot, boff}
`)

// recordScript: ARGV = now, outcome ('s', 'f' or 'n'), gen, probe slot,
// backoff µs, failure threshold, failure rate, min requests, window µs,
// open for µs, close after, probe slots, key ttl ms. It returns {the
// state before, the state it changed to (empty if none)}.
var recordScript = replaySafe(luaNow + `
local h = KEYS[1]
local o, gen, slot, boff = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local threshold, rate, minreq = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local window, openfor, closeafter = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
local probes, ttl = tonumber(ARGV[12]), tonumber(ARGV[13])
if boff > 0 and now + boff > (tonumber(redis.call('HGET', h, 'backoff')) or 0) then
  redis.call('HSET', h, 'backoff', fmt(now + boff))
end
local v = redis.call('HMGET', h, 'state', 'gen')
local state, cur = v[1] or 'closed', tonumber(v[2]) or 0
local from, changed = state, ''
local function reset(to, untl)
  local f = {'consec', 'succ'}
  for j = 0, 9 do
    f[#f + 1] = 'i' .. j
    f[#f + 1] = 'r' .. j
    f[#f + 1] = 'f' .. j
  end
  for i = 1, probes do f[#f + 1] = 'p' .. i end
  redis.call('HDEL', h, unpack(f))
  redis.call('HSET', h, 'state', to, 'gen', cur + 1, 'until', fmt(untl))
  changed = to
end
if gen == cur then
  if state == 'half' then
    if slot > 0 then redis.call('HDEL', h, 'p' .. slot) end
    if o == 's' then
      if redis.call('HINCRBY', h, 'succ', 1) >= closeafter then reset('closed', 0) end
    elseif o == 'f' then
      reset('open', now + openfor)
    end
  elseif state == 'closed' and o ~= 'n' then
    local idx = math.floor(now / math.max(math.floor(window / 10), 1))
    local k = idx % 10
    if tonumber(redis.call('HGET', h, 'i' .. k)) ~= idx then
      redis.call('HSET', h, 'i' .. k, fmt(idx), 'r' .. k, 0, 'f' .. k, 0)
    end
    redis.call('HINCRBY', h, 'r' .. k, 1)
    local consec = 0
    if o == 'f' then
      redis.call('HINCRBY', h, 'f' .. k, 1)
      consec = redis.call('HINCRBY', h, 'consec', 1)
    else
      redis.call('HSET', h, 'consec', 0)
    end
    local req, fail = 0, 0
    for j = 0, 9 do
      local w = redis.call('HMGET', h, 'i' .. j, 'r' .. j, 'f' .. j)
      local i = tonumber(w[1])
      if i and i > idx - 10 and i <= idx then
        req = req + tonumber(w[2])
        fail = fail + tonumber(w[3])
      end
    end
    if (threshold > 0 and consec >= threshold) or (rate > 0 and req >= minreq and fail >= rate * req) then
      reset('open', now + openfor)
    end
  end
end
redis.call('PEXPIRE', h, ttl)
return {from, changed}
`)

// redisGuard is the guard shared by every instance through Redis: one
// round trip to admit an attempt, one to record its outcome. Its calls go
// through redisLayer.op, so they fail fast while Redis is down, and the
// caller then falls back to the localGuard. It is safe for concurrent use.
type redisGuard struct {
	rl  *redisLayer
	key string
	p   *Protection
	now func() time.Time // nil: Redis's clock
	log *slog.Logger
	m   Metrics
	up  string // the upstream's name

	admitArgs  []any // after now, before max wait and the rest
	recordArgs []any // after outcome, gen, slot and backoff
	ttl        int64 // ms
	lease      int64 // µs
}

func newRedisGuard(rl *redisLayer, up *Upstream, now func() time.Time, log *slog.Logger, m Metrics) *redisGuard {
	p := &up.Protection
	g := &redisGuard{rl: rl, key: rl.prefix + "protect:{" + up.Name + "}", p: p, now: now, log: log, m: orNop(m), up: up.Name}
	var interval, tau int64
	if p.RateLimit > 0 {
		iv := slotInterval(p.RateLimit)
		interval, tau = iv.Microseconds(), (time.Duration(p.Burst-1) * iv).Microseconds()
	}
	g.admitArgs = []any{interval, tau}
	g.ttl = max(time.Hour, 2*(p.Breaker.OpenFor+p.Breaker.Window+p.RetryAfterCap+p.MaxWait)).Milliseconds()
	g.lease = probeLease(up).Microseconds()
	b := &p.Breaker
	g.recordArgs = []any{b.FailureThreshold, b.FailureRate, b.MinRequests, b.Window.Microseconds(),
		b.OpenFor.Microseconds(), b.CloseAfter, b.HalfOpenProbes, g.ttl}
	return g
}

func (g *redisGuard) healthy() bool { return g.rl.healthy() }

// clock is ARGV[1]: empty for Redis's clock.
func (g *redisGuard) clock() string {
	if g.now == nil {
		return ""
	}
	return strconv.FormatInt(g.now().UnixMicro(), 10)
}

func (g *redisGuard) admit(ctx context.Context, maxWait time.Duration) (admission, error) {
	args := append([]any{g.clock()}, g.admitArgs...)
	args = append(args, maxWait.Microseconds(), g.p.Breaker.HalfOpenProbes, g.lease, g.ttl)
	var res []any
	err := g.rl.op(ctx, func(ctx context.Context) (err error) {
		res, err = g.rl.runOnce(ctx, admitScript, g.key, []string{g.key}, args...).Slice()
		return err
	})
	if err != nil {
		return admission{}, err
	}
	if len(res) != 6 {
		return admission{}, fmt.Errorf("%w: admit script answered %v", ErrRedisUnavailable, res)
	}
	a := admission{
		wait:    time.Duration(asInt(res[1])) * time.Microsecond,
		gen:     asInt(res[2]),
		probe:   int(asInt(res[4])),
		backoff: time.Duration(asInt(res[5])) * time.Microsecond,
		shared:  true,
	}
	switch res[0] {
	case "open":
		a.verdict = verdictOpen
	case "limited":
		a.verdict = verdictOverLimit
	}
	if res[3] == "half" {
		logTransition(g.log, g.m, g.up, "cluster", breakerOpen.String(), breakerHalfOpen.String())
	}
	return a, nil
}

func (g *redisGuard) record(ctx context.Context, a admission, o outcome, backoff time.Duration) {
	code := [...]string{outcomeSuccess: "s", outcomeFailure: "f", outcomeNone: "n"}[o]
	args := append([]any{g.clock(), code, a.gen, a.probe, backoff.Microseconds()}, g.recordArgs...)
	var res []any
	err := g.rl.op(ctx, func(ctx context.Context) (err error) {
		res, err = g.rl.runOnce(ctx, recordScript, g.key, []string{g.key}, args...).Slice()
		return err
	})
	if err != nil || len(res) != 2 {
		return // Redis is marked down; the local guard takes over
	}
	if to, _ := res[1].(string); to != "" {
		from, _ := res[0].(string)
		logTransition(g.log, g.m, g.up, "cluster", luaStateName(from), luaStateName(to))
	}
}

// state reads the shared breaker's state.
func (g *redisGuard) state(ctx context.Context) (string, error) {
	var s string
	err := g.rl.op(ctx, func(ctx context.Context) (err error) {
		s, err = g.rl.rdb.HGet(ctx, g.key, "state").Result()
		return err
	})
	switch {
	case errors.Is(err, redis.Nil):
		return breakerClosed.String(), nil
	case err != nil:
		return "", err
	}
	return luaStateName(s), nil
}

func luaStateName(s string) string {
	if s == "half" {
		return breakerHalfOpen.String()
	}
	return s
}

func asInt(v any) int64 {
	n, _ := v.(int64)
	return n
}
