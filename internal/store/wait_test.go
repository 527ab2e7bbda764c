package store

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/coordd/coordd/internal/testing/redistest"
)

// TestWaitWaitsForWatchdogs: Wait returns only once every lease's
// watchdog has stopped, even one that was renewing its lease when the
// store's context ended: nothing of the store runs after Wait.
func TestWaitWaitsForWatchdogs(t *testing.T) {
	rs := redistest.Start(t)
	p := redistest.StartProxy(t, rs.Addr())
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	// The watchdog's renewal waits for its held reply, however long.
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), ReadTimeout: time.Minute})
	defer rdb.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := Start(ctx, rdb, Config{Prefix: "test:", Timeout: 5 * time.Second, RetryInterval: time.Second})
	l, _, err := r.TryLock(ctx, "id", 30*time.Millisecond) // renewed every 10ms
	if err != nil || l == nil {
		t.Fatalf("TryLock: %v, %v; want a lease", l, err)
	}
	renewing, release := p.HoldNext(l.Token())
	defer release()
	<-renewing
	cancel()
	waited := make(chan struct{})
	go func() {
		r.Wait()
		close(waited)
	}()
	// Time is the subject here: Wait must not return while the watchdog
	// runs. A Wait that does not wait returns as soon as the hub and the
	// health watcher have stopped.
	select {
	case <-waited:
		t.Fatal("Wait returned while a lease's watchdog was still renewing it")
	case <-time.After(200 * time.Millisecond):
	}
	release()
	<-waited
	select {
	case <-l.done:
	default:
		t.Fatal("the watchdog runs on after Wait returned")
	}
}
