package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrRedisUnavailable reports that an operation needed Redis and Redis is
// down; the coordinator keeps serving in-process meanwhile.
var ErrRedisUnavailable = errors.New("coordinator: redis unavailable")

// rediser is the narrow part of go-redis the coordinator uses; both
// *redis.Client and *redis.ClusterClient satisfy it.
type rediser interface {
	redis.Scripter
	Get(ctx context.Context, key string) *redis.StringCmd
	Set(ctx context.Context, key string, value any, expiration time.Duration) *redis.StatusCmd
	SetNX(ctx context.Context, key string, value any, expiration time.Duration) *redis.BoolCmd
	Del(ctx context.Context, keys ...string) *redis.IntCmd
	Publish(ctx context.Context, channel string, message any) *redis.IntCmd
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
	Ping(ctx context.Context) *redis.StatusCmd
}

// redisLayer is L2, the fill lock and the completion channel, with a health
// tracker: the first failed operation marks Redis down, after which every
// operation fails fast with ErrRedisUnavailable (no caller waits on a dead
// Redis) until a background probe sees it answer again.
type redisLayer struct {
	rdb      rediser
	prefix   string
	timeout  time.Duration
	retry    time.Duration
	log      *slog.Logger
	onChange func(up bool)

	up      atomic.Bool
	probing atomic.Bool
	hub     *hub
	ctx     context.Context // ends on Close
	wg      sync.WaitGroup
}

func (r *redisLayer) docKey(key string) string  { return r.prefix + "doc:" + key }
func (r *redisLayer) lockKey(key string) string { return r.prefix + "lock:" + key }
func (r *redisLayer) channel() string           { return r.prefix + "events" }

// healthy reports whether Redis is believed up.
func (r *redisLayer) healthy() bool { return r.up.Load() }

// op runs fn with the per-operation timeout, failing fast when Redis is down
// and marking it down when fn fails for a reason other than the caller's.
func (r *redisLayer) op(ctx context.Context, fn func(ctx context.Context) error) error {
	if !r.up.Load() {
		return ErrRedisUnavailable
	}
	octx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	err := fn(octx)
	if err == nil || errors.Is(err, redis.Nil) {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err() // the caller's context ended; Redis is not to blame
	}
	r.markDown(err)
	return fmt.Errorf("%w: %v", ErrRedisUnavailable, err)
}

// verify pings Redis after the subscription broke: a dead or frozen Redis
// is marked down at once, even with no request in flight to notice it,
// while a subscription that alone was cut (a proxy, CLIENT KILL) degrades
// nothing: the hub resubscribes and every waiter re-checks.
func (r *redisLayer) verify(error) {
	_ = r.op(r.ctx, func(ctx context.Context) error { return r.rdb.Ping(ctx).Err() })
}

func (r *redisLayer) markDown(err error) {
	if r.up.CompareAndSwap(true, false) {
		r.log.Warn("redis unavailable; serving from L1 and coordinating in-process", "err", err)
		if r.onChange != nil {
			r.onChange(false)
		}
		r.hub.resetAll()
	}
	if r.probing.CompareAndSwap(false, true) {
		r.wg.Add(1)
		go r.probe()
	}
}

// probe pings Redis until it answers, then marks it up again.
func (r *redisLayer) probe() {
	defer r.wg.Done()
	defer r.probing.Store(false)
	t := time.NewTicker(r.retry)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(r.ctx, r.timeout)
		err := r.rdb.Ping(ctx).Err()
		cancel()
		if err == nil && r.hub.subscribed() {
			if r.up.CompareAndSwap(false, true) {
				r.log.Info("redis available again; coordinating across instances")
				if r.onChange != nil {
					r.onChange(true)
				}
			}
			return
		}
	}
}

// getDoc reads key's Document from L2, with the encoding it was read
// from (for L1, so that the body is not encoded again); nil when absent,
// undecodable or unreadable (a failure marks Redis down).
func (r *redisLayer) getDoc(ctx context.Context, key string) (*Document, []byte) {
	return r.getRaw(ctx, r.docKey(key), key)
}

func (r *redisLayer) getRaw(ctx context.Context, rkey, key string) (*Document, []byte) {
	var b []byte
	err := r.op(ctx, func(ctx context.Context) (err error) {
		b, err = r.rdb.Get(ctx, rkey).Bytes()
		return err
	})
	if err != nil {
		return nil, nil
	}
	d, err := decodeDocument(b)
	if err != nil || d.Key != key {
		return nil, nil
	}
	return d, b
}

// setDoc stores d, encoded as enc, in L2 until d.StaleUntil.
func (r *redisLayer) setDoc(ctx context.Context, d *Document, enc []byte, now time.Time) error {
	ttl := d.StaleUntil.Sub(now)
	if ttl < time.Millisecond {
		return nil
	}
	return r.setRaw(ctx, r.docKey(d.Key), enc, ttl)
}

func (r *redisLayer) setRaw(ctx context.Context, rkey string, enc []byte, ttl time.Duration) error {
	return r.op(ctx, func(ctx context.Context) error { return r.rdb.Set(ctx, rkey, enc, ttl).Err() })
}

// delDoc removes key from L2 and reports whether it was there.
func (r *redisLayer) delDoc(ctx context.Context, key string) (bool, error) {
	var n int64
	err := r.op(ctx, func(ctx context.Context) (err error) {
		n, err = r.rdb.Del(ctx, r.docKey(key)).Result()
		return err
	})
	return n > 0, err
}

func (r *redisLayer) publish(ctx context.Context, ev event) error {
	b := ev.encode()
	return r.op(ctx, func(ctx context.Context) error { return r.rdb.Publish(ctx, r.channel(), b).Err() })
}
