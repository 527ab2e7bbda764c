package server_test

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/coorddtest"
	"github.com/coordd/coordd/internal/fakeupstream"
	"github.com/coordd/coordd/internal/redistest"
)

// Tests of replies lost with their connection: a command reaches Redis
// and runs, and the connection drops before the reply comes back (a
// proxy or balancer restart, a failover, a blip). go-redis then replays
// the command on a new connection (MaxRetries), so every script must be
// safe to run twice: the replay must answer what the first run did, and
// change nothing more.

// replayFleet is instance 0 reaching Redis through a proxy that drops
// connections on demand, and n-1 instances reaching it directly.
type replayFleet struct {
	rs        *redistest.Server
	proxy     *redistest.Proxy
	up        *fakeupstream.Upstream
	instances []*coorddtest.Instance
	clients   []coorddv1.CoordinatorServiceClient
}

func startReplayFleet(t *testing.T, n int, tune func(*coordinator.Config)) *replayFleet {
	t.Helper()
	rs := redistest.Start(t)
	fl := &replayFleet{rs: rs, proxy: redistest.StartProxy(t, rs.Addr()), up: fakeupstream.New(t)}
	for i := range n {
		cfg := coordinator.Config{Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: fl.up.URL()}}}
		slowLease(&cfg)
		if tune != nil {
			tune(&cfg)
		}
		url := rs.URL()
		if i == 0 {
			url = fl.proxy.URL()
		}
		in := coorddtest.Start(t, coorddtest.Options{RedisURL: url, Config: cfg, Metrics: true})
		fl.instances = append(fl.instances, in)
		fl.clients = append(fl.clients, in.Dial(t))
	}
	// Load the scripts into Redis through every instance, so that each
	// script runs as one EVALSHA, the command the proxy drops.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range fl.clients {
		if _, err := coorddtest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: fl.up.URL() + "/warm"}); err != nil {
			t.Fatal(err)
		}
	}
	return fl
}

// waitFollowing waits until every instance but the first has callers
// callers of one flight waiting: one remote follower (the flight follows
// the lock) and callers-1 local ones (calls joined the flight).
func (fl *replayFleet) waitFollowing(t *testing.T, callers int) {
	t.Helper()
	for _, in := range fl.instances[1:] {
		waitFor(t, 20*time.Second, func() bool {
			s := in.Scrape(t)
			return s.Value("coordd_followers_total", "scope", "remote") >= 1 &&
				s.Value("coordd_followers_total", "scope", "local") >= float64(callers-1)
		})
	}
}

// checkPushOnly fails the test if a follower anywhere was woken by its
// lease timer instead of a push.
func (fl *replayFleet) checkPushOnly(t *testing.T) {
	t.Helper()
	for i, in := range fl.instances {
		if n := in.Coordinator.TimerWakeups(); n != 0 {
			t.Fatalf("instance %d: %d followers woken by the lease timer; want every wakeup pushed", i, n)
		}
	}
}

// TestLockReplyLostWithConnection: instance 0's lock request runs and its
// connection drops before the reply. go-redis replays the script, which
// finds the lock held by instance 0's own token: that is instance 0's
// lease, so it leads, and the 40 callers on the other instances are
// pushed its document. It used to take its own token for another
// holder's and follow itself until the lease ran out, with every caller
// on every instance.
func TestLockReplyLostWithConnection(t *testing.T) {
	fl := startReplayFleet(t, 3, nil)
	const path = "/dropped-a"
	url := fl.up.URL() + path
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	release := make(chan struct{})
	fl.up.Set(path, fakeupstream.Behavior{Block: release})
	dropped := fl.proxy.DropNext(path + "}:lock")

	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	get := func(c coorddv1.CoordinatorServiceClient, check func(*coorddtest.Doc) error) {
		defer wg.Done()
		d, err := coorddtest.Get(ctx, c, &coorddv1.GetOrFetchRequest{Url: url})
		if err == nil && !bytes.Equal(d.Body, fl.up.Body(path)) {
			err = errShape("wrong body")
		}
		if err == nil && check != nil {
			err = check(d)
		}
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	wg.Add(1)
	go get(fl.clients[0], func(d *coorddtest.Doc) error {
		for _, p := range d.Progress {
			if p.GetRole() == coorddv1.Role_ROLE_FOLLOWER {
				return errShape("instance 0 followed: " + p.String())
			}
		}
		return nil
	})
	<-dropped
	if err := fl.up.WaitCount(ctx, path, 1); err != nil {
		t.Fatal(err) // with the old code, only after the lease ran out
	}
	const callers = 20
	for _, c := range fl.clients[1:] {
		for range callers {
			wg.Add(1)
			go get(c, nil)
		}
	}
	fl.waitFollowing(t, callers)
	close(release)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	fl.checkPushOnly(t)
	if got := fl.up.Count(path); got != 1 {
		t.Fatalf("upstream requests = %d; want 1", got)
	}
}
