// Package store is what coordd keeps in Redis and shares between
// instances: L2 (documents and their generations), the fill locks with
// their leases and watchdogs, the completion events on pub/sub (sharded in
// Redis Cluster), the shared upstream guards, and the health of Redis
// itself. Every key layout, every Lua script and every KEYS/ARGV list is
// in this package: its callers Land, HandOff, Invalidate, TryLock, Admit
// and Record.
package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/coordd/coordd/internal/document"
	"github.com/coordd/coordd/internal/observe"
)

// ErrUnavailable reports that an operation needed Redis and Redis is
// down or did not answer; the coordinator keeps serving in-process
// meanwhile. It is coordinator.ErrRedisUnavailable.
var ErrUnavailable = errors.New("coordinator: redis unavailable")

// Metrics observes the store: its Lock, LockExtension, RedisError and
// RedisHealth events.
type Metrics = observe.Metrics

// rediser is the narrow part of go-redis the coordinator uses; both
// *redis.Client and *redis.ClusterClient satisfy it.
type rediser interface {
	redis.Scripter
	MGet(ctx context.Context, keys ...string) *redis.SliceCmd
	Get(ctx context.Context, key string) *redis.StringCmd
	Publish(ctx context.Context, channel string, message any) *redis.IntCmd
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
	SPublish(ctx context.Context, channel string, message any) *redis.IntCmd
	SSubscribe(ctx context.Context, channels ...string) *redis.PubSub
	Ping(ctx context.Context) *redis.StatusCmd
	HGet(ctx context.Context, key, field string) *redis.StringCmd
	SRandMemberN(ctx context.Context, key string, count int64) *redis.StringSliceCmd
	SMembers(ctx context.Context, key string) *redis.StringSliceCmd
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
}

// Redis is L2, the fill lock and the completion channel, with a health
// tracker. A failed operation only makes Redis suspect: one goroutine, the
// only owner of the health state, then pings it, and marks it down only
// when the ping fails too. While Redis is down, request-path operations
// fail fast with ErrUnavailable (no caller waits on a dead Redis); the
// same goroutine pings it every retry interval and marks it up when it
// answers and the subscription is back. Releases and publishes that others
// wait for are always attempted (bounded by the timeout), whatever the
// health state says. A Redis is safe for concurrent use.
type Redis struct {
	rdb       rediser
	prefix    string
	timeout   time.Duration
	retry     time.Duration
	log       *slog.Logger
	m         Metrics
	onChange  func(up bool)
	resultTTL time.Duration  // of an uncacheable answer's result key
	inlineMax int            // largest encoded document carried in a done event
	sentinel  bool           // rdb is a failover client (Config.Sentinel)
	wg        sync.WaitGroup // the hub, the health watcher and the lease watchdogs
	watchdogs sync.Mutex     // protects waited: a watchdog starts (wg.Go) before Wait, or never
	waited    bool           // Wait was called

	up      atomic.Bool
	downs   atomic.Int64 // up-to-down transitions, for the status page
	suspect chan error   // a failed operation; cap 1, read by watch
	hub     *hub
	shards  []string                  // Redis Cluster: the shard channels (shard.go); nil: one channel
	reload  func(ctx context.Context) // Redis Cluster: asks go-redis to reload its map of the slots; nil otherwise
	ctx     context.Context           // ends on Close
}

// Register returns a waiter for the events of id; the caller must
// Unregister it. Register before re-checking L2, then wait: no wakeup is
// lost.
func (r *Redis) Register(id string) *Waiter { return r.hub.register(id) }

// Unregister stops w; w may be nil.
func (r *Redis) Unregister(w *Waiter) { r.hub.unregister(w) }

// Redis keys of one cache id. The id is in a hash tag, so that in Redis
// Cluster the document, its fill lock and its generation share a slot and
// one script can touch them together.
func (r *Redis) docKey(id string) string  { return r.prefix + "{" + id + "}:doc" }
func (r *Redis) lockKey(id string) string { return r.prefix + "{" + id + "}:lock" }
func (r *Redis) genKey(id string) string  { return r.prefix + "{" + id + "}:gen" }
func (r *Redis) channel() string          { return r.prefix + "events" }

// Healthy reports whether Redis is believed up.
func (r *Redis) Healthy() bool { return r.up.Load() }

// Downs returns how many times Redis was marked down.
func (r *Redis) Downs() int64 { return r.downs.Load() }

// bytesPerSecond is the transfer rate assumed when a Redis operation's
// timeout is scaled to the size of its value: a 10 MiB document gets
// about 300ms on top of the base timeout.
const bytesPerSecond = 32 << 20

// timeoutFor is the timeout of an operation moving size bytes.
func (r *Redis) timeoutFor(size int) time.Duration {
	return r.timeout + time.Duration(int64(size)*int64(time.Second)/bytesPerSecond)
}

// ifUp runs fn on the request path: it fails fast while Redis is down.
func (r *Redis) ifUp(ctx context.Context, fn func(ctx context.Context) error) error {
	if !r.up.Load() {
		return ErrUnavailable
	}
	return r.evenIfDown(ctx, 0, fn)
}

// evenIfDown runs fn with a timeout scaled to size, whatever the health
// state: for what others wait on (releasing a lock, publishing an
// outcome). A reply from Redis, even an error reply such as OOM under
// maxmemory, means that this operation failed, not that Redis is down;
// other failures make Redis suspect.
func (r *Redis) evenIfDown(ctx context.Context, size int, fn func(ctx context.Context) error) error {
	octx, cancel := context.WithTimeout(ctx, r.timeoutFor(size))
	defer cancel()
	err := fn(octx)
	if err == nil || errors.Is(err, redis.Nil) {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err() // the caller's context ended; Redis is not to blame
	}
	if isReply(err) {
		r.m.RedisError("reply")
		return fmt.Errorf("coordinator: redis refused: %w", err)
	}
	r.m.RedisError("unavailable")
	r.reloadSlots()
	r.markSuspect(err)
	return fmt.Errorf("%w: %v", ErrUnavailable, err)
}

// reloadSlots asks go-redis, in Redis Cluster, to reload its map of the
// slots after an operation or ping got no answer: the node may be a master
// that failed over. go-redis reloads the map only on a MOVED reply, which a
// dead node never sends, or once a minute, so without this the slots of a
// failed-over master would be routed to the dead node for up to a minute
// (unless a shard channel subscription on that node broke and was
// re-established, which reloads it too). The reload is asynchronous,
// deduplicated and rate-limited by go-redis.
func (r *Redis) reloadSlots() {
	if r.reload != nil {
		r.reload(r.ctx)
	}
}

// isReply reports whether err is an error reply from the server (OOM,
// NOSCRIPT, WRONGTYPE, READONLY…), as opposed to a network failure or a
// timeout.
func isReply(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	// go-redis reports some client-side conditions as redis.Error too.
	msg := re.Error()
	return !strings.HasPrefix(msg, "redis: ")
}

// markSuspect asks the health owner to check Redis.
func (r *Redis) markSuspect(err error) {
	select {
	case r.suspect <- err:
	default: // a check is already pending
	}
}

// verify is called when the subscription broke: a dead or frozen Redis is
// marked down at once, even with no request in flight to notice it, while
// a subscription that alone was cut (a proxy, CLIENT KILL) degrades
// nothing: the hub resubscribes and every waiter re-checks.
func (r *Redis) verify(err error) { r.markSuspect(err) }

// watch owns the health state until ctx ends. Up, it waits for a suspect
// operation and pings; a failed ping marks Redis down. Down, it pings every
// retry interval and marks Redis up when it answers and the subscription is
// confirmed. Being the only writer, it cannot lose a transition.
func (r *Redis) watch(ctx context.Context) {
	t := time.NewTicker(r.retry)
	defer t.Stop()
	for {
		if r.up.Load() {
			var cause error
			select {
			case <-ctx.Done():
				return
			case cause = <-r.suspect:
			}
			if err := r.ping(ctx); err != nil && ctx.Err() == nil {
				r.setDown(fmt.Errorf("%v; ping: %w", cause, err))
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.suspect: // already down
			continue
		}
		if r.ping(ctx) == nil && r.hub.subscribed() {
			r.up.Store(true)
			r.log.Info("redis available again; coordinating across instances")
			r.m.RedisHealth(true)
			if r.onChange != nil {
				r.onChange(true)
			}
		}
	}
}

// scripts lists every Lua script the coordinator runs.
func scripts() []*redis.Script {
	return []*redis.Script{lockScript, holderScript, extendScript, landScript, handOffScript, invalidateScript, admitScript, recordScript, claimAdmitScript,
		acquireSlotScript, releaseSlotScript}
}

// warm prepares Redis for the first burst: the scripts loaded (so that no
// call pays for EVALSHA's NOSCRIPT round trip) and conns connections
// opened (so that no call pays for a dial).
func (r *Redis) warm(ctx context.Context, conns int) {
	ctx, cancel := context.WithTimeout(ctx, 4*r.timeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, s := range scripts() {
		wg.Go(func() { _ = s.Load(ctx, r.rdb).Err() })
	}
	for range conns {
		wg.Go(func() { _ = r.rdb.Ping(ctx).Err() })
	}
	wg.Wait()
}

func (r *Redis) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	err := r.rdb.Ping(ctx).Err()
	if err != nil {
		r.reloadSlots()
	}
	return err
}

// setDown marks Redis down; only watch (and start-up) calls it.
func (r *Redis) setDown(err error) {
	if r.up.CompareAndSwap(true, false) {
		r.downs.Add(1)
		r.log.Warn("redis unavailable; serving from L1 and coordinating in-process", "err", err)
		r.m.RedisHealth(false)
		if r.onChange != nil {
			r.onChange(false)
		}
		r.hub.resetAll()
	}
}

// UnknownGen is the generation of an id that could not be read: a landing
// under it is fenced by the lock alone (see landScript, where it is "?").
const UnknownGen = "?"

// GetDoc reads id's Document and generation from L2 in one round trip.
// d is nil when absent, undecodable, not id's, or unreadable; enc is the
// encoding it was read from (for L1, so that the body is not encoded
// again). gen is the generation Invalidate last gave id ("" for none), or
// UnknownGen when Redis could not be read.
func (r *Redis) GetDoc(ctx context.Context, id string) (d *document.Document, enc []byte, gen string) {
	var vals []any
	err := r.ifUp(ctx, func(ctx context.Context) (err error) {
		vals, err = r.rdb.MGet(ctx, r.docKey(id), r.genKey(id)).Result()
		return err
	})
	if err != nil || len(vals) != 2 {
		return nil, nil, UnknownGen
	}
	gen, _ = vals[1].(string)
	s, _ := vals[0].(string)
	d, enc = decodeDoc(s, id)
	return d, enc, gen
}

// decodeDoc decodes id's Document from s, a value read from L2; nil when
// s is empty, undecodable or not id's.
func decodeDoc(s, id string) (*document.Document, []byte) {
	if s == "" {
		return nil, nil
	}
	b := bytesOf(s)
	d, err := document.Decode(b)
	if err != nil || d.ID() != id {
		return nil, nil
	}
	return d, b
}

// bytesOf returns a copy of s's bytes: a Document's body aliases its
// encoding, and go-redis hands values over as strings, whose memory must
// never be written. One copy per document read from L2 (or pushed
// inline), not per caller; BenchmarkGetDoc measures it.
func bytesOf(s string) []byte { return []byte(s) }

// getRaw reads the Document stored under rkey; nil unless it is id's.
func (r *Redis) getRaw(ctx context.Context, rkey, id string) (*document.Document, []byte) {
	var s string
	err := r.ifUp(ctx, func(ctx context.Context) (err error) {
		s, err = r.rdb.Get(ctx, rkey).Result()
		return err
	})
	if err != nil {
		return nil, nil
	}
	b := bytesOf(s)
	d, err := document.Decode(b)
	if err != nil || d.ID() != id {
		return nil, nil
	}
	return d, b
}

// Config configures a Redis store.
type Config struct {
	Prefix        string        // prefixes every key and channel
	Timeout       time.Duration // of each operation on the request path
	RetryInterval time.Duration // between pings while Redis is down
	// ResultTTL is how long an uncacheable answer is kept for followers.
	ResultTTL time.Duration
	// InlineMaxBytes is the largest encoded document carried inside a
	// done event; negative: never inline.
	InlineMaxBytes int
	Logger         *slog.Logger
	Metrics        Metrics // nil: none
	// Sentinel says that rdb is a failover client (redis.NewFailoverClient),
	// which Mode then names "sentinel". go-redis returns one as a plain
	// *redis.Client, with nothing public to tell it apart (but a
	// placeholder address, which a real host may bear): whoever built it
	// says so.
	Sentinel bool
	// OnHealth, when set, is called whenever Redis is found down (false)
	// or back (true).
	OnHealth func(up bool)
	// OnInvalidate is called for every inval event, with its id.
	OnInvalidate func(id string)
	// OnDrop is called for every done event of an answer that turned
	// uncacheable, with its id: its old copy must go from L1.
	OnDrop func(id string)
}

// Start returns the store over rdb (a *redis.Client, a
// *redis.ClusterClient, which switches it to sharded pub/sub, or a
// failover client), with its subscription hub and health watcher running
// until ctx ends; Wait waits for them then. It waits up to 4 timeouts for
// the subscription: a Redis that does not answer by then starts the store
// down, and it recovers by itself.
func Start(ctx context.Context, rdb redis.UniversalClient, cfg Config) *Redis {
	r := &Redis{
		rdb:       rdb,
		prefix:    cfg.Prefix,
		timeout:   cfg.Timeout,
		retry:     cfg.RetryInterval,
		log:       cfg.Logger,
		m:         cfg.Metrics,
		onChange:  cfg.OnHealth,
		resultTTL: cfg.ResultTTL,
		inlineMax: cfg.InlineMaxBytes,
		sentinel:  cfg.Sentinel,
		suspect:   make(chan error, 1),
		ctx:       ctx,
	}
	if r.m == nil {
		r.m = observe.Nop{}
	}
	if r.log == nil {
		r.log = slog.Default()
	}
	r.hub = r.newHub(rdb, cfg.OnInvalidate) // sharded pub/sub on a Redis Cluster
	r.hub.onDrop = cfg.OnDrop
	ready := make(chan struct{})
	var once sync.Once
	r.hub.onUp = func() { once.Do(func() { close(ready) }) }
	r.wg.Go(func() { r.hub.run(ctx, max(time.Second, 4*r.timeout), r.verify) })
	select {
	case <-ready:
		r.warm(ctx, 8)
		r.up.Store(true)
	case <-time.After(4 * r.timeout):
		pctx, cancel := context.WithTimeout(ctx, r.timeout)
		err := r.rdb.Ping(pctx).Err()
		cancel()
		if c, ok := r.rdb.(*redis.Client); ok && !r.sentinel && errors.Is(err, context.DeadlineExceeded) {
			// go-redis's retries outlast the ping: one plain dial names
			// the cause (connection refused, no such host).
			if conn, derr := net.DialTimeout("tcp", c.Options().Addr, r.timeout); derr != nil {
				err = derr
			} else {
				conn.Close()
			}
		}
		if err == nil {
			err = errors.New("it answered a ping, not the subscription, within 4 × redis_timeout")
		}
		r.log.Warn("redis unavailable at start: serving from L1 and coordinating in-process until it answers",
			"redis", r.describe(), "mode", r.Mode(), "err", err)
		if r.onChange != nil {
			r.onChange(false)
		}
	}
	r.wg.Go(func() { r.watch(ctx) })
	return r
}

// Wait waits, once the context Start was given has ended, for the store's
// goroutines to stop: the hub, the health watcher and every lease's
// watchdog.
func (r *Redis) Wait() {
	r.watchdogs.Lock()
	r.waited = true // so that wg.Go never races wg.Wait
	r.watchdogs.Unlock()
	r.wg.Wait()
}

// describe names the Redis r talks to for a log: its address or
// addresses, never a password (go-redis keeps that apart from them).
func (r *Redis) describe() string {
	switch c := r.rdb.(type) {
	case *redis.ClusterClient:
		return strings.Join(c.Options().Addrs, ",")
	case *redis.Client:
		if r.sentinel {
			return "the master named by Sentinel"
		}
		return c.Options().Addr
	}
	return "redis"
}
