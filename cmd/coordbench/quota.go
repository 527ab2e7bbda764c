package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/secret"
	"github.com/coordd/coordd/internal/testing/fakeapi"
	"github.com/coordd/coordd/internal/testing/redistest"
	upstreamcfg "github.com/coordd/coordd/internal/upstream"
	"github.com/coordd/coordd/server"
)

// The quota benchmark's tenants, and the logins their credentials are at
// the fake API.
const (
	heavyTenant = "batch"
	lightTenant = "agents"
	heavyLogin  = "batch-bot"
	lightLogin  = "agents-bot"
)

// quotaConfig is the quota benchmark's load: a fake API with GitHub's
// limits, scaled down; a heavy tenant's batch of cold pages and a light
// tenant's interactive agents, each tenant with its own credential.
type quotaConfig struct {
	instances   int           // coordd instances per fleet
	limit       int           // N: the fake's primary limit, requests per window per credential
	window      time.Duration // W: its window, whole seconds (X-RateLimit-Reset is in seconds)
	concurrent  int           // C: the fake's secondary limit, concurrent requests per credential
	maxInFlight int           // coordd's protection.max_in_flight, below C
	latency     time.Duration // the fake's answer time
	pages       int           // B: the heavy tenant's batch, asked all at once
	agents      int           // the light tenant's agents
	every       time.Duration // each agent starts a call this often, whether or not its last one ended
	alone       time.Duration // how long the light tenant runs alone
	capFactor   float64       // the batch phase ends at capFactor × the ideal time, drained or not
	callTimeout time.Duration // a light call gives up after this, retries included
	heavyWeight int           // the tenants' weights (tenants[].weight)
	lightWeight int
}

func defaultQuota(quick bool) quotaConfig {
	c := quotaConfig{
		instances: 3, limit: 48, window: 4 * time.Second, concurrent: 4, maxInFlight: 2,
		latency: 40 * time.Millisecond, pages: 240, agents: 6, every: 2 * time.Second,
		alone: 10 * time.Second, capFactor: 2.5, callTimeout: 20 * time.Second,
		heavyWeight: 1, lightWeight: 1,
	}
	if quick {
		c.limit, c.window, c.pages = 24, 2*time.Second, 48
		c.agents, c.every, c.alone = 4, 1500*time.Millisecond, 3*time.Second
		c.callTimeout = 5 * time.Second
	}
	return c
}

// rate is the quota's requests per second per credential: N ÷ W.
func (c quotaConfig) rate() float64 { return float64(c.limit) / c.window.Seconds() }

// ideal is the batch's ideal drain time: B pages at the quota's pace, the
// remaining requests over the time to the reset (N ÷ W on a fresh window).
func (c quotaConfig) ideal() time.Duration {
	return time.Duration(float64(c.pages) / c.rate() * float64(time.Second))
}

// String describes the load in one line.
func (c quotaConfig) String() string {
	return fmt.Sprintf("a GitHub-like fake API: N=%d requests per W=%v window per credential (%.0f/s; 403 past it, with x-ratelimit-* as GitHub sends them), a secondary limit of C=%d concurrent requests per credential (403 with Retry-After), %v per answer; %d coordd instances, 2 credentials (one per tenant); heavy tenant: a batch of B=%d cold pages asked at once (background priority); light tenant: %d interactive agents, each starting a call for a cold page every %v (%.1f/s)",
		c.limit, c.window, c.rate(), c.concurrent, c.latency, c.instances, c.pages, c.agents, c.every, float64(c.agents)/c.every.Seconds())
}

// quotaKnobs are what tells the fleets apart: their protection settings.
type quotaKnobs struct {
	rateLimit   int  // protection.rate_limit, per upstream; -1: none
	learnQuota  bool // protection.learn_quota: pace by the quota the answers announce
	maxInFlight int  // protection.max_in_flight, per credential; 0: none
}

// quotaFleet is one fleet of the quota benchmark.
type quotaFleet struct {
	name   string
	shared bool // its instances share Redis; false: each alone, single-node
	knobs  quotaKnobs
}

// quotaFleets are the fleets in the order measured and printed, coordd's
// first.
func quotaFleets(c quotaConfig) []quotaFleet {
	high := int(math.Round(2 * c.rate()))
	low := max(1, int(math.Round(c.rate()/4)))
	return []quotaFleet{
		// The learning fleets keep the 2× ceiling as their rate_limit, as an
		// operator would: it holds before the first answer, and learned
		// pacing can only be stricter.
		{"coordd: learned pacing, max_in_flight " + fmt.Sprint(c.maxInFlight) + ", fair queuing", true,
			quotaKnobs{rateLimit: high, learnQuota: true, maxInFlight: c.maxInFlight}},
		{fmt.Sprintf("fixed rate_limit %d/s (2× too high)", high), true, quotaKnobs{rateLimit: high}},
		{fmt.Sprintf("fixed rate_limit %d/s (4× too low)", low), true, quotaKnobs{rateLimit: low}},
		{"per-instance pacing by the headers (each instance alone, no Redis)", false,
			quotaKnobs{rateLimit: high, learnQuota: true}},
	}
}

// applyQuotaKnobs sets k on p.
func applyQuotaKnobs(p *coordinator.Protection, k quotaKnobs) {
	// The fixed fleets learn nothing: rate_limit alone paces them.
	p.RateLimit = k.rateLimit
	learn := k.learnQuota
	p.LearnQuota = &learn
	p.MaxInFlight = k.maxInFlight
}

// quotaTenant is the server.Tenant of a tenant of the benchmark.
func quotaTenant(name, token string, weight int, cred *upstreamcfg.Credential) server.Tenant {
	t := server.Tenant{Name: name, Tokens: []string{token}, Upstreams: []string{"gh"}, Credentials: map[string]*upstreamcfg.Credential{"gh": cred}}
	t.Weight = weight
	return t
}

// quotaRequest is the GetOrFetch request of the benchmark for u; the
// batch's calls are background.
func quotaRequest(u string, background bool) *coorddv1.GetOrFetchRequest {
	req := &coorddv1.GetOrFetchRequest{Url: u}
	if background {
		req.Priority = coorddv1.Priority_PRIORITY_BACKGROUND
	}
	return req
}

// quotaFleetResult is what one fleet's run measured.
type quotaFleetResult struct {
	name                    string
	refused403, refused429  int             // at the fake, both credentials, whole run
	secondary               int             // of those, the secondary limit's
	usedRatio               float64         // the most requests in one window of a credential ÷ N
	drain                   time.Duration   // the batch's last page since it began; 0: not drained by the cap
	drained                 int             // pages fetched by the end
	progress                []time.Duration // each page's completion since the batch began, sorted
	alone, beside           []time.Duration // the light tenant's call waits
	lightCalls, lightFailed int
	batchRetries            int // the heavy tenant's calls retried (after a refusal passed on by coordd)
	shares                  []tenantShare
	firstErr                string
	elapsed                 time.Duration
}

// tenantShare is a tenant's upstream requests served in the first ideal
// time of the batch against its max-min fair share of them.
type tenantShare struct {
	tenant               string
	demand, served, fair float64
}

// ratio is served ÷ fair; 1 when the tenant asked nothing.
func (s tenantShare) ratio() float64 {
	if s.fair <= 0 {
		return 1
	}
	return s.served / s.fair
}

// worstShare is the lowest served ÷ fair of r's tenants.
func (r quotaFleetResult) worstShare() float64 {
	w := math.Inf(1)
	for _, s := range r.shares {
		w = min(w, s.ratio())
	}
	if math.IsInf(w, 1) {
		return 0
	}
	return w
}

// quotaResult is every fleet's result.
type quotaResult struct {
	cfg    quotaConfig
	fleets []quotaFleetResult
}

// runQuota runs every fleet in turn, each against a fresh fake API and an
// emptied redis-server.
func runQuota(ctx context.Context, h redistest.TB, cfg quotaConfig, progress func(string, ...any)) (*quotaResult, error) {
	rds := redistest.Start(h)
	rdb := redis.NewClient(&redis.Options{Addr: rds.Addr()})
	h.Cleanup(func() { _ = rdb.Close() })
	res := &quotaResult{cfg: cfg}
	for _, f := range quotaFleets(cfg) {
		if err := rdb.FlushAll(ctx).Err(); err != nil {
			return nil, fmt.Errorf("redis FLUSHALL: %w", err)
		}
		progress("quota: %s", f.name)
		r, err := runQuotaFleet(ctx, rds.URL(), cfg, f)
		if err != nil {
			return nil, fmt.Errorf("quota, %s: %w", f.name, err)
		}
		res.fleets = append(res.fleets, r)
	}
	return res, nil
}

// quotaRun is one fleet's running parts.
type quotaRun struct {
	cfg          quotaConfig
	api          *fakeapi.API
	stubs        []coorddv1.CoordinatorServiceClient
	heavy, light string // the tenants' bearer tokens towards coordd
	seq          atomic.Int64

	mu       sync.Mutex // protects firstErr
	firstErr error
}

func (q *quotaRun) fail(err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.firstErr == nil {
		q.firstErr = err
	}
}

// runQuotaFleet starts the fake API and f's instances, runs the light
// tenant alone, then the batch beside it, and reads the fake's counters.
func runQuotaFleet(ctx context.Context, redisURL string, cfg quotaConfig, f quotaFleet) (quotaFleetResult, error) {
	started := time.Now()
	fh := &host{}
	defer fh.close()
	heavyCred, lightCred := "ghp_bench_heavy_0123456789abcdef", "ghp_bench_light_0123456789abcdef"
	api := fakeapi.Start(fakeapi.Options{
		Tokens: map[string]string{heavyCred: heavyLogin, lightCred: lightLogin},
		Limit:  cfg.limit, Window: cfg.window, MaxConcurrent: cfg.concurrent, Delay: cfg.latency,
		Issues: 5,
	})
	fh.Cleanup(api.Close)

	dir := fh.TempDir()
	load := func(name, value string) (*upstreamcfg.Credential, error) {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte("Bearer "+value+"\n"), 0o600); err != nil {
			return nil, err
		}
		c := &upstreamcfg.Credential{ValueFile: path}
		return c, c.Load("tenants ("+name+").credentials.gh", nil)
	}
	hc, err := load(heavyTenant, heavyCred)
	if err != nil {
		return quotaFleetResult{}, err
	}
	lc, err := load(lightTenant, lightCred)
	if err != nil {
		return quotaFleetResult{}, err
	}
	q := &quotaRun{cfg: cfg, api: api, heavy: "coordbench-heavy-tenant-token", light: "coordbench-light-tenant-token"}
	auth, err := server.NewAuth([]server.Tenant{
		quotaTenant(heavyTenant, q.heavy, cfg.heavyWeight, hc),
		quotaTenant(lightTenant, q.light, cfg.lightWeight, lc),
	})
	if err != nil {
		return quotaFleetResult{}, err
	}
	up := coordinator.Upstream{Name: "gh", BaseURL: api.URL()}
	// Waits are the engine's to bound: long enough for the batch to queue.
	up.Protection.MaxWait = time.Duration(cfg.capFactor*float64(cfg.ideal())) + cfg.window
	applyQuotaKnobs(&up.Protection, f.knobs)
	for range cfg.instances {
		url := ""
		if f.shared {
			url = redisURL
		}
		in := startCoorddWith(fh, coorddSpec{
			redisURL: url,
			cfg: coordinator.Config{Upstreams: []coordinator.Upstream{up},
				CredentialScopeKey: secret.New("coordbench-quota-scope-key-0123456789")},
			server: []server.Option{server.WithAuth(auth)},
		})
		q.stubs = append(q.stubs, coorddv1.NewCoordinatorServiceClient(dial(fh, in.addr)))
	}

	r := quotaFleetResult{name: f.name}
	// The light tenant alone.
	aloneEnd := make(chan struct{})
	aloneTimer := time.AfterFunc(cfg.alone, func() { close(aloneEnd) })
	alone := q.runLight(ctx, aloneEnd)
	aloneTimer.Stop()
	r.alone = alone.waits()
	r.lightCalls, r.lightFailed = len(alone), alone.failed()

	// The batch, beside the light tenant, from the start of a second: the
	// heavy credential's first window then starts with the batch.
	if !sleepCtx(ctx, time.Until(time.Now().Truncate(time.Second).Add(time.Second+10*time.Millisecond))) {
		return r, ctx.Err()
	}
	ideal := cfg.ideal()
	t0 := time.Now()
	before := [2]fakeapi.Stats{api.Stats(heavyLogin), api.Stats(lightLogin)}
	var at [2]fakeapi.Stats // at t0 + ideal; written before snapped closes
	snapped := make(chan struct{})
	snap := time.AfterFunc(ideal, func() {
		at = [2]fakeapi.Stats{api.Stats(heavyLogin), api.Stats(lightLogin)}
		close(snapped)
	})
	defer snap.Stop()
	batchCtx, stopBatch := context.WithTimeout(ctx, time.Duration(cfg.capFactor*float64(ideal)))
	defer stopBatch()
	stopLight := make(chan struct{})
	lightDone := make(chan lightCalls, 1)
	go func() { lightDone <- q.runLight(ctx, stopLight) }()
	r.progress, r.batchRetries = q.batch(batchCtx, t0)
	stopBatch()
	// The light tenant runs beside the batch until it ends, and at least
	// for the ideal time, over which the shares are counted.
	select {
	case <-snapped:
	case <-ctx.Done():
	}
	close(stopLight)
	beside := <-lightDone
	if ctx.Err() != nil {
		return r, ctx.Err()
	}
	r.beside = beside.waits()
	r.lightCalls += len(beside)
	r.lightFailed += beside.failed()
	r.drained = len(r.progress)
	if r.drained == cfg.pages {
		r.drain = r.progress[len(r.progress)-1]
	}

	// Shares of the upstream's requests over the batch's first ideal
	// time: the heavy tenant asks for the whole batch; the light one for
	// a page per call its agents started in that time.
	lightDemand := 0
	for _, c := range beside {
		if c.start.Before(t0.Add(ideal)) {
			lightDemand++
		}
	}
	capacity := float64(cfg.limit) * ideal.Seconds() / cfg.window.Seconds() // per credential
	r.shares = fairShares(capacity, []claim{
		{tenant: heavyTenant, credential: heavyLogin, demand: float64(cfg.pages), weight: float64(cfg.heavyWeight),
			served: float64(at[0].Served - before[0].Served)},
		{tenant: lightTenant, credential: lightLogin, demand: float64(lightDemand), weight: float64(cfg.lightWeight),
			served: float64(at[1].Served - before[1].Served)},
	})

	// The whole run's refusals and the worst window, once every call
	// has ended (flights the batch left at its cap may still be fetching;
	// counted as they land, until the fleet stops).
	for _, login := range []string{heavyLogin, lightLogin} {
		st := api.Stats(login)
		r.refused403 += st.Refused403
		r.refused429 += st.Refused429
		r.secondary += st.Secondary
		r.usedRatio = max(r.usedRatio, float64(st.MaxWindowRequests)/float64(cfg.limit))
	}
	if err := firstErrOf(q, alone, beside); err != nil {
		r.firstErr = err.Error()
	}
	r.elapsed = time.Since(started)
	return r, nil
}

// firstErrOf is the first error the run saw: a call that could not be
// made, else a light call that failed.
func firstErrOf(q *quotaRun, calls ...lightCalls) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.firstErr != nil {
		return q.firstErr
	}
	for _, cs := range calls {
		for _, c := range cs {
			if c.err != nil {
				return c.err
			}
		}
	}
	return nil
}

// lightCall is one call of the light tenant: when it started, how long
// its caller waited for the page (retries included), and its error if it
// never got it.
type lightCall struct {
	start time.Time
	wait  time.Duration
	err   error
}

type lightCalls []lightCall

func (cs lightCalls) waits() []time.Duration {
	ws := make([]time.Duration, len(cs))
	for i, c := range cs {
		ws[i] = c.wait
	}
	return ws
}

func (cs lightCalls) failed() int {
	n := 0
	for _, c := range cs {
		if c.err != nil {
			n++
		}
	}
	return n
}

// runLight runs the light tenant's agents until stop: each starts a call
// for a cold page every cfg.every, staggered, whether or not its last call
// has ended (open loop: a slow fleet does not lower the demand). It
// returns once every call started has ended.
func (q *quotaRun) runLight(ctx context.Context, stop <-chan struct{}) lightCalls {
	var (
		mu    sync.Mutex
		calls lightCalls
		wg    sync.WaitGroup
	)
	stopped := make(chan struct{})
	go func() {
		select {
		case <-stop:
		case <-ctx.Done():
		}
		close(stopped)
	}()
	for a := range q.cfg.agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stub := q.stubs[a%len(q.stubs)]
			offset := q.cfg.every * time.Duration(a) / time.Duration(q.cfg.agents)
			next := time.Now().Add(offset)
			for {
				t := time.NewTimer(time.Until(next))
				select {
				case <-t.C:
				case <-stopped:
					t.Stop()
					return
				}
				next = next.Add(q.cfg.every)
				u := fmt.Sprintf("%s/repos/bench/agent-%d/readme", q.api.URL(), q.seq.Add(1))
				wg.Add(1)
				go func() {
					defer wg.Done()
					start := time.Now()
					cctx, cancel := context.WithTimeout(ctx, q.cfg.callTimeout)
					_, err := q.get(cctx, stub, q.light, u, false)
					cancel()
					mu.Lock()
					calls = append(calls, lightCall{start: start, wait: time.Since(start), err: err})
					mu.Unlock()
				}()
			}
		}()
	}
	wg.Wait()
	return calls
}

// batch asks for the heavy tenant's B pages at once, spread over the
// instances, each retried after the wait coordd passes on until it is
// fetched or ctx ends. It returns each fetched page's completion since t0,
// sorted, and the retries made.
func (q *quotaRun) batch(ctx context.Context, t0 time.Time) ([]time.Duration, int) {
	var (
		mu      sync.Mutex
		done    []time.Duration
		retries int
		wg      sync.WaitGroup
	)
	for i := range q.cfg.pages {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u := fmt.Sprintf("%s/repos/bench/batch-%d/issues", q.api.URL(), i)
			n, err := q.get(ctx, q.stubs[i%len(q.stubs)], q.heavy, u, true)
			at := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			retries += n
			if err == nil {
				done = append(done, at)
			}
		}()
	}
	wg.Wait()
	slices.Sort(done)
	return done, retries
}

// get fetches u through stub as the tenant of token, retrying a refusal
// after the wait coordd names (RetryInfo; 250 ms without one, at most a
// window), until it succeeds or ctx ends. It returns the retries made.
func (q *quotaRun) get(ctx context.Context, stub coorddv1.CoordinatorServiceClient, token, u string, background bool) (int, error) {
	retries := 0
	for {
		wait, err := quotaCall(ctx, stub, token, u, background)
		if err == nil {
			return retries, nil
		}
		if ctx.Err() != nil {
			return retries, err
		}
		if !retryable(err) {
			q.fail(err)
			return retries, err
		}
		if wait <= 0 {
			wait = 250 * time.Millisecond
		}
		retries++
		if !sleepCtx(ctx, min(wait, q.cfg.window)) {
			return retries, err
		}
	}
}

// retryable reports whether err is a refusal or an outage worth another
// try, rather than a mistake of the harness's.
func retryable(err error) bool {
	var se *statusError
	if errors.As(err, &se) {
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.ResourceExhausted, codes.Aborted, codes.DeadlineExceeded:
		return true
	}
	return false
}

// quotaCall makes one GetOrFetch of u as the tenant of token and reads it
// to the end. An error carries the wait coordd asks for (RetryInfo), if
// any; an answer other than 200 is a *statusError.
func quotaCall(ctx context.Context, stub coorddv1.CoordinatorServiceClient, token, u string, background bool) (time.Duration, error) {
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	st, err := stub.GetOrFetch(ctx, quotaRequest(u, background))
	if err != nil {
		return retryInfo(err), err
	}
	var code int32
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return retryInfo(err), err
		}
		if md := m.GetMetadata(); md != nil {
			code = md.GetStatusCode()
		}
	}
	if code != 200 {
		return 0, &statusError{code: int(code)}
	}
	return 0, nil
}

// retryInfo is the RetryInfo delay of err's status; 0 without one.
func retryInfo(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}

// sleepCtx waits d, and reports false if ctx ends first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// claim is a tenant's claim on a credential's requests over a period.
type claim struct {
	tenant, credential string
	demand, weight     float64 // weight 0: 1
	served             float64
}

// fairShares returns each claim's share: served against its max-min fair
// share of its credential's capacity (requests the quota allows in the
// period), given every claim on that credential.
func fairShares(capacity float64, claims []claim) []tenantShare {
	by := map[string][]int{}
	var creds []string
	for i, c := range claims {
		if _, ok := by[c.credential]; !ok {
			creds = append(creds, c.credential)
		}
		by[c.credential] = append(by[c.credential], i)
	}
	out := make([]tenantShare, len(claims))
	for _, cr := range creds {
		idx := by[cr]
		demand, weight := make([]float64, len(idx)), make([]float64, len(idx))
		for j, i := range idx {
			demand[j], weight[j] = claims[i].demand, claims[i].weight
		}
		fair := maxMinFair(capacity, demand, weight)
		for j, i := range idx {
			out[i] = tenantShare{tenant: claims[i].tenant, demand: claims[i].demand, served: claims[i].served, fair: fair[j]}
		}
	}
	return out
}

// maxMinFair is the weighted max-min fair allocation of capacity among
// demands (water-filling): no one gets more than it asks, and what one
// leaves goes to the others in proportion to their weights (0: 1).
func maxMinFair(capacity float64, demand, weight []float64) []float64 {
	alloc := make([]float64, len(demand))
	open := make([]int, 0, len(demand))
	for i := range demand {
		if demand[i] > 0 {
			open = append(open, i)
		}
	}
	w := func(i int) float64 {
		if weight[i] <= 0 {
			return 1
		}
		return weight[i]
	}
	left := capacity
	for len(open) > 0 && left > 1e-9 {
		total := 0.0
		for _, i := range open {
			total += w(i)
		}
		// The level each open claim rises by, unless one is met first.
		step := left / total
		for _, i := range open {
			step = min(step, (demand[i]-alloc[i])/w(i))
		}
		var still []int
		for _, i := range open {
			alloc[i] += step * w(i)
			left -= step * w(i)
			if demand[i]-alloc[i] > 1e-9 {
				still = append(still, i)
			}
		}
		open = still
	}
	return alloc
}

// quotaColumns are the quota table's columns, in order (issue 24).
var quotaColumns = []string{
	"fleet",
	"refused at the upstream (403 and 429)",
	"quota used ÷ announced",
	"drain time ÷ ideal",
	"light tenant's wait p99 alone (ms)",
	"light tenant's wait p99 beside the heavy batch (ms)",
	"worst tenant's share ÷ max-min fair share",
}

// renderQuota formats r as Markdown: the table, one row per fleet, then
// the details behind it and the definitions.
func renderQuota(r *quotaResult) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	c := r.cfg
	w("## Quota: coordd against fixed rate limits and per-instance pacing, GitHub-like limits (goal: coordd 0 refused, quota used ≤ 1, drain within 15%% of ideal)\n\n")
	w("%s. Ideal drain time: B ÷ (remaining ÷ reset) on the heavy credential's fresh window = %d ÷ (%d ÷ %v) = %.1f s. Every fleet starts cold, with an empty Redis and a fresh fake API.\n\n",
		c, c.pages, c.limit, c.window, c.ideal().Seconds())
	w("| %s |\n", strings.Join(quotaColumns, " | "))
	w("|---|%s\n", strings.Repeat("---:|", len(quotaColumns)-1))
	for _, f := range r.fleets {
		_, aloneP99, _ := percentiles(f.alone)
		_, besideP99, _ := percentiles(f.beside)
		w("| %s | %d | %.2f | %s | %s | %s | %.2f |\n", f.name, f.refused403+f.refused429, f.usedRatio, drainCell(f, c),
			msCell(f.alone, aloneP99), msCell(f.beside, besideP99), f.worstShare())
	}
	w("\nDetails:\n\n")
	w("| fleet | refused 403 / 429 (secondary limit) | light wait p50 alone / beside (ms) | light calls (failed) | batch pages fetched (client retries) | share ÷ fair: %s, %s | wall |\n", heavyTenant, lightTenant)
	w("|---|---:|---:|---:|---:|---:|---:|\n")
	for _, f := range r.fleets {
		a50, _, _ := percentiles(f.alone)
		b50, _, _ := percentiles(f.beside)
		shares := make([]string, len(f.shares))
		for i, s := range f.shares {
			shares[i] = fmt.Sprintf("%.2f (%.0f of %.0f)", s.ratio(), s.served, s.fair)
		}
		w("| %s | %d / %d (%d) | %s / %s | %d (%d) | %d of %d (%d) | %s | %.1fs |\n", f.name, f.refused403, f.refused429, f.secondary,
			msCell(f.alone, a50), msCell(f.beside, b50), f.lightCalls, f.lightFailed, f.drained, c.pages, f.batchRetries,
			strings.Join(shares, ", "), f.elapsed.Seconds())
	}
	w("\n- **Refused at the upstream**: the fake API's 403s and 429s to either credential over the fleet's whole run, the secondary limit's included.\n")
	w("- **Quota used ÷ announced**: the most requests one credential sent in one window (refused ones included) ÷ the limit the headers announce (N). Above 1: the fleet asked for more than the quota allows.\n")
	w("- **Drain time ÷ ideal**: from the batch's start (at the start of a second, the heavy credential's first window starting with it) to its last page, ÷ the ideal time B ÷ (remaining ÷ reset). The batch phase ends at %.1f× the ideal time: \"> %.1f\" is a batch not drained by then (the share of pages fetched in brackets).\n", c.capFactor, c.capFactor)
	w("- **Light tenant's wait**: from a call's start to its page, retries after coordd's RetryInfo included (a call gives up after %v and counts as that), alone for %v, then beside the batch until it ends.\n", c.callTimeout, c.alone)
	w("- **Worst tenant's share ÷ max-min fair share**: over the batch's first ideal time, each tenant's requests served by the fake API ÷ its weighted max-min fair share of its credential's quota in that time (N × ideal ÷ W) given every tenant's demand on that credential (the heavy tenant's: the whole batch; the light tenant's: the calls its agents started); the lowest of the two.\n")
	for _, f := range r.fleets {
		if f.firstErr != "" {
			w("\nFirst error, %s: %s\n", f.name, f.firstErr)
		}
	}
	return b.String()
}

// drainCell is f's drain time ÷ ideal, or "> cap" when it did not drain.
func drainCell(f quotaFleetResult, c quotaConfig) string {
	if f.drain == 0 {
		return fmt.Sprintf("> %.1f (%.0f%%)", c.capFactor, 100*float64(f.drained)/float64(c.pages))
	}
	return fmt.Sprintf("%.2f", f.drain.Seconds()/c.ideal().Seconds())
}

// msCell is d in ms, or "—" without samples.
func msCell(samples []time.Duration, d time.Duration) string {
	if len(samples) == 0 {
		return "—"
	}
	return msNum(d)
}
