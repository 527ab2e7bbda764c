package coordinator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	// releaseScript deletes the lock only if it still holds our token, so a
	// holder whose lease expired never deletes a successor's lock.
	releaseScript = redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`)
	// extendScript renews the lease only if it still holds our token.
	extendScript = redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("pexpire", KEYS[1], ARGV[2]) else return 0 end`)
)

// lease is a held fill lock. A watchdog extends it every ttl/3 until
// release. A nil *lease is valid and means "in-process only" (Redis down or
// embedded mode); its methods do nothing.
type lease struct {
	r     *redisLayer
	key   string // Redis key of the lock
	token string
	ttl   time.Duration
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
}

func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// tryLock takes key's fill lock with SET NX PX. It returns (nil, false, nil)
// when another instance holds it, and an error wrapping
// ErrRedisUnavailable when Redis cannot tell.
func (r *redisLayer) tryLock(ctx context.Context, key string, ttl time.Duration) (*lease, bool, error) {
	l := &lease{r: r, key: r.lockKey(key), token: newToken(), ttl: ttl, stop: make(chan struct{}), done: make(chan struct{})}
	var ok bool
	err := r.op(ctx, func(ctx context.Context) (err error) {
		ok, err = r.rdb.SetNX(ctx, l.key, l.token, ttl).Result()
		return err
	})
	if err != nil || !ok {
		return nil, false, err
	}
	go l.watchdog()
	return l, true, nil
}

func (l *lease) watchdog() {
	defer close(l.done)
	t := time.NewTicker(l.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		var n int64
		err := l.r.op(l.r.ctx, func(ctx context.Context) (err error) {
			n, err = extendScript.Run(ctx, l.r.rdb, []string{l.key}, l.token, l.ttl.Milliseconds()).Int64()
			return err
		})
		if err == nil && n == 0 {
			l.r.log.Warn("fill lock lost before the fetch ended", "lock", l.key)
			return
		}
	}
}

// release stops the watchdog and deletes the lock if it is still ours.
func (l *lease) release() {
	if l == nil {
		return
	}
	l.once.Do(func() {
		close(l.stop)
		<-l.done
		// A fresh context: release must happen even while shutting down.
		ctx, cancel := context.WithTimeout(context.Background(), l.r.timeout)
		defer cancel()
		_ = l.r.op(ctx, func(ctx context.Context) error {
			return releaseScript.Run(ctx, l.r.rdb, []string{l.key}, l.token).Err()
		})
	})
}
