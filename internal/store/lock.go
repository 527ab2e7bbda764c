package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/coordd/coordd/internal/document"
)

// Every script below touches the keys of one cache id only, which share a
// hash tag, so they run in Redis Cluster too. A script that publishes takes
// the channel as an argument and publishes nothing when it is "" (Redis
// Cluster, where the caller SPUBLISHes afterwards: see shard.go).
//
// go-redis replays a command whose connection dropped before its reply
// came back (Options.MaxRetries), so each script may run twice. The lock
// script's replay names our own token, which TryLock takes for our lease;
// extendScript is idempotent; the others change or publish something
// each time they run, so they are replaySafe and run with runOnce.
var (
	// lockScript takes the fill lock and reads id's copy in L2 and its
	// generation in the same step, so that a flight knows in one round
	// trip whether it leads, whom it follows, and what L2 holds as of
	// that moment (a follower registered for pushes before asking misses
	// no landing after it). With peek ("1"), a copy in L2 is returned
	// without taking the lock: the caller decides whether it will do.
	// KEYS: lock, doc, gen. ARGV: token, ttl ms, peek. It returns {1,
	// token, 0, doc, gen} when taken, {0, holder's token, ms left, doc,
	// gen} when held, {2, "", 0, doc, gen} when peek found a copy; doc is
	// nil when absent, gen "" when never set.
	lockScript = redis.NewScript(lockLook + `if redis.call("set", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then return {1, ARGV[1], 0, doc, gen} end
return {0, redis.call("get", KEYS[1]) or "", redis.call("pttl", KEYS[1]), doc, gen}`)
	// claimAdmitScript is lockScript, and, once the lock is ours, the
	// shared guard's admission of the fetch the holder will make
	// (admitBody): the holder learns in one round trip that it leads and
	// whether, or when, it may call the upstream, and an instance that
	// follows books nothing. Its keys span the lock's slot and the
	// guard's, so it runs on a single Redis (or Sentinel's master) only;
	// in Redis Cluster the admission is asked after the lock. A replay
	// finds the lock held by its own token and answers the admission the
	// first run made, which that run kept in its receipt (the last key):
	// only a run that takes the lock writes one. KEYS: lock, doc, gen,
	// the admission's keys, receipt. ARGV: token, ttl ms, peek, how many
	// admission keys, the admission's ARGV, receipt ttl ms. It answers as
	// lockScript, the admission's reply (admitScript's) sixth when the
	// lock is ours.
	claimAdmitScript = redis.NewScript(`
local function admit(KEYS, ARGV)
` + admitBody + `
end` + lockLook + `if not redis.call("set", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then
  local holder = redis.call("get", KEYS[1]) or ""
  if holder ~= ARGV[1] then return {0, holder, redis.call("pttl", KEYS[1]), doc, gen} end
end
local receipt = KEYS[#KEYS]
local kept = redis.call("get", receipt)
local adm
if kept then
  adm = cmsgpack.unpack(kept)
else
  local ak, aa = {}, {}
  for i = 1, tonumber(ARGV[4]) do ak[i] = KEYS[3 + i] end
  for i = 5, #ARGV - 1 do aa[#aa + 1] = ARGV[i] end
  adm = admit(ak, aa)
  redis.call("set", receipt, cmsgpack.pack(adm), "PX", ARGV[#ARGV])
end
return {1, ARGV[1], 0, doc, gen, adm}`)
	// holderScript names the lock's holder and what is left of its lease,
	// {token or "", ms left}, without taking it.
	holderScript = redis.NewScript(`return {redis.call("get", KEYS[1]) or "", redis.call("pttl", KEYS[1])}`)
	// extendScript renews the lease only if it still holds our token.
	extendScript = redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("pexpire", KEYS[1], ARGV[2]) else return 0 end`)
	// landScript stores a fetched document (KEYS[1]: the document key, or
	// a result key for an uncacheable answer, which then also deletes the
	// document), releases the lock and publishes done, in one step, fenced:
	// it refuses (0) unless the lock still holds our token or the id's
	// generation is still the one read before the fetch. Invalidate deletes
	// the lock and bumps the generation, so a fill that started before an
	// Invalidate never lands after it.
	//
	// KEYS: target, lock, gen, doc. ARGV: token, gen read ("?": unknown,
	// UnknownGen), value, ttl ms, channel, event.
	landScript = replaySafe(`
local mine = redis.call("get", KEYS[2]) == ARGV[1]
if not mine then
  if ARGV[2] == "?" or (redis.call("get", KEYS[3]) or "") ~= ARGV[2] then return 0 end
end
redis.call("set", KEYS[1], ARGV[3], "PX", ARGV[4])
if KEYS[1] ~= KEYS[4] then redis.call("del", KEYS[4]) end
if mine then redis.call("del", KEYS[2]) end
if ARGV[5] ~= "" then redis.call("publish", ARGV[5], ARGV[6]) end
return 1`)
	// handOffScript releases the lock if ours and publishes an event.
	// KEYS: lock. ARGV: token, channel, event.
	handOffScript = replaySafe(`
if redis.call("get", KEYS[1]) == ARGV[1] then redis.call("del", KEYS[1]) end
if ARGV[2] ~= "" then redis.call("publish", ARGV[2], ARGV[3]) end
return 1`)
	// invalidateScript deletes the document and the lock, bumps the
	// generation (fencing every fill in flight) and publishes inval.
	// KEYS: doc, lock, gen. ARGV: channel, event, gen ttl ms.
	invalidateScript = replaySafe(`
local existed = redis.call("del", KEYS[1])
redis.call("del", KEYS[2])
redis.call("incr", KEYS[3])
redis.call("pexpire", KEYS[3], ARGV[3])
if ARGV[1] ~= "" then redis.call("publish", ARGV[1], ARGV[2]) end
return existed`)
)

// lockLook is how lockScript and claimAdmitScript begin: read id's
// document and generation, and, with peek, answer a copy found.
const lockLook = `
local doc = redis.call("get", KEYS[2])
local gen = redis.call("get", KEYS[3]) or ""
if doc and ARGV[3] == "1" then return {2, "", 0, doc, gen} end
`

// replaySafe returns a script that runs body at most once per receipt:
// its last key, which the caller makes fresh for each run (runOnce). A
// second run with the same receipt (go-redis replaying the command after
// the connection dropped with the first reply) answers the first run's
// reply and changes nothing. The last ARGV is how long the receipt is
// kept, in ms. The receipt is written by the run it records, so it
// replicates, and survives a failover, together with that run's effects.
// Lua numbers are doubles: replies hold integers below 2^53.
func replaySafe(body string) *redis.Script {
	return redis.NewScript(`
local receipt = KEYS[#KEYS]
if redis.call("exists", receipt) == 1 then return cmsgpack.unpack(redis.call("get", receipt)) end
local reply = (function()
` + body + `
end)()
redis.call("set", receipt, cmsgpack.pack(reply), "PX", ARGV[#ARGV])
return reply`)
}

// runOnce runs s, a replaySafe script, with a fresh receipt in the slot of
// tagged (a key with the hash tag of keys), kept for a minute past ctx's
// deadline: longer than go-redis may go on replaying it.
func (r *Redis) runOnce(ctx context.Context, s *redis.Script, tagged string, keys []string, args ...any) *redis.Cmd {
	keep := time.Minute
	if dl, ok := ctx.Deadline(); ok {
		keep += time.Until(dl)
	}
	keys = append(keys[:len(keys):len(keys)], tagged+":receipt:"+newToken())
	args = append(args[:len(args):len(args)], keep.Milliseconds())
	return s.Run(ctx, r.rdb, keys, args...)
}

// Lease is a fill lock this instance holds, or may hold: when the reply
// to the lock request was lost, the lease is kept (uncertain) so that its
// token can still land, release and publish for the followers that wait
// on it. A watchdog extends it every ttl/3 until StopWatchdog or the
// store's context ends, and the store's Wait waits for it; Land or HandOff
// then deletes the lock. The engine's in-process coordination (single-node
// mode, Redis down) has no Lease.
type Lease struct {
	r     *Redis
	id    string
	token string
	ttl   time.Duration
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
	trace string // W3C traceparent its events carry (SetTrace); "" for none
}

// newToken returns a fresh random token: a lease's, a receipt's, a result
// key's.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Holder is another instance's hold on a fill lock, as last seen.
type Holder struct {
	Token string        // "": nobody held the lock
	Left  time.Duration // what was left of its lease
}

// TryLock takes id's fill lock. It returns the lease when taken; nil and
// the holder when another instance holds it; and, with an error, an
// uncertain lease when Redis did not answer (it may have taken the lock),
// or nil when Redis is marked down and was not asked.
func (r *Redis) TryLock(ctx context.Context, id string, ttl time.Duration) (l *Lease, h Holder, err error) {
	c := r.Claim(ctx, id, ttl, false)
	return c.Lease, c.Holder, c.Err
}

// Claim is what Redis.Claim found, all in one round trip.
type Claim struct {
	// Lease, when not nil, is the fill lock taken; with Err, a lock that
	// may have been taken (the reply was lost).
	Lease *Lease
	// Holder is the instance holding the lock when Lease is nil and
	// Found false.
	Holder Holder
	// Found: peek found a copy in L2 (Doc, when it is id's) and did not
	// ask for the lock.
	Found bool
	// Doc is id's copy in L2 as the lock was looked at (nil: absent,
	// undecodable or not id's), and Enc its encoding.
	Doc *document.Document
	Enc []byte
	// Gen is id's generation as the lock was looked at ("" for none;
	// UnknownGen when Redis did not answer).
	Gen string
	// Admission is the shared guard's answer to the ask ClaimAdmitting
	// folded into the claim: set when the lock was taken and Redis
	// answered, nil otherwise (then nothing was booked, unless the reply
	// was lost).
	Admission *Admission
	// Err: Redis did not answer, or is marked down (then Lease is nil).
	Err error
}

// Claim takes id's fill lock for ttl and reads id's copy in L2 and its
// generation, in one script (the keys share id's slot, so it runs in
// Redis Cluster too): a flight's first look at Redis, and each look at
// the lock after. With peek, a copy in L2 is returned (Found) without
// taking the lock; the caller asks again without peek if it will not do.
// A follower registers for id's pushes before calling Claim: every
// landing after the copy it returns wakes it. See TryLock for the lease.
func (r *Redis) Claim(ctx context.Context, id string, ttl time.Duration, peek bool) (c Claim) {
	return r.ClaimAdmitting(ctx, id, ttl, peek, nil)
}

// AdmitAsk is the admission of the fetch a lock holder will make, asked
// of upstream's shared guard (Admit).
type AdmitAsk struct {
	Upstream string
	Admit    Admit
}

// ClaimAdmitting is Claim, and, when ask is not nil and the lock is taken,
// ask's admission in the same round trip (Claim.Admission); an instance
// that does not take the lock books nothing. In Redis Cluster, where the
// guard's keys are in another slot, it is Claim: the holder asks Admit
// after.
func (r *Redis) ClaimAdmitting(ctx context.Context, id string, ttl time.Duration, peek bool, ask *AdmitAsk) (c Claim) {
	c.Gen = UnknownGen
	token := newToken()
	var res []any
	asked := false
	peekArg := "0"
	if peek {
		peekArg = "1"
	}
	keys := []string{r.lockKey(id), r.docKey(id), r.genKey(id)}
	if r.shards != nil {
		ask = nil // Redis Cluster: see claimAdmitScript
	}
	err := r.ifUp(ctx, func(ctx context.Context) (err error) {
		asked = true
		if ask == nil {
			res, err = lockScript.Run(ctx, r.rdb, keys, token, ttl.Milliseconds(), peekArg).Slice()
			return err
		}
		akeys, aargs := r.admitArgs(ask.Upstream, ask.Admit)
		args := append([]any{token, ttl.Milliseconds(), peekArg, len(akeys)}, aargs...)
		res, err = r.runOnce(ctx, claimAdmitScript, keys[0], append(keys, akeys...), args...).Slice()
		return err
	})
	if err != nil && !asked {
		r.m.Lock("unavailable")
		c.Err = err
		return c
	}
	if err == nil && len(res) != 5 && (ask == nil || len(res) != 6) {
		err = fmt.Errorf("%w: lock script answered %v", ErrUnavailable, res)
	}
	if err == nil {
		c.Gen, _ = res[4].(string)
		s, _ := res[3].(string)
		c.Doc, c.Enc = decodeDoc(s, id)
		if len(res) == 6 {
			adm, _ := res[5].([]any)
			if a, aerr := admission(adm); aerr == nil {
				c.Admission = &a
			} else {
				r.log.Warn("the claim's admission did not parse; the holder asks again", "err", aerr)
			}
		}
		switch asInt(res[0]) {
		case 2:
			c.Found = true
			return c
		case 0:
			h := Holder{Left: time.Duration(asInt(res[2])) * time.Millisecond}
			h.Token, _ = res[1].(string)
			if h.Token != token {
				r.m.Lock("contended")
				c.Holder = h
				return c
			}
			// go-redis replayed the script after the connection dropped
			// with the first run's reply (MaxRetries): the lock the replay
			// found is the one that run took, this lease.
		}
	}
	l := &Lease{r: r, id: id, token: token, ttl: ttl, stop: make(chan struct{}), done: make(chan struct{})}
	if err != nil {
		r.m.Lock("unavailable") // an uncertain lease
		c.Err = err
	} else {
		r.m.Lock("acquired")
	}
	r.watchdogs.Lock()
	if r.waited || r.ctx.Err() != nil {
		close(l.done) // the store has stopped: no watchdog starts after Wait
	} else {
		r.wg.Go(l.watchdog)
	}
	r.watchdogs.Unlock()
	c.Lease = l
	return c
}

// HolderOf reads who holds id's fill lock, and for how long yet.
func (r *Redis) HolderOf(ctx context.Context, id string) (Holder, error) {
	var res []any
	err := r.ifUp(ctx, func(ctx context.Context) (err error) {
		res, err = holderScript.Run(ctx, r.rdb, []string{r.lockKey(id)}).Slice()
		return err
	})
	if err != nil {
		return Holder{}, err
	}
	if len(res) != 2 {
		return Holder{}, fmt.Errorf("%w: holder script answered %v", ErrUnavailable, res)
	}
	h := Holder{Left: time.Duration(asInt(res[1])) * time.Millisecond}
	h.Token, _ = res[0].(string)
	return h, nil
}

func (l *Lease) lockKey() string { return l.r.lockKey(l.id) }

func (l *Lease) watchdog() {
	defer close(l.done)
	t := time.NewTicker(l.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-l.r.ctx.Done():
			return
		case <-t.C:
		}
		var n int64
		err := l.r.ifUp(l.r.ctx, func(ctx context.Context) (err error) {
			n, err = extendScript.Run(ctx, l.r.rdb, []string{l.lockKey()}, l.token, l.ttl.Milliseconds()).Int64()
			return err
		})
		switch {
		case err != nil:
			l.r.m.LockExtension("error")
		case n == 0:
			l.r.m.LockExtension("lost")
			l.r.log.Debug("fill lock not held; the watchdog stops", "lock", l.lockKey())
			return
		default:
			l.r.m.LockExtension("ok")
		}
	}
}

// Token is the lease's token, which the events it publishes carry.
func (l *Lease) Token() string { return l.token }

// StopWatchdog stops extending the lease; idempotent.
func (l *Lease) StopWatchdog() {
	l.once.Do(func() {
		close(l.stop)
		<-l.done
	})
}

func asInt(v any) int64 {
	n, _ := v.(int64)
	return n
}
