package coordinator

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/coordd/coordd/internal/document"
	"github.com/coordd/coordd/internal/l1"
	"github.com/coordd/coordd/internal/observe"
	"github.com/coordd/coordd/internal/store"
	"github.com/coordd/coordd/internal/upstream"
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
	cfg     Config
	log     *slog.Logger
	l1      *l1.Cache
	co      coordination // in-process (single-node mode), or shared through Redis
	clients map[string]*upstream.Client
	m       Metrics
	tr      tracer // off without Options.TracerProvider

	mu      sync.Mutex // protects flights
	flights map[string]*flight

	ctx    context.Context // ends on Close; flights run under it
	cancel context.CancelFunc
	wg     sync.WaitGroup // flights and background goroutines
	closed atomic.Bool

	cooling cooldowns     // ids whose refresh failed lately (cooldown.go)
	genTTL  time.Duration // lifetime of a generation key: longer than any fill

	ownTransport *http.Transport // the transport New made, closed by Close
	stats        statusCounters  // for Status (status.go)
	scopeKey     scopeKey        // keys credential scope ids (request.go)
	urls         *urlMemo        // canonical urls resolved lately (urlmemo.go)
}

// Options are the optional dependencies of New.
type Options struct {
	// Redis is the shared L2, lock and notification store: a *redis.Client,
	// *redis.ClusterClient (sharded pub/sub), or a failover client
	// (Sentinel; then set Sentinel too). Nil: single-node mode.
	Redis redis.UniversalClient
	// Sentinel says that Redis is a failover client
	// (redis.NewFailoverClient), finding its master through Redis
	// Sentinel: Status names the mode "sentinel". go-redis returns a
	// failover client as a plain *redis.Client and offers no way to tell
	// them apart, so the caller that built it says.
	Sentinel bool
	// Transport performs upstream HTTP requests. Default: a clone of
	// http.DefaultTransport.
	Transport http.RoundTripper
	// OnRedisHealth, when set, is called whenever Redis is found down
	// (false) or back (true).
	OnRedisHealth func(up bool)
	// Metrics observes the Coordinator. Default: NopMetrics.
	Metrics Metrics
	// TracerProvider traces flights, lock attempts, upstream fetches and
	// landings (see trace.go for the span names). Default (nil): no
	// tracing, and no tracing work on any path.
	TracerProvider trace.TracerProvider
}

// New returns a running Coordinator. It fails only on a bad Config; an
// unreachable Redis starts it degraded (in-process coordination) and it
// recovers by itself when Redis answers.
func New(cfg Config, opt Options) (*Coordinator, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if opt.Redis != nil && cfg.CredentialScopeKey.IsZero() && cfg.NeedsScopeKey() {
		return nil, fmt.Errorf("credential_scope_key: required with Redis once an upstream has a credential or caller_credentials, so that every instance finds the same cache ids")
	}
	var maxBody int64
	var life time.Duration
	for _, u := range cfg.Upstreams {
		maxBody = max(maxBody, u.MaxBodyBytes)
		life = max(life, u.TTL+u.StaleTTL, u.NegativeTTL)
	}
	cache, err := l1.New(cfg.L1MaxBytes, maxBody, life)
	if err != nil {
		return nil, fmt.Errorf("coordinator: l1: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Coordinator{
		cfg:      cfg,
		log:      cfg.Logger.With("component", "coordinator"),
		l1:       cache,
		clients:  make(map[string]*upstream.Client),
		m:        observe.OrNop(opt.Metrics),
		tr:       newTracer(opt.TracerProvider),
		flights:  make(map[string]*flight),
		genTTL:   life + cfg.LockTTL + time.Hour,
		scopeKey: newScopeKey(cfg.CredentialScopeKey),
		urls:     newURLMemo(),
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
	c.co = inProcess{}
	if opt.Redis != nil {
		c.co = shared{store.Start(ctx, opt.Redis, store.Config{
			Prefix:         cfg.KeyPrefix,
			Timeout:        cfg.RedisTimeout,
			RetryInterval:  cfg.RedisRetryInterval,
			ResultTTL:      cfg.ResultTTL,
			InlineMaxBytes: cfg.InlineMaxBytes,
			Logger:         cfg.Logger.With("component", "redis"),
			Metrics:        c.m,
			OnHealth:       opt.OnRedisHealth,
			Sentinel:       opt.Sentinel,
			OnInvalidate:   c.dropLocal,
			OnDrop:         c.l1.Delete,
		})}
	}
	for i := range c.cfg.Upstreams {
		up := &c.cfg.Upstreams[i]
		c.clients[up.Name] = upstream.NewClient(up, upstream.Options{
			Transport:  tr,
			Now:        cfg.Now,
			Logger:     c.log.With("upstream", up.Name),
			Metrics:    c.m,
			Background: &c.wg,
			Context:    c.ctx,
			Shared:     c.co.guards(),
		})
	}
	return c, nil
}

// Close stops background work and releases held locks. In-flight calls
// end with ErrClosed or their result.
func (c *Coordinator) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	c.cancel()
	for _, cl := range c.clients {
		cl.Close()
	}
	c.wg.Wait()
	c.co.wait()
	if c.ownTransport != nil {
		c.ownTransport.CloseIdleConnections()
	}
	return c.l1.Close()
}

// Now is the Coordinator's clock (Config.Now), by which documents' ages
// and lifetimes are measured.
func (c *Coordinator) Now() time.Time { return c.cfg.Now() }

// RedisHealthy reports whether Redis is configured and believed up.
func (c *Coordinator) RedisHealthy() bool { return c.co.redisStatus().Healthy }

// GetOptions tune one Get.
type GetOptions struct {
	// NoStale refuses stale copies: the call waits for a fresh document,
	// or fails.
	NoStale bool
	// MaxAge, when positive, is the oldest copy the call accepts: a copy
	// fetched from the upstream more than MaxAge before the call is not
	// served to it, fresh or stale; the call waits for a newer one. A
	// MaxAge under Config.MaxAgeFloor is raised to it.
	MaxAge time.Duration
	// Progress, when set, receives progress events, from the calling
	// goroutine only.
	Progress func(Progress)
	// Background marks a call that no one waits on (prefetch, warm-up):
	// a fetch only such calls wait for takes an upstream's slots after
	// every fetch an interactive call waits for.
	Background bool
}

// Get returns t's document from L1, L2 or the upstream. A stale copy is
// served at once and refreshed in the background (stale-while-revalidate),
// and served instead of an upstream error (stale-if-error), unless
// opt.NoStale or the copy's Revalidation forbids it. When ctx ends the call
// returns ctx.Err() and leaves its flight, which goes on filling the cache.
func (c *Coordinator) Get(ctx context.Context, t Target, opt GetOptions) (res *Result, err error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	report := opt.Progress
	if report == nil {
		report = func(Progress) {}
	}
	now := c.cfg.Now()
	defer func() { c.observeGet(t, now, res, err) }()
	var notBefore time.Time // copies fetched before it are too old for this call
	if opt.MaxAge > 0 {
		notBefore = now.Add(-max(opt.MaxAge, c.cfg.MaxAgeFloor))
	}
	recent := func(d *document.Document) bool { return !d.FetchedAt.Before(notBefore) }
	var seed *document.Document
	if d := c.l1.Get(t.id); t.serves(d) && d.Usable(now) {
		if d.Fresh(now) && recent(d) {
			report(Progress{Role: RoleHit})
			return &Result{Doc: d, Source: SourceL1}, nil
		}
		seed = d
		if !opt.NoStale && recent(d) && d.ServeStaleWhileRevalidate(now) {
			if !c.coolingDown(t.id, now) {
				c.join(context.WithoutCancel(ctx), t, seed, time.Time{}, false) // revalidate in the background
			}
			report(Progress{Role: RoleHit, Stage: StageServingStale, Detail: "stale-while-revalidate"})
			return &Result{Doc: d, Source: SourceL1, Stale: true}, nil
		}
	}
	for {
		f, created := c.join(ctx, t, seed, notBefore, !opt.Background)
		if !created {
			c.m.Follower("local")
			f.tr.joined(ctx)
			report(Progress{Role: RoleFollower, Stage: StageJoined, Detail: "joined this instance's flight"})
		}
		next, res, err := c.wait(ctx, f, opt.NoStale, recent, report)
		if !opt.Background {
			f.interactive.Add(-1) // counted in by join
		}
		if next != rejoin {
			return res, err
		}
		// The flight found a copy too old for this call before the call
		// raised its requirement: the next flight fetches a newer one.
		seed = nil
	}
}

// step is what a waiting loop does after one wait.
type step int

const (
	// answered: the wait's result and error are the answer.
	answered step = iota
	// rejoin: the flight's copy is older than the caller accepts (wait);
	// the caller joins a new flight.
	rejoin
	// relock: the holder is gone, or what it landed is not this flight's
	// answer (follow); the flight looks at the fill lock again.
	relock
)

// wait waits for f on behalf of one caller: answered, or rejoin when f's
// copy is older than the caller accepts.
func (c *Coordinator) wait(ctx context.Context, f *flight, noStale bool, recent func(*document.Document) bool, report func(Progress)) (step, *Result, error) {
	f.waiters.Add(1)
	defer f.waiters.Add(-1)
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
				return answered, s.res, nil
			case s.err == nil:
				return rejoin, nil, nil
			case s.res != nil && !noStale && recent(s.res.Doc) && s.res.Doc.ServeStaleIfError(c.cfg.Now()):
				report(Progress{Role: RoleHit, Stage: StageServingStale, Detail: "stale-if-error: " + s.err.Error()})
				return answered, s.res, nil
			}
			return answered, nil, s.err
		}
		if s.stale != nil && !noStale && recent(s.stale.Doc) && s.stale.Doc.ServeStaleWhileRevalidate(c.cfg.Now()) {
			report(Progress{Role: RoleHit, Stage: StageServingStale, Detail: "stale-while-revalidate"})
			return answered, s.stale, nil
		}
		select {
		case <-s.next:
		case <-ctx.Done():
			return answered, nil, ctx.Err()
		}
	}
}

// join returns t's flight, starting one if none runs. ctx is the joining
// caller's, whose deadline bounds the flight's rate-limit waits.
// interactive counts the caller in as one that waits for the flight and
// is not background, before the flight can ask; the caller counts itself
// out once done waiting.
func (c *Coordinator) join(ctx context.Context, t Target, seed *document.Document, notBefore time.Time, interactive bool) (f *flight, created bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f = c.flights[t.flightKey()]; f != nil {
		if interactive {
			f.interactive.Add(1)
		}
		f.deadlines.add(ctx)
		f.require(notBefore)
		return f, false
	}
	f = newFlight(t, seed)
	if interactive {
		f.interactive.Add(1)
	}
	f.started = c.cfg.Now()
	f.tr.start(c.tr, ctx, t)
	f.log = c.flightLog(ctx, t)
	f.require(notBefore)
	f.deadlines.add(ctx)
	if seed != nil && seed.Fresh(c.cfg.Now()) {
		f.bypass = true // a caller's max_age refused a fresh copy
	}
	c.flights[t.flightKey()] = f
	c.m.Flights(1)
	c.wg.Add(1)
	go c.run(f)
	return f, true
}

// run executes f to completion, and is the one place where a flight
// finishes: its callers are answered, then the document lands for the
// other instances when fill left that for after. A panic in the fill is
// turned into an error for every caller instead of a hang, and logged
// with its stack.
func (c *Coordinator) run(f *flight) {
	defer c.wg.Done()
	var (
		res  *Result
		err  error
		land func()
	)
	if perr, stack := recovered(func() { res, land, err = c.fill(f) }); perr != nil {
		res, land, err = nil, nil, fmt.Errorf("%w: internal error: %v", ErrUnavailable, perr)
		f.log.Error("flight panicked", "err", err, "stack", stack)
	}
	c.leave(f)
	f.finish(res, err)
	if land != nil {
		if perr, stack := recovered(land); perr != nil {
			f.log.Error("landing panicked", "err", perr, "stack", stack)
		}
	}
	f.tr.end(res, err)
}

// recovered runs fn and returns what it panicked with, or nil, and the
// panicking goroutine's stack, which names the bug.
func recovered(fn func()) (p any, stack string) {
	finished := false
	defer func() {
		if !finished {
			p = recover()
			if p == nil {
				p = "panic(nil) or runtime.Goexit"
			}
			// Still on the panicking goroutine's stack.
			stack = string(debug.Stack())
		}
	}()
	fn()
	finished = true
	return nil, ""
}

// leave removes f from the flights, unless an Invalidate already did.
func (c *Coordinator) leave(f *flight) {
	c.mu.Lock()
	if c.flights[f.t.flightKey()] == f {
		delete(c.flights, f.t.flightKey())
		c.m.Flights(-1)
	}
	c.mu.Unlock()
}

// setL1 stores d in L1 for f, unless f was invalidated.
func (c *Coordinator) setL1(f *flight, d *document.Document, enc []byte) {
	f.whileValid(func() { c.l1.Set(d, enc) })
}

// fill finds or fetches f's document: L2 first, then the fill lock, in
// one round trip when L2 has no copy (claim with peek). The holder
// fetches; the others wait for its push. land, when not nil, lands the
// document for the other instances once run has answered this instance's
// callers.
func (c *Coordinator) fill(f *flight) (res *Result, land func(), err error) {
	t := f.t
	if f.seed != nil {
		// Usually stale; fresh when a caller's max_age refused it.
		f.fallback = &Result{Doc: f.seed, Source: SourceL1, Stale: !f.seed.Fresh(c.cfg.Now())}
	}
	first := true
	for {
		if c.ctx.Err() != nil {
			return f.fallback, nil, ErrClosed
		}
		lt := f.tr.lock(c.ctx, c.co)
		// The fetch's admission, asked with the first claim's lock where
		// the store can: the holder then calls the upstream a round trip
		// sooner. Only the first: it takes the lock only when L2 holds no
		// copy, which a later one may find, and then fetch nothing with
		// the slot it booked.
		var ask *upstream.FirstAsk
		if first {
			ask = c.clients[t.upstream.Name].PrepareAsk(c.ctx, c.fetchRequest(f))
		}
		cl := c.co.claim(c.ctx, t.id, c.cfg.LockTTL, first, ask)
		lt.end(cl)
		if cl.lease == nil {
			ask.Drop(c.ctx) // no fetch here
			ask = nil
		}
		if first {
			// The generation as the flight first looked: it fences the
			// landing against an Invalidate from now on.
			first, f.gen = false, cl.gen
			d, enc := cl.doc, cl.enc
			if t.serves(d) && d.Fresh(c.cfg.Now()) && f.recent(d) && (f.fallback == nil || d.FetchedAt.After(f.fallback.Doc.FetchedAt)) {
				c.setL1(f, d, enc)
				ask.Drop(c.ctx)
				return &Result{Doc: d, Source: SourceL2}, nil, nil
			}
			c.keepAsFallback(f, d, enc)
			if f.fallback != nil {
				f.offerStale(f.fallback)
			}
			if cl.found {
				continue // not a copy for this flight: ask for the lock
			}
		}
		if cl.degraded {
			f.report(Progress{Role: RoleLeader, Stage: StageDegraded, Detail: "redis unavailable; coordinating in-process"})
		}
		if cl.lease != nil {
			return c.lead(f, cl, ask)
		}
		next, res, err := c.follow(f, cl)
		cl.unwatch()
		if next == answered {
			return res, nil, err
		}
	}
}

// keepAsFallback makes d, read from Redis, the flight's fallback (and
// L1's copy) if it is a usable copy of f's target newer than the fallback
// it has. It is not the flight's answer: too old for its callers, or
// expired.
func (c *Coordinator) keepAsFallback(f *flight, d *document.Document, enc []byte) {
	now := c.cfg.Now()
	if !f.t.serves(d) || !d.Usable(now) || (f.fallback != nil && !d.FetchedAt.After(f.fallback.Doc.FetchedAt)) {
		return // never replace a newer copy in L1 with an older one
	}
	c.setL1(f, d, enc)
	if d.Fresh(now) {
		f.setBypass() // fresh, but a caller's max_age refused it
	}
	f.fallback = &Result{Doc: d, Source: SourceL2, Stale: !d.Fresh(now)}
	f.offerStale(f.fallback)
}

// follow waits, subscribed, for the instance holding t's lock, h. The
// claim read L2 as it found the lock held, after subscribing, so that a
// push that landed before the subscription is not lost. It returns
// answered, or relock when the holder is gone or what it landed is not
// this flight's answer.
func (c *Coordinator) follow(f *flight, cl claim) (step, *Result, error) {
	t, h := f.t, cl.holder
	holder := h.Token
	if holder == "" {
		return relock, nil, nil // the lock expired between our two looks
	}
	c.m.Follower("remote")
	d, enc := cl.doc, cl.enc
	if t.serves(d) && d.Fresh(c.cfg.Now()) && f.recent(d) {
		c.setL1(f, d, enc)
		return answered, &Result{Doc: d, Source: SourceL2}, nil
	}
	c.keepAsFallback(f, d, enc)
	// Said once L2 has been re-checked: from now on only the holder's
	// push (or its lease's end) answers this flight, which tests and
	// operators can rely on when they see the stage.
	f.report(Progress{Role: RoleFollower, Stage: StageWaitingLeader, Detail: "another instance is fetching"})
	// A holder cut off from Redis keeps its lease until what is left of it
	// runs out, at most LockTTL after its watchdog last renewed it: look
	// again then, and take over if the lease lapsed; a live holder will
	// have renewed it. Jitter spreads the takeover attempts of many
	// instances.
	timer := time.NewTimer(c.leaseEnd(h.Left))
	defer timer.Stop()
	lapsed := false // the lease was found gone; a push may still be on its way
	for {
		select {
		case ev := <-cl.pushes:
			f.tr.event(ev, holder)
			switch ev.Type {
			case store.EventDone:
				d, enc, cached := c.co.landed(c.ctx, ev)
				if !t.serves(d) {
					return relock, nil, nil
				}
				if !cached {
					return answered, &Result{Doc: d, Source: SourceL2}, nil // uncacheable: as it is
				}
				// A copy stale on arrival (no-cache, max-age=0) answers
				// this flight if the leader we followed fetched it, as it
				// answers the leader's own callers: that leader lands it
				// before answering them, so this flight was waiting
				// before the answer was given. Any other copy must be fresh.
				if f.recent(d) && (d.Fresh(c.cfg.Now()) || (ev.Token == holder && d.StaleOnArrival())) {
					c.setL1(f, d, enc)
					return answered, &Result{Doc: d, Source: SourceL2}, nil
				}
				c.keepAsFallback(f, d, enc)
				return relock, nil, nil // not what this flight needs
			case store.EventFail:
				if ev.Token != holder {
					continue // an earlier leader's
				}
				if ev.Kind == "rate_limited" {
					// The leader's callers could not wait for a rate-limit
					// slot; this flight's callers may: queue for one ourselves.
					return relock, nil, nil
				}
				return answered, f.fallback, upstream.WithRetryAfter(errorFromKind(ev.Kind, ev.Msg), time.Duration(ev.Wait)*time.Millisecond)
			case store.EventRelease:
				if ev.Token != holder {
					continue
				}
				return relock, nil, nil
			default: // reset, inval
				return relock, nil, nil
			}
		case <-timer.C:
			if !lapsed {
				now, err := c.co.holder(c.ctx, t.id)
				switch {
				case err != nil:
					// Redis is slow, not the holder gone: look again soon.
					// If Redis is found down, the hub wakes us with a reset.
					timer.Reset(c.leaseEnd(c.cfg.LockTTL / 4))
				case now.Token == holder:
					timer.Reset(c.leaseEnd(now.Left)) // renewed: the holder lives
				default:
					// Gone: lapsed, or released by a holder whose event is
					// still on its way (in Redis Cluster it is published
					// after the release). Give the push a Redis timeout.
					lapsed = true
					timer.Reset(c.cfg.RedisTimeout)
				}
				continue
			}
			c.m.TimerWakeup()
			return relock, nil, nil
		case <-c.ctx.Done():
			return answered, f.fallback, ErrClosed
		}
	}
}

// leaseEnd is how long a follower waits for a push before it looks at a
// lease of which left was left: until it ends, plus jitter.
func (c *Coordinator) leaseEnd(left time.Duration) time.Duration {
	if left <= 0 || left > c.cfg.LockTTL {
		left = c.cfg.LockTTL // no expiry (-1): never set by coordd
	}
	return left + rand.N(c.cfg.LockTTL/8+1)
}

// lead fetches f's document from the upstream under cl's lease, wakes
// f's callers, then stores it in L2 and wakes the followers of other
// instances (land, when run does that after answering f's callers). On
// failure it answers f's fallback with the error, for stale-if-error.
func (c *Coordinator) lead(f *flight, cl claim, ask *upstream.FirstAsk) (res *Result, land func(), err error) {
	l := cl.lease
	defer func() {
		ask.Drop(c.ctx) // unless the fetch took it; this covers the recheck, and a panic
		if land == nil {
			l.stop() // every path below hands the lease off; this covers a panic
		}
	}()
	if l.shared() {
		if res := c.recheck(f, l, cl.doc, cl.enc); res != nil {
			return res, nil, nil
		}
	}
	d, cache, err := c.fetch(f, l, ask)
	if err != nil {
		res, err := c.failed(f, l, err)
		return res, nil, err
	}
	res, land = c.deliver(f, l, d, cache)
	return res, land, nil
}

// recheck looks at d, L2's copy as lease l was taken: the previous
// holder may have filled it since the flight last looked. A fresh copy
// answers f and is handed off to the followers; any other becomes f's
// fallback.
func (c *Coordinator) recheck(f *flight, l lease, d *document.Document, enc []byte) *Result {
	if f.t.serves(d) && d.Fresh(c.cfg.Now()) && f.recent(d) {
		c.setL1(f, d, enc)
		l.handOff(store.Event{Type: store.EventDone}) // names id's document in L2
		return &Result{Doc: d, Source: SourceL2}
	}
	c.keepAsFallback(f, d, enc) // for stale-if-error, and a conditional fetch
	return nil
}

// fetch asks f's upstream through its guard under lease l (whose events
// carry the fetch's span), conditionally when f has a 2xx fallback, and
// turns the answer into a Document that may be cached or not.
func (c *Coordinator) fetch(f *flight, l lease, ask *upstream.FirstAsk) (*document.Document, bool, error) {
	t, stale := f.t, f.fallback
	f.report(Progress{Role: RoleLeader, Stage: StageFetching, Detail: "fetching " + t.URL})
	fr := c.fetchRequest(f)
	fr.Header, fr.First = t.header(), ask
	if stale != nil && stale.Doc.StatusCode/100 == 2 {
		fr.ETag, fr.LastModified = stale.Doc.ETag, stale.Doc.LastModified
	}
	c.m.Fetch(t.upstream.Name)
	c.stats.fetched(t.tenant, c.cfg.Now())
	fctx, ft := f.tr.fetch(c.ctx, l)
	resp, err := c.clients[t.upstream.Name].Fetch(fctx, fr, func(e upstream.Event) {
		f.report(Progress{Role: RoleLeader, Stage: e.Stage, Detail: e.Detail, Attempt: e.Attempt, Wait: e.Wait})
	})
	ft.end(resp, err)
	if err != nil {
		return nil, false, err
	}
	return c.document(t, resp, stale)
}

// fetchRequest is f's fetch, but for its headers and validators.
func (c *Coordinator) fetchRequest(f *flight) upstream.FetchRequest {
	t := f.t
	return upstream.FetchRequest{URL: t.URL, Deadline: f.deadlines.deadline, LowPriority: f.isBypass(), Scoped: t.scoped,
		QuotaScope: t.sid, QuotaLabel: t.credKind, Tenant: t.tenant, Weight: t.weight, Background: f.background}
}

// deliver stores d in L1 (or drops L1's old copy if d is not to be
// cached) and lands it for the other instances: after run has answered
// f's callers (land), or, for a copy not to be cached or stale on arrival,
// before.
func (c *Coordinator) deliver(f *flight, l lease, d *document.Document, cache bool) (res *Result, land func()) {
	res = &Result{Doc: d, Source: SourceUpstream}
	enc := d.Encode() // once, for L1 and L2
	if !cache {
		// Never cached: its old copy must not be served any longer,
		// here or (landRemote) from L2.
		c.l1.Delete(f.t.id)
	} else {
		c.setL1(f, d, enc)
	}
	land = func() { c.landRemote(f, l, d, enc, cache) }
	if cache && !d.StaleOnArrival() {
		return res, land // this instance's callers first, then the others
	}
	// Otherwise the lock goes before the callers are answered, so that a
	// call made after the answer fetches anew instead of following this
	// flight's landing.
	land()
	return res, nil
}

// failed ends a lead whose fetch failed with err: it hands the failure
// (or, when closing, a release) to the followers and answers f's
// fallback with err.
func (c *Coordinator) failed(f *flight, l lease, err error) (*Result, error) {
	stale := f.fallback
	if c.ctx.Err() != nil {
		l.handOff(store.Event{Type: store.EventRelease})
		return stale, ErrClosed
	}
	f.log.Warn("upstream fetch failed", "upstream", f.t.upstream.Name, "url", f.t.URL, "err", err, "stale", stale != nil)
	if stale != nil {
		c.coolDown(f.t.id)
	}
	l.handOff(store.Event{Type: store.EventFail, Kind: errorKind(err), Msg: err.Error(), Wait: upstream.RetryAfter(err).Milliseconds()})
	return stale, err
}

// document turns an upstream answer into a Document and says whether it
// may be cached.
func (c *Coordinator) document(t Target, resp *upstream.Response, stale *Result) (*document.Document, bool, error) {
	up := t.upstream
	now := c.cfg.Now()
	code := resp.StatusCode
	switch {
	case code == http.StatusNotModified && stale != nil:
		// Revalidated: the stale body is fresh again, without a transfer.
		old := stale.Doc
		l, store := freshness(t).Lifetime(resp.Header, now)
		d := &document.Document{
			Key: t.Key, URL: t.URL, Upstream: up.Name, Tenant: t.docTenant(), Scope: t.scope, StatusCode: old.StatusCode,
			ContentType: old.ContentType, ETag: old.ETag, LastModified: old.LastModified,
			Header:    document.MergeHeaders(old.Header, document.KeepHeaders(resp.Header)),
			FetchedAt: now, Body: old.Body,
		}
		l.Apply(d)
		return d, store, nil
	case code >= 500 || upstream.RateLimited(resp):
		// A rate limit (a 429, or a 403 that says so) is the upstream
		// asking to wait, not a document: the callers get it as an error
		// saying how long (or the stale copy).
		err := fmt.Errorf("%w: %s answered %d", ErrUnavailable, up.Name, code)
		return nil, false, upstream.WithRetryAfter(err, c.clients[up.Name].Backoff(resp))
	}
	d := &document.Document{
		Key: t.Key, URL: t.URL, Upstream: up.Name, Tenant: t.docTenant(), Scope: t.scope, StatusCode: code,
		ContentType: resp.Header.Get("Content-Type"), ETag: resp.Header.Get("ETag"),
		LastModified: resp.Header.Get("Last-Modified"), Header: document.KeepHeaders(resp.Header),
		FetchedAt: now, Body: resp.Body,
	}
	d.DropBadHeaders()
	switch {
	case code/100 == 2:
		l, store := freshness(t).Lifetime(resp.Header, now)
		l.Apply(d)
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

// landRemote stores d, encoded as enc, in L2 (or, if uncacheable, in a
// short-lived result key for followers, dropping the old copy), releases
// l and wakes the followers of every instance, fenced against Invalidate
// (see store.Redis.Land). If the landing is refused or fails, the lock is
// released and a release event sent, so followers re-check at once.
func (c *Coordinator) landRemote(f *flight, l lease, d *document.Document, enc []byte, cache bool) {
	if !l.lands(f.gen) {
		return // nothing to fence the write with, and nobody waits on us
	}
	lt := f.tr.land(c.ctx, cache)
	landed, err := l.land(f.t.id, f.gen, enc, d.StaleUntil.Sub(c.cfg.Now()), cache)
	lt.end(landed, err)
	if !landed {
		if err != nil {
			f.log.Warn("storing in redis failed; followers re-check", "err", err)
		}
		l.handOff(store.Event{Type: store.EventRelease})
	}
}

// dropLocal removes id from L1 and fences this instance's flights of it:
// they no longer offer their stale copy, store into L1, or take new
// callers. Called by Invalidate, and for every inval event.
func (c *Coordinator) dropLocal(id string) {
	c.mu.Lock()
	for k, f := range c.flights {
		if f.t.id == id {
			f.invalidate()
			delete(c.flights, k)
			c.m.Flights(-1)
		}
	}
	c.mu.Unlock()
	c.l1.Delete(id)
}

// Invalidate removes t's document from L2 and from the L1 of every
// instance, and fences every fill of it already running: none lands its
// older copy afterwards. It reports whether L2 held it. With Redis down it
// clears this instance's L1 and returns an error wrapping
// ErrRedisUnavailable. Build t with ResolveIn or ResolveInvalidationIn.
func (c *Coordinator) Invalidate(ctx context.Context, t Target) (bool, error) {
	if c.closed.Load() {
		return false, ErrClosed
	}
	c.dropLocal(t.id)
	return c.co.invalidate(ctx, t.id, c.genTTL)
}

// freshness is what t's upstream's configuration says of its documents'
// lifetimes, and whether t's copy is private to its credential scope.
func freshness(t Target) document.Freshness {
	up := t.upstream
	return document.Freshness{TTL: up.TTL, StaleTTL: up.StaleTTL, MinTTL: up.Protection.MinTTL, MaxTTL: up.Protection.MaxTTL, Private: t.scoped}
}
