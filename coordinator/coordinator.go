package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Coordinator fills a two-tier cache (L1 in memory, L2 in Redis) from
// operator-configured upstreams so that, for a cold key, exactly one request
// reaches the upstream across every instance sharing the Redis, and every
// other caller gets the same bytes pushed to it when they land.
//
// With a nil Redis client it runs in single-node mode: the same flights, with
// in-process locking and notification. A Coordinator is safe for concurrent
// use; Close stops it.
type Coordinator struct {
	cfg      Config
	log      *slog.Logger
	l1       *l1Cache
	rl       *redisLayer // nil in single-node mode
	fetchers map[string]Fetcher

	mu      sync.Mutex // protects flights
	flights map[string]*flight

	ctx    context.Context // ends on Close; flights run under it
	cancel context.CancelFunc
	wg     sync.WaitGroup // flights and background goroutines
	closed atomic.Bool

	upstreamRequests atomic.Int64    // fetches this instance started, for tests and logs
	timerWakeups     atomic.Int64    // followers woken by the lease timer instead of a push
	ownTransport     *http.Transport // the transport New made, closed by Close
}

// Options are the optional dependencies of New.
type Options struct {
	// Redis is the shared L2, lock and notification store: a *redis.Client
	// or *redis.ClusterClient. Nil: single-node mode.
	Redis redis.UniversalClient
	// Transport performs upstream HTTP requests. Default: a clone of
	// http.DefaultTransport.
	Transport http.RoundTripper
	// OnRedisHealth, when set, is called whenever Redis is found down
	// (false) or back (true).
	OnRedisHealth func(up bool)
}

// New returns a running Coordinator. It fails only on a bad Config; an
// unreachable Redis starts it degraded (in-process coordination) and it
// recovers by itself when Redis answers.
func New(cfg Config, opt Options) (*Coordinator, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var maxBody int64
	var life time.Duration
	for _, u := range cfg.Upstreams {
		maxBody = max(maxBody, u.MaxBodyBytes)
		life = max(life, u.TTL+u.StaleTTL, u.NegativeTTL)
	}
	l1, err := newL1(cfg.L1MaxBytes, maxBody, life)
	if err != nil {
		return nil, fmt.Errorf("coordinator: l1: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Coordinator{
		cfg:      cfg,
		log:      cfg.Logger.With("component", "coordinator"),
		l1:       l1,
		fetchers: make(map[string]Fetcher),
		flights:  make(map[string]*flight),
		ctx:      ctx,
		cancel:   cancel,
	}
	tr := opt.Transport
	if tr == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 64
		tr = t
		c.ownTransport = t
	}
	if opt.Redis != nil {
		c.startRedis(opt.Redis, opt.OnRedisHealth)
	}
	for i := range c.cfg.Upstreams {
		up := &c.cfg.Upstreams[i]
		c.fetchers[up.Name] = c.protect(up, newHTTPFetcher(up, tr))
	}
	return c, nil
}

func (c *Coordinator) startRedis(rdb redis.UniversalClient, onChange func(bool)) {
	r := &redisLayer{
		rdb:      rdb,
		prefix:   c.cfg.KeyPrefix,
		timeout:  c.cfg.RedisTimeout,
		retry:    c.cfg.RedisRetryInterval,
		log:      c.cfg.Logger.With("component", "redis"),
		onChange: onChange,
		ctx:      c.ctx,
	}
	r.hub = newHub(rdb, r.channel(), r.log, c.l1.Delete)
	ready := make(chan struct{})
	var once sync.Once
	r.hub.onUp = func() { once.Do(func() { close(ready) }) }
	c.rl = r
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		r.hub.run(c.ctx, max(time.Second, 4*r.timeout), r.verify)
	}()
	select {
	case <-ready:
		r.up.Store(true)
	case <-time.After(4 * r.timeout):
		r.up.Store(true) // so that markDown logs and starts the probe
		r.markDown(errors.New("no subscription confirmation at start"))
	}
}

// Close stops background work and releases held locks. In-flight calls
// end with ErrClosed or their result.
func (c *Coordinator) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	c.cancel()
	c.wg.Wait()
	if c.rl != nil {
		c.rl.wg.Wait()
	}
	if c.ownTransport != nil {
		c.ownTransport.CloseIdleConnections()
	}
	return c.l1.Close()
}

// UpstreamRequests returns how many upstream fetches this instance started.
func (c *Coordinator) UpstreamRequests() int64 { return c.upstreamRequests.Load() }

// TimerWakeups returns how many times a follower on this instance re-checked
// because the lock lease ran out rather than because it was pushed an
// event. Without a dead lock holder or a broken subscription it stays 0:
// every wakeup is a push.
func (c *Coordinator) TimerWakeups() int64 { return c.timerWakeups.Load() }

// Now is the Coordinator's clock (Config.Now), by which documents' ages
// and lifetimes are measured.
func (c *Coordinator) Now() time.Time { return c.cfg.Now() }

// RedisHealthy reports whether Redis is configured and believed up.
func (c *Coordinator) RedisHealthy() bool { return c.rl != nil && c.rl.healthy() }

// GetOptions tune one Get.
type GetOptions struct {
	// NoStale refuses stale copies: the call waits for a fresh document,
	// or fails.
	NoStale bool
	// MaxAge, when positive, is the oldest copy the call accepts: a copy
	// fetched from the upstream more than MaxAge before the call is not
	// served to it, fresh or stale; the call waits for a newer one.
	MaxAge time.Duration
	// Progress, when set, receives progress events, from the calling
	// goroutine only.
	Progress func(Progress)
}

// Get returns t's document from L1, L2 or the upstream. A stale copy is
// served at once and refreshed in the background (stale-while-revalidate),
// and served instead of an upstream error (stale-if-error), unless
// opt.NoStale or the copy's Revalidation forbids it. When ctx ends the call
// returns ctx.Err() and leaves its flight, which goes on filling the cache.
func (c *Coordinator) Get(ctx context.Context, t Target, opt GetOptions) (*Result, error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	report := opt.Progress
	if report == nil {
		report = func(Progress) {}
	}
	now := c.cfg.Now()
	var notBefore time.Time // copies fetched before it are too old for this call
	if opt.MaxAge > 0 {
		notBefore = now.Add(-opt.MaxAge)
	}
	recent := func(d *Document) bool { return !d.FetchedAt.Before(notBefore) }
	var seed *Document
	if d := c.l1.Get(t.Key); d != nil && d.Usable(now) {
		if d.Fresh(now) && recent(d) {
			report(Progress{Role: RoleHit})
			return &Result{Doc: d, Source: SourceL1}, nil
		}
		seed = d
		if !opt.NoStale && recent(d) && d.ServeStaleWhileRevalidate(now) {
			c.join(context.Background(), t, seed, time.Time{}) // revalidate in the background
			report(Progress{Role: RoleHit, Stage: StageServingStale, Detail: "stale-while-revalidate"})
			return &Result{Doc: d, Source: SourceL1, Stale: true}, nil
		}
	}
	for {
		f, created := c.join(ctx, t, seed, notBefore)
		if !created {
			report(Progress{Role: RoleFollower, Stage: StageJoined, Detail: "joined this instance's flight"})
		}
		res, err, again := c.wait(ctx, f, opt.NoStale, recent, report)
		if !again {
			return res, err
		}
		// The flight found a copy too old for this call before the call
		// raised its requirement: the next flight fetches a newer one.
		seed = nil
	}
}

// wait waits for f on behalf of one caller. again asks the caller to join
// a new flight, because f's copy is older than the caller accepts.
func (c *Coordinator) wait(ctx context.Context, f *flight, noStale bool, recent func(*Document) bool, report func(Progress)) (res *Result, err error, again bool) {
	seen := 0
	for {
		s := f.snapshot(seen)
		seen += len(s.events)
		for _, p := range s.events {
			report(p)
		}
		if s.done {
			switch {
			case s.err == nil && recent(s.res.Doc):
				return s.res, nil, false
			case s.err == nil:
				return nil, nil, true
			case s.res != nil && !noStale && recent(s.res.Doc) && s.res.Doc.ServeStaleIfError(c.cfg.Now()):
				report(Progress{Role: RoleHit, Stage: StageServingStale, Detail: "stale-if-error: " + s.err.Error()})
				return s.res, nil, false
			}
			return nil, s.err, false
		}
		if s.stale != nil && !noStale && recent(s.stale.Doc) && s.stale.Doc.ServeStaleWhileRevalidate(c.cfg.Now()) {
			report(Progress{Role: RoleHit, Stage: StageServingStale, Detail: "stale-while-revalidate"})
			return s.stale, nil, false
		}
		select {
		case <-s.next:
		case <-ctx.Done():
			return nil, ctx.Err(), false
		}
	}
}

// join returns t's flight, starting one if none runs. ctx is the joining
// caller's, whose deadline bounds the flight's rate-limit waits.
func (c *Coordinator) join(ctx context.Context, t Target, seed *Document, notBefore time.Time) (f *flight, created bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f = c.flights[t.Key]; f != nil {
		f.deadlines.add(ctx)
		f.require(notBefore)
		return f, false
	}
	f = newFlight(t, seed)
	f.require(notBefore)
	f.deadlines.add(ctx)
	c.flights[t.Key] = f
	c.wg.Add(1)
	go c.run(f)
	return f, true
}

// run executes f to completion. A panic in the fill is turned into an
// error for every caller instead of a hang.
func (c *Coordinator) run(f *flight) {
	defer c.wg.Done()
	var (
		res      *Result
		err      error
		finished bool
	)
	defer func() {
		if !finished {
			err = fmt.Errorf("%w: internal error: %v", ErrUnavailable, recover())
			c.log.Error("flight panicked", "key", f.t.Key, "err", err)
		}
		c.mu.Lock()
		if c.flights[f.t.Key] == f {
			delete(c.flights, f.t.Key)
		}
		c.mu.Unlock()
		f.finish(res, err)
	}()
	res, err = c.fill(f)
	finished = true
}

// fill finds or fetches f's document: L2 first, then the fill lock. The
// holder fetches; the others wait for its push.
func (c *Coordinator) fill(f *flight) (*Result, error) {
	key := f.t.Key
	var stale *Result
	if f.seed != nil {
		// Usually stale; fresh when a caller's max_age refused it.
		stale = &Result{Doc: f.seed, Source: SourceL1, Stale: !f.seed.Fresh(c.cfg.Now())}
	}
	r := c.rl
	if r != nil {
		d, enc := r.getDoc(c.ctx, key)
		now := c.cfg.Now()
		if d != nil && d.Usable(now) {
			c.l1.Set(d, enc)
			if d.Fresh(now) && f.recent(d) {
				return &Result{Doc: d, Source: SourceL2}, nil
			}
			if stale == nil || d.FetchedAt.After(stale.Doc.FetchedAt) {
				stale = &Result{Doc: d, Source: SourceL2, Stale: !d.Fresh(now)}
			}
		}
	}
	if stale != nil {
		f.offerStale(stale)
	}
	degraded := false
	for {
		if c.ctx.Err() != nil {
			return stale, ErrClosed
		}
		if r == nil {
			return c.lead(f, nil, stale)
		}
		w := r.hub.register(key)
		l, ok, err := r.tryLock(c.ctx, key, c.cfg.LockTTL)
		if ok {
			r.hub.unregister(w)
			return c.lead(f, l, stale)
		}
		if err != nil || !r.healthy() {
			// Fail open: this flight is the only fetch in this instance.
			r.hub.unregister(w)
			if !degraded {
				degraded = true
				f.report(Progress{Role: RoleLeader, Stage: StageDegraded, Detail: "redis unavailable; coordinating in-process"})
			}
			return c.lead(f, nil, stale)
		}
		res, err, again := c.follow(f, w, stale)
		r.hub.unregister(w)
		if !again {
			return res, err
		}
	}
}

// follow waits, subscribed, for the instance holding key's lock. It
// re-checks L2 after subscribing, so that a push that landed before the
// subscription is not lost. again asks the caller to re-check the lock.
func (c *Coordinator) follow(f *flight, w *waiter, stale *Result) (res *Result, err error, again bool) {
	r := c.rl
	key := f.t.Key
	f.report(Progress{Role: RoleFollower, Stage: StageWaitingLeader, Detail: "another instance is fetching"})
	if d, enc := r.getDoc(c.ctx, key); d != nil && d.Fresh(c.cfg.Now()) && f.recent(d) {
		c.l1.Set(d, enc)
		return &Result{Doc: d, Source: SourceL2}, nil, false
	}
	// The lease outlives a dead holder by at most LockTTL; jitter spreads
	// the takeover attempts of many instances.
	timer := time.NewTimer(c.cfg.LockTTL + rand.N(c.cfg.LockTTL/4+1))
	defer timer.Stop()
	select {
	case ev := <-w.ch:
		switch ev.Type {
		case evDone:
			d, enc := r.getRaw(c.ctx, ev.Result, key)
			if d == nil {
				return nil, nil, true
			}
			if ev.Result == r.docKey(key) {
				c.l1.Set(d, enc)
			}
			return &Result{Doc: d, Source: SourceL2}, nil, false
		case evFail:
			if ev.Kind == "rate_limited" {
				// The leader's callers could not wait for a rate-limit
				// slot; this flight's callers may: queue for one ourselves.
				return nil, nil, true
			}
			return stale, withRetryAfter(errorFromKind(ev.Kind, ev.Msg), time.Duration(ev.Wait)*time.Millisecond), false
		default: // release, reset, inval
			return nil, nil, true
		}
	case <-timer.C:
		c.timerWakeups.Add(1)
		return nil, nil, true
	case <-c.ctx.Done():
		return stale, ErrClosed, false
	}
}

// lead fetches f's document from the upstream under lease l (nil: in-process
// only), stores it in L1 and L2, and wakes the followers.
func (c *Coordinator) lead(f *flight, l *lease, stale *Result) (*Result, error) {
	defer l.release()
	key, r := f.t.Key, c.rl
	if l != nil {
		// Double-check: the previous holder may have filled L2 between our
		// L2 read and our lock.
		if d, enc := r.getDoc(c.ctx, key); d != nil && d.Fresh(c.cfg.Now()) && f.recent(d) {
			c.l1.Set(d, enc)
			return &Result{Doc: d, Source: SourceL2}, nil
		}
	}
	f.report(Progress{Role: RoleLeader, Stage: StageFetching, Detail: "fetching " + f.t.URL})
	up := f.t.upstream
	fr := FetchRequest{URL: f.t.URL}
	if stale != nil && stale.Doc.StatusCode/100 == 2 {
		fr.ETag, fr.LastModified = stale.Doc.ETag, stale.Doc.LastModified
	}
	c.upstreamRequests.Add(1)
	ctx := withCallerDeadlines(c.ctx, &f.deadlines)
	resp, err := c.fetchers[up.Name].Fetch(ctx, fr, func(p Progress) {
		p.Role = RoleLeader
		f.report(p)
	})
	if err == nil {
		var d *Document
		var cache bool
		d, cache, err = c.document(f.t, resp, stale)
		if err == nil {
			c.land(l, d, cache)
			return &Result{Doc: d, Source: SourceUpstream}, nil
		}
	}
	if c.ctx.Err() != nil {
		c.handOff(l, event{Type: evRelease, Key: key})
		return stale, ErrClosed
	}
	c.log.Warn("upstream fetch failed", "upstream", up.Name, "url", f.t.URL, "err", err, "stale", stale != nil)
	c.handOff(l, event{Type: evFail, Key: key, Kind: errorKind(err), Msg: err.Error(), Wait: retryAfterOf(err).Milliseconds()})
	return stale, err
}

// document turns an upstream answer into a Document and says whether it
// may be cached.
func (c *Coordinator) document(t Target, resp *Response, stale *Result) (*Document, bool, error) {
	up := t.upstream
	now := c.cfg.Now()
	code := resp.StatusCode
	switch {
	case code == http.StatusNotModified && stale != nil:
		// Revalidated: the stale body is fresh again, without a transfer.
		old := stale.Doc
		fresh, staleUntil, rv, store := up.lifetime(resp.Header, now)
		return &Document{
			Key: t.Key, URL: t.URL, Upstream: up.Name, StatusCode: old.StatusCode,
			ContentType: old.ContentType, ETag: old.ETag, LastModified: old.LastModified,
			FetchedAt: now, FreshUntil: fresh, StaleUntil: staleUntil, Revalidation: rv, Body: old.Body,
		}, store, nil
	case code >= 500 || code == http.StatusTooManyRequests:
		return nil, false, fmt.Errorf("%w: %s answered %d", ErrUnavailable, up.Name, code)
	}
	d := &Document{
		Key: t.Key, URL: t.URL, Upstream: up.Name, StatusCode: code,
		ContentType: resp.Header.Get("Content-Type"), ETag: resp.Header.Get("ETag"),
		LastModified: resp.Header.Get("Last-Modified"), FetchedAt: now, Body: resp.Body,
	}
	d.dropBadHeaders()
	switch {
	case code/100 == 2:
		var store bool
		d.FreshUntil, d.StaleUntil, d.Revalidation, store = up.lifetime(resp.Header, now)
		return d, store, nil
	case code == http.StatusNotFound || code == http.StatusGone:
		d.FreshUntil, d.StaleUntil = now.Add(up.NegativeTTL), now.Add(up.NegativeTTL)
		return d, true, nil
	default:
		// Delivered as it is, never cached.
		d.FreshUntil, d.StaleUntil = now, now
		return d, false, nil
	}
}

// land stores d in L1 and L2 (or, if uncacheable, in a short-lived result
// key for followers) and then wakes the followers.
func (c *Coordinator) land(l *lease, d *Document, cache bool) {
	enc := d.encode() // once, for L1 and L2
	if cache {
		c.l1.Set(d, enc)
	}
	r := c.rl
	if r == nil || !r.healthy() {
		return
	}
	rkey := r.docKey(d.Key)
	var err error
	if cache {
		err = r.setDoc(c.ctx, d, enc, c.cfg.Now())
	} else {
		rkey = r.prefix + "result:" + d.Key + ":" + newToken()
		err = r.setRaw(c.ctx, rkey, enc, c.cfg.ResultTTL)
	}
	if err != nil {
		c.handOff(l, event{Type: evRelease, Key: d.Key})
		return
	}
	c.handOff(l, event{Type: evDone, Key: d.Key, Result: rkey})
}

// handOff releases l, then publishes ev to every instance's followers. The
// order matters: a follower woken by ev must find the lock free, or it
// would wait for a lease that nobody holds any more. Without a lease (Redis
// down, or single-node mode) there are no followers to wake.
func (c *Coordinator) handOff(l *lease, ev event) {
	if l == nil || c.rl == nil {
		return
	}
	l.release()
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.RedisTimeout)
	defer cancel()
	_ = c.rl.publish(ctx, ev)
}

// Invalidate removes key from L2 and from the L1 of every instance. It
// reports whether L2 held it. With Redis down it clears this instance's L1
// and returns an error wrapping ErrRedisUnavailable.
func (c *Coordinator) Invalidate(ctx context.Context, key string) (bool, error) {
	if c.closed.Load() {
		return false, ErrClosed
	}
	c.l1.Delete(key)
	if c.rl == nil {
		return false, nil
	}
	existed, err := c.rl.delDoc(ctx, key)
	if err != nil {
		return false, err
	}
	if err := c.rl.publish(ctx, event{Type: evInval, Key: key}); err != nil {
		return existed, err
	}
	return existed, nil
}
