package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/coordd/coordd/internal/guardwire"
)

// The shared guard keeps one Redis hash per upstream, so that a script
// touches a single key (and a single Redis Cluster slot). Fields: state,
// gen, until (open: µs when it turns half-open), consec, succ, p1..pN
// (half-open probe slot lease ends), i0..i9/r0..r9/f0..f9 (failure-rate
// window buckets: slice number, attempts, failures), tat (GCRA theoretical
// arrival time, µs), backoff (µs before which no slot starts). Times are in
// microseconds of Redis's clock (TIME) unless a clock is passed in ARGV[1],
// so that instances with skewed clocks share one schedule.
var luaNow = luaConsts + `
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function fmt(n) return string.format('%.0f', n) end
`

// luaConsts are guardwire's constants of the guard's arithmetic as Lua
// locals, at the head of every guard script: BUCKETS, QSLACK (µs),
// QMARGIN, QRESERVE. One definition, in Go.
var luaConsts = fmt.Sprintf("local BUCKETS, QSLACK, QMARGIN, QRESERVE = %d, %d, %d, %d\n",
	guardwire.BreakerBuckets, guardwire.QuotaSlack.Microseconds(), guardwire.QuotaMarginParts, guardwire.ReserveParts)

// luaQuota reads a learned quota from its credential scope's hash
// (KEYS[2] when ARGV[8] is '1'): the partition the route ARGV[12] was
// last answered under (field route|ROUTE), else ARGV[11]; then that
// partition's fields, each named FIELD|PARTITION: rem (requests left after
// the slots booked; absent: window unknown), reset (µs), tat (µs: the next
// slot's earliest start), limit, win (µs: the longest reset seen), src,
// label, seen (µs). roll and edge are the same arithmetic as upstream's
// quotaWindow.
var luaQuota = `
local qk, part = nil, ''
if ARGV[8] == '1' then
  qk, part = KEYS[2], ARGV[11]
  local m = redis.call('HGET', qk, 'route|' .. ARGV[12])
  if m then part = m end
end
local qrem, qreset, qtat, qlimit, qwin = nil, 0, 0, 0, 0
if qk then
  local q = redis.call('HMGET', qk, 'rem|' .. part, 'reset|' .. part, 'tat|' .. part, 'limit|' .. part, 'win|' .. part)
  qrem, qreset, qtat = tonumber(q[1]), tonumber(q[2]) or 0, tonumber(q[3]) or 0
  qlimit, qwin = tonumber(q[4]) or 0, tonumber(q[5]) or 0
end
local function margin() return math.min(QSLACK, math.floor(qwin / QMARGIN)) end
local function edge() return qreset + margin() end
local qrolled = false
local function roll(t)
  if qrem and edge() <= t then
    qrolled = true
    if qlimit > 0 and qwin > 0 then
      qreset = qreset + (math.floor((t - qreset) / qwin) + 1) * qwin
      qrem = qlimit
    else
      qrem = nil
    end
  end
end
-- keep a window rolled by an admission that books nothing, as
-- quotaWindow.roll keeps it: where the next roll starts from decides
-- whether a time just past a reset is within its margin
local function qpersist()
  if qrolled then
    if qrem then
      redis.call('HSET', qk, 'rem|' .. part, fmt(qrem), 'reset|' .. part, fmt(qreset))
    else
      redis.call('HDEL', qk, 'rem|' .. part)
    end
  end
end
`

// admitScript: ARGV = now, interval µs (0: no limit), tau µs, max wait
// µs, probe slots, probe lease µs, key ttl ms, quota ('1': KEYS[2] is the
// credential scope's learned quotas), burst, background ('1'), partition,
// route (see luaQuota). It returns {verdict,
// wait µs, gen, the state it changed to (empty if none), probe slot,
// backoff µs, paced µs}, and when admitted, 1 if the quota is not known
// yet, the slack µs (-1: none): how late the slot may start and still
// be within its quota window's slots, and 1 if the slot books the rate
// limit when it starts (Admission.RateLater). Verdict 'again' books
// nothing: the quota's window is spent, and the attempt asks again after
// wait, when the next one begins.
var admitScript = replaySafe(admitBody)

// admitBody is admitScript without its receipt: claimAdmitScript (lock.go)
// runs it too, as a function of its own KEYS and ARGV.
var admitBody = luaNow + luaQuota + `
local h = KEYS[1]
local interval, tau, maxwait = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local probes, lease, ttl = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local burst, bg = tonumber(ARGV[9]), ARGV[10]
local v = redis.call('HMGET', h, 'state', 'until', 'gen', 'tat', 'backoff')
local state = v[1] or 'closed'
local untl, gen = tonumber(v[2]) or 0, tonumber(v[3]) or 0
local tat, backoff = tonumber(v[4]) or 0, tonumber(v[5]) or 0
local changed = ''
if state == 'open' then
  if now < untl then
    return {'open', untl - now, gen, '', 0, 0, 0}
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
    return {'open', 0, gen, changed, 0, 0, 0}
  end
end
local at = now
roll(now)
local unknown = 0
if qk and not qrem then unknown = 1 end
if qrem then
  if bg == '1' and qrem <= math.max(1, math.floor(qlimit / QRESERVE)) then
    qpersist()
    redis.call('PEXPIRE', h, ttl)
    return {'limited', edge() - now, gen, changed, 0, 0, edge() - now}
  end
  local again = qrem <= 0
  if not again then
    at = math.max(now, qtat - (burst - 1) * (math.max(qreset - margin() - now, 0) / qrem))
    again = at >= qreset - margin()
    if again and qlimit > 0 and 2 * qrem > qlimit then at, again = now, false end
  end
  if again then
    qpersist()
    redis.call('PEXPIRE', h, ttl)
    local verdict = 'again'
    if edge() - now > maxwait then verdict = 'limited' end
    return {verdict, edge() - now, gen, changed, 0, 0, edge() - now}
  end
end
local paced = at - now
at = math.max(at, backoff)
local later = 0
if interval > 0 and qrem and paced > 0 and slot == 0 then later = 1 end
if interval > 0 and later == 0 then at = math.max(at, tat - tau) end
local boff = math.max(backoff - now, 0)
if at - now > maxwait then
  qpersist()
  redis.call('PEXPIRE', h, ttl)
  return {'limited', at - now, gen, changed, 0, boff, paced}
end
if interval > 0 and later == 0 then redis.call('HSET', h, 'tat', fmt(math.max(tat, at) + interval)) end
if slot > 0 then redis.call('HSET', h, 'p' .. slot, fmt(at + lease)) end
redis.call('PEXPIRE', h, ttl)
if qk then
  roll(at)
  if qrem then
    local nxt = math.max(qtat, at) + math.max(qreset - margin() - at, 0) / math.max(qrem, 1)
    qrem = qrem - 1
    if qrem <= 0 then
      qrem, qtat = 0, edge()
    else
      qtat = nxt
    end
    redis.call('HSET', qk, 'rem|' .. part, fmt(qrem), 'reset|' .. part, fmt(qreset), 'tat|' .. part, fmt(qtat))
  else
    redis.call('HDEL', qk, 'rem|' .. part)
    -- a count whose last lease ended is over (as localGuard.admit's)
    if (tonumber(redis.call('HGET', qk, 'unbx')) or 0) < now then redis.call('HSET', qk, 'unb', 0, 'chg', 0) end
    redis.call('HINCRBY', qk, 'unb', 1)
    redis.call('HSET', qk, 'unbx', fmt(at + lease))
    if redis.call('PTTL', qk) < 0 then redis.call('PEXPIRE', qk, ttl) end
  end
end
local slack = -1
if qrem and qreset - margin() - at >= 0 then slack = qreset - margin() - at end
return {'ok', at - now, gen, changed, slot, boff, paced, unknown, slack, later}
`

// recordScript: ARGV = now, outcome ('s', 'f' or 'n'), gen, probe slot,
// backoff µs, failure threshold, failure rate, min requests, window µs,
// open for µs, close after, probe slots, key ttl ms, and for a quota the
// answer announced (KEYS[2] its credential scope's hash, KEYS[3] the
// upstream's index of scopes): remaining, limit, reset µs from now,
// partition, source, label, the scope, the route answered, '1' if the
// request was not booked (QuotaNote.Unbooked), and the bound of a reset
// (guardwire.MaxQuotaReset, µs); a quota outside those bounds is not
// learned. It returns {the state
// before, the state it changed to (empty if none)}.
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
  for j = 0, BUCKETS - 1 do
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
    local idx = math.floor(now / math.max(math.floor(window / BUCKETS), 1))
    local k = idx % BUCKETS
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
    for j = 0, BUCKETS - 1 do
      local w = redis.call('HMGET', h, 'i' .. j, 'r' .. j, 'f' .. j)
      local i = tonumber(w[1])
      if i and i > idx - BUCKETS and i <= idx then
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
local arem, alimit, areset = tonumber(ARGV[14]), tonumber(ARGV[15]), tonumber(ARGV[16])
-- One consistent (limit, remaining, reset) or nothing, whoever sent it:
-- the same bounds as the Go parser's (guardwire.QuotaNote).
local believed = arem and alimit and areset and alimit >= 1 and arem >= 0 and arem <= alimit
  and areset >= 0 and areset <= (tonumber(ARGV[23]) or 0)
if #KEYS == 4 and believed then
  local qk, part = KEYS[2], ARGV[17]
  local known = redis.call('HEXISTS', qk, 'seen|' .. part) == 1
  if known or redis.call('HLEN', qk) < 1024 then
    local q = redis.call('HMGET', qk, 'rem|' .. part, 'reset|' .. part, 'tat|' .. part, 'limit|' .. part, 'win|' .. part)
    local rem, reset, qtat = tonumber(q[1]), tonumber(q[2]) or 0, tonumber(q[3]) or 0
    local limit, win = tonumber(q[4]) or 0, tonumber(q[5]) or 0
    if rem and reset + math.min(QSLACK, math.floor(win / QMARGIN)) <= now then
      if limit > 0 and win > 0 then
        reset = reset + (math.floor((now - reset) / win) + 1) * win
        rem = limit
      else
        rem = nil
      end
    end
    local u = redis.call('HMGET', qk, 'unb', 'chg', 'unbx')
    local unb, chg = tonumber(u[1]) or 0, tonumber(u[2]) or 0
    if (tonumber(u[3]) or 0) < now then unb, chg = 0, 0 end
    local unbooked = ARGV[22] == '1' and unb > 0
    if unbooked then unb = unb - 1 end
    local nreset = now + areset
    if not rem or nreset > reset + QSLACK then
      rem, reset, chg = math.max(arem - unb, 0), nreset, unb
    else
      if unbooked then
        if chg > 0 then chg = chg - 1 else rem = math.max(rem - 1, 0) end
      end
      rem = math.min(rem, arem)
      reset = math.max(reset, nreset)
    end
    redis.call('HSET', qk, 'unb', unb, 'chg', math.min(chg, unb))
    win = math.max(win, areset)
    local f = {'rem|' .. part, fmt(rem), 'reset|' .. part, fmt(reset), 'win|' .. part, fmt(win),
      'src|' .. part, ARGV[18], 'label|' .. part, ARGV[19], 'seen|' .. part, fmt(now), 'route|' .. ARGV[21], part}
    f[#f + 1] = 'limit|' .. part
    f[#f + 1] = fmt(alimit)
    local edge = reset + math.min(QSLACK, math.floor(win / QMARGIN))
    if rem == 0 and qtat < edge then
      f[#f + 1] = 'tat|' .. part
      f[#f + 1] = fmt(edge)
    end
    redis.call('HSET', qk, unpack(f))
    local keep = ttl + math.floor(math.max(reset - now, win) / 1000)
    if redis.call('PTTL', qk) < keep then redis.call('PEXPIRE', qk, keep) end
    redis.call('SADD', KEYS[3], ARGV[20])
    if redis.call('PTTL', KEYS[3]) < keep then redis.call('PEXPIRE', KEYS[3], keep) end
  end
end
return {from, changed}
`)

// guardKey is the hash of upstream's shared guard.
func (r *Redis) guardKey(upstream string) string { return r.prefix + "protect:{" + upstream + "}" }

// quotaKey is the hash of the quotas learned for one credential scope of
// upstream ("" none), in the guard's slot.
func (r *Redis) quotaKey(upstream, scope string) string {
	return r.prefix + "quota:{" + upstream + "}:" + scope
}

// quotaIndex is the set of upstream's credential scopes with learned
// quotas.
func (r *Redis) quotaIndex(upstream string) string { return r.prefix + "quotas:{" + upstream + "}" }

// The guard's messages, shared with package upstream, whose guards ask
// them (upstream.Shared).
type (
	// Admit is what admitScript is asked: see there.
	Admit = guardwire.Admit
	// Admission is admitScript's answer.
	Admission = guardwire.Admission
	// Record is what recordScript is told: see there.
	Record = guardwire.Record
)

// clock is ARGV[1]: empty for Redis's clock.
func clock(now time.Time) string {
	if now.IsZero() {
		return ""
	}
	return strconv.FormatInt(now.UnixMicro(), 10)
}

// Admit asks upstream's shared guard to admit an attempt, in one round
// trip. It fails fast while Redis is down.
func (r *Redis) Admit(ctx context.Context, upstream string, a Admit) (Admission, error) {
	keys, args := r.admitArgs(upstream, a)
	var res []any
	err := r.ifUp(ctx, func(ctx context.Context) (err error) {
		res, err = r.runOnce(ctx, admitScript, keys[0], keys, args...).Slice()
		return err
	})
	if err != nil {
		return Admission{}, err
	}
	return admission(res)
}

// admitArgs are admitScript's KEYS and ARGV (receipt aside) for a.
func (r *Redis) admitArgs(upstream string, a Admit) (keys []string, args []any) {
	keys, quota := []string{r.guardKey(upstream)}, "0"
	if a.Quota {
		keys, quota = append(keys, r.quotaKey(upstream, a.Scope)), "1"
	}
	bg := "0"
	if a.Background {
		bg = "1"
	}
	return keys, []any{clock(a.Now), a.Interval.Microseconds(), a.Tau.Microseconds(), a.MaxWait.Microseconds(),
		a.Probes, a.Lease.Microseconds(), a.TTL.Milliseconds(), quota, max(a.Burst, 1), bg, a.Partition, a.Route}
}

// admission reads admitBody's reply.
func admission(res []any) (Admission, error) {
	if len(res) != 7 && len(res) != 10 {
		return Admission{}, fmt.Errorf("%w: admit script answered %v", ErrUnavailable, res)
	}
	verdict, _ := res[0].(string)
	changed, _ := res[3].(string)
	return withSlack(Admission{
		Verdict:   verdict,
		Wait:      time.Duration(asInt(res[1])) * time.Microsecond,
		Gen:       asInt(res[2]),
		Changed:   changed,
		Probe:     int(asInt(res[4])),
		Backoff:   time.Duration(asInt(res[5])) * time.Microsecond,
		Paced:     time.Duration(asInt(res[6])) * time.Microsecond,
		Unknown:   len(res) >= 8 && asInt(res[7]) == 1,
		RateLater: len(res) >= 10 && asInt(res[9]) == 1,
		Slack:     -1,
	}, res), nil
}

// Record tells upstream's shared guard an attempt's outcome, in one round
// trip, and returns the breaker's state before and the state it changed
// to ("" if none), as the script names them ("closed", "half", "open").
// It fails fast while Redis is down.
func (r *Redis) Record(ctx context.Context, upstream string, o Record) (from, to string, err error) {
	key := r.guardKey(upstream)
	args := []any{clock(o.Now), o.Outcome, o.Gen, o.Probe, o.Backoff.Microseconds(),
		o.FailureThreshold, o.FailureRate, o.MinRequests, o.Window.Microseconds(),
		o.OpenFor.Microseconds(), o.CloseAfter, o.Probes, o.TTL.Milliseconds()}
	keys := []string{key}
	if q := o.Quota; q != nil {
		keys = append(keys, r.quotaKey(upstream, q.Scope), r.quotaIndex(upstream))
		unbooked := "0"
		if q.Unbooked {
			unbooked = "1"
		}
		args = append(args, q.Remaining, q.Limit, q.Reset.Microseconds(), q.Partition, q.Source, q.Label, q.Scope, q.Route, unbooked,
			guardwire.MaxQuotaReset.Microseconds())
	}
	var res []any
	err = r.ifUp(ctx, func(ctx context.Context) (err error) {
		res, err = r.runOnce(ctx, recordScript, key, keys, args...).Slice()
		return err
	})
	if err != nil {
		return "", "", err
	}
	if len(res) != 2 {
		return "", "", fmt.Errorf("%w: record script answered %v", ErrUnavailable, res)
	}
	from, _ = res[0].(string)
	to, _ = res[1].(string)
	return from, to, nil
}

// ClearQuotas forgets the quotas learned of upstream, every credential
// scope's, with the routes' partitions, and the backoff every instance
// holds it for (a spent quota's, or a Retry-After's); the breaker and the
// rate limit stay. Every key is in the guard's slot, so this is one
// pipeline on a Cluster too.
func (r *Redis) ClearQuotas(ctx context.Context, upstream string) error {
	return r.ifUp(ctx, func(ctx context.Context) error {
		index := r.quotaIndex(upstream)
		scopes, err := r.rdb.SMembers(ctx, index).Result()
		if err != nil {
			return err
		}
		keys := []string{index}
		for _, sc := range scopes {
			keys = append(keys, r.quotaKey(upstream, sc))
		}
		_, err = r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for chunk := range slices.Chunk(keys, 256) {
				p.Del(ctx, chunk...)
			}
			p.HDel(ctx, r.guardKey(upstream), "backoff")
			return nil
		})
		return err
	})
}

// BreakerState reads the state of upstream's shared breaker, as the
// scripts name it ("closed" when it has none yet).
func (r *Redis) BreakerState(ctx context.Context, upstream string) (string, error) {
	var s string
	err := r.ifUp(ctx, func(ctx context.Context) (err error) {
		s, err = r.rdb.HGet(ctx, r.guardKey(upstream), "state").Result()
		return err
	})
	switch {
	case errors.Is(err, redis.Nil):
		return "closed", nil
	case err != nil:
		return "", err
	}
	return s, nil
}

// withSlack sets a's Slack from an admit script's answer res.
func withSlack(a Admission, res []any) Admission {
	if len(res) >= 9 {
		if us := asInt(res[8]); us >= 0 {
			a.Slack = time.Duration(us) * time.Microsecond
		}
	}
	return a
}
