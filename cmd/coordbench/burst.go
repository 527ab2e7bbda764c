package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
)

// joinTimeout bounds how long a burst waits for every caller to be
// waiting before it releases the upstream anyway.
const joinTimeout = 60 * time.Second

// burstSpec describes one cold burst: callers concurrent GetOrFetch calls
// of one new key, caller i through stubs[i%len(stubs)].
type burstSpec struct {
	stubs   []coorddv1.CoordinatorServiceClient
	callers int
	size    int // body bytes
	// coorddK, when positive, is the number of coordd instances the
	// stubs reach: their Redis commands are counted.
	coorddK int
	// atJoined, if set, runs once every caller waits and before the
	// upstream answers.
	atJoined func()
	// atOnce: the callers are released together, and the upstream answers
	// after its latency without waiting for them to join (the floor at
	// once): burstResult.first is then the time to the first answer.
	atOnce bool
	// remote (atOnce only): the callers run in this child process
	// (callers.go), which calls the first len(stubs) of its addresses.
	remote *callerProc
}

// burstResult is what one cold burst measured.
type burstResult struct {
	callers, k int
	upstream   int64           // requests that reached the upstream for the key
	meta, body []time.Duration // per caller: its metadata, its last byte, after the answer left the upstream
	wake       []time.Duration // per stub but the first to complete: its first completion after the burst's first
	errors     int
	firstErr   error
	redis      int64            // Redis commands during the burst (coorddK > 0)
	redisBy    map[string]int64 // by command
	// first (atOnce): from the callers' release to the first caller's
	// last byte; held, the time the upstream held the first request
	// (its arrival to its answer leaving: the latency as the timer kept
	// it, late on a busy machine).
	first, held time.Duration
	// pre and post (atOnce, coordd): from the release to the upstream
	// request's arrival, and from its answer leaving to the first caller's
	// last byte.
	pre, post time.Duration
	// trips (coorddK > 0): each instance's round trips to Redis.
	trips []instanceTrips
}

// callResult is one caller's view of its GetOrFetch.
type callResult struct {
	meta, done time.Time
	err        error
}

// burst runs one cold burst: every caller calls at once; the upstream (or
// the floor) holds the answer until each has received its first progress
// event, that is, until each waits; then it answers after the configured
// latency.
func (e *env) burst(ctx context.Context, s burstSpec) (burstResult, error) {
	path := e.newKey("cold")
	g := newGate(e.cfg.latency)
	if s.atOnce {
		close(g.release)
	}
	e.cat.put(path, &entry{body: e.cat.body(s.size), gate: g})
	defer e.cat.drop(path)
	u := e.up.url + path

	if s.coorddK > 0 {
		if err := e.resetRedisStats(ctx); err != nil {
			return burstResult{}, err
		}
		for _, in := range e.coordd[:s.coorddK] {
			in.rt.Take()
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 2*joinTimeout)
	defer cancel()
	var joined atomic.Int64
	allJoined := make(chan struct{})
	join := func() {
		if joined.Add(1) == int64(s.callers) {
			close(allJoined)
		}
	}
	var results []callResult
	var released time.Time
	callOne := func(i int) callResult { return call(ctx, s.stubs[i%len(s.stubs)], u, s.size, join) }
	switch {
	case s.remote != nil:
		var err error
		released, results, err = s.remote.burst(remoteBurst{URL: u, Callers: s.callers, Size: s.size, K: len(s.stubs)})
		if err != nil {
			return burstResult{}, err
		}
	case s.atOnce:
		released, results = callAtOnce(s.callers, callOne)
	default:
		results = make([]callResult, s.callers)
		var wg sync.WaitGroup
		for i := range s.callers {
			wg.Go(func() { results[i] = callOne(i) })
		}
		t := time.NewTimer(joinTimeout)
		select {
		case <-allJoined:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		if s.atJoined != nil {
			s.atJoined()
		}
		close(g.release)
		wg.Wait()
	}

	r := burstResult{callers: s.callers, k: len(s.stubs), upstream: g.requests.Load()}
	if s.coorddK > 0 {
		e.flightsDone(ctx, s.coorddK)
		n, by, err := e.redisCommands(ctx)
		if err != nil {
			return r, err
		}
		r.redis, r.redisBy = n, by
		r.trips = e.roundTrips(ctx, s.coorddK, g.arrivedAt())
	}
	leave := g.leftAt()
	first := make([]time.Time, len(s.stubs))
	for i, c := range results {
		if c.err != nil {
			r.errors++
			if r.firstErr == nil {
				r.firstErr = c.err
			}
			continue
		}
		r.meta = append(r.meta, c.meta.Sub(leave))
		r.body = append(r.body, c.done.Sub(leave))
		if f := &first[i%len(first)]; f.IsZero() || c.done.Before(*f) {
			*f = c.done
		}
	}
	if leave.IsZero() {
		r.meta, r.body = nil, nil
	}
	first = slices.DeleteFunc(first, time.Time.IsZero)
	slices.SortFunc(first, time.Time.Compare)
	if s.atOnce && len(first) > 0 {
		r.first = first[0].Sub(released)
		if a := g.arrivedAt(); !a.IsZero() && !leave.IsZero() {
			r.held = leave.Sub(a)
			r.pre, r.post = a.Sub(released), first[0].Sub(leave)
		}
	}
	for _, f := range first[min(1, len(first)):] {
		r.wake = append(r.wake, f.Sub(first[0]))
	}
	return r, ctx.Err()
}

// callAtOnce starts n callers, releases them together once every one is
// ready, and returns the release and their results (callOne's for each).
func callAtOnce(n int, callOne func(i int) callResult) (time.Time, []callResult) {
	results := make([]callResult, n)
	var wg, ready sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		ready.Add(1)
		wg.Go(func() {
			ready.Done()
			<-start
			results[i] = callOne(i)
		})
	}
	ready.Wait()
	released := time.Now()
	close(start)
	wg.Wait()
	return released, results
}

// call makes one GetOrFetch and records when its metadata and its last
// byte arrived. join is called once, on the first message.
func call(ctx context.Context, c coorddv1.CoordinatorServiceClient, url string, size int, join func()) (r callResult) {
	joined := false
	defer func() {
		if !joined {
			join()
		}
	}()
	st, err := c.GetOrFetch(ctx, &coorddv1.GetOrFetchRequest{Url: url})
	if err != nil {
		return callResult{err: err}
	}
	n := 0
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return callResult{err: err}
		}
		if !joined {
			joined = true
			join()
		}
		switch ev := m.GetEvent().(type) {
		case *coorddv1.GetOrFetchResponse_Metadata:
			r.meta = time.Now()
		case *coorddv1.GetOrFetchResponse_Chunk:
			n += len(ev.Chunk.GetData())
		}
	}
	r.done = time.Now()
	if r.meta.IsZero() || n != size {
		return callResult{err: fmt.Errorf("got %d bytes (metadata: %v); want %d", n, !r.meta.IsZero(), size)}
	}
	return r
}

// merge appends b's samples to a's.
func (a *burstResult) merge(b burstResult) {
	a.callers, a.k = b.callers, b.k
	a.upstream += b.upstream
	a.meta = append(a.meta, b.meta...)
	a.body = append(a.body, b.body...)
	a.wake = append(a.wake, b.wake...)
	a.errors += b.errors
	if a.firstErr == nil {
		a.firstErr = b.firstErr
	}
	a.redis += b.redis
}
