package coordinator

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coordd/coordd/internal/upstream"
)

// Status is a read-only snapshot of a Coordinator, for a status page:
// plain values, taken without stopping any call.
type Status struct {
	Now       time.Time        // by Config.Now
	Flights   []FlightStatus   // in progress, oldest first
	Upstreams []UpstreamStatus // in configuration order
	Redis     RedisStatus
	L1        L1Stats
	// Windows are the rolling counts over the last 1, 5 and 15 minutes.
	Windows []WindowStatus
	// Tenants are each tenant's totals since start, by name; "" is the
	// default tenant. A tenant appears once it made a call.
	Tenants []TenantStatus
}

// FlightStatus is one flight in progress: the fill of one key in this
// instance, which its local callers wait for.
type FlightStatus struct {
	// ID is a short digest of the cache id: the same for the same
	// document on every instance, so that one key's flights can be matched
	// across status pages.
	ID       string
	Key      string // the cache key: the caller's, or the url
	URL      string
	Upstream string
	Tenant   string
	// Role is "starting" (reading L2, asking for the fill lock),
	// "leader" (this instance fetches), "follower" (another instance
	// holds the fill lock and fetches) or "degraded" (Redis is down or
	// did not answer: this instance fetches, coordinating in-process).
	Role string
	// Stage is the flight's latest progress event (Stage.String), ""
	// before the first; Detail is that event's detail.
	Stage, Detail string
	Age           time.Duration // since the flight started
	Waiters       int           // callers on this instance waiting for it
	// FollowersElsewhere is how many flights of other instances wait for
	// this one, where known: 0 in single-node mode and in degraded mode
	// (nobody can follow over Redis); -1 otherwise, as followers do not
	// announce themselves (that would cost a Redis write per follower).
	FollowersElsewhere int
	// Stale reports that a stale copy is served to callers meanwhile.
	Stale bool
}

// GuardStatus is the state of the guard protecting an upstream (see
// upstream.Status).
type GuardStatus = upstream.Status

// UpstreamStatus is one configured upstream and its guard.
type UpstreamStatus struct {
	Name  string
	Guard GuardStatus
}

// RedisStatus describes the Redis a Coordinator shares with others.
type RedisStatus struct {
	// Mode is "single-node" (no Redis), "redis", "cluster" or "sentinel".
	Mode    string
	Healthy bool  // believed up; false in single-node mode
	Downs   int64 // times it was marked down
}

// WindowStatus is what happened over the last Span.
type WindowStatus struct {
	Span time.Duration
	Counts
}

// ServedPerUpstream is how many callers were served (answered with a
// document) per upstream fetch, and false when there was no fetch.
func (w WindowStatus) ServedPerUpstream() (float64, bool) {
	if w.Upstream == 0 {
		return 0, false
	}
	return float64(w.Calls-w.Errors) / float64(w.Upstream), true
}

// L1HitRatio is the share of calls answered from L1, and false when there
// was no call.
func (w WindowStatus) L1HitRatio() (float64, bool) {
	if w.Calls == 0 {
		return 0, false
	}
	return float64(w.L1) / float64(w.Calls), true
}

// TenantStatus is one tenant's totals since start.
type TenantStatus struct {
	Tenant   string
	Calls    int64 // Gets that returned, errors included
	Upstream int64 // upstream fetches its calls started
}

// statusWindows are the spans of Status.Windows.
var statusWindows = []time.Duration{time.Minute, 5 * time.Minute, 15 * time.Minute}

// Status returns a snapshot of c. It reads each upstream's shared guard
// from Redis, concurrently, within ctx and the Redis timeout, falling
// back to the instance's own guard; everything else is in memory. It
// changes nothing.
func (c *Coordinator) Status(ctx context.Context) Status {
	now := c.cfg.Now()
	s := Status{Now: now, L1: c.L1Stats(), Redis: c.co.redisStatus()}

	c.mu.Lock()
	flights := make([]*flight, 0, len(c.flights))
	for _, f := range c.flights {
		flights = append(flights, f)
	}
	c.mu.Unlock()
	for _, f := range flights {
		s.Flights = append(s.Flights, c.flightStatus(f, now))
	}
	slices.SortFunc(s.Flights, func(a, b FlightStatus) int { return cmp.Or(cmp.Compare(b.Age, a.Age), cmp.Compare(a.ID, b.ID)) })

	s.Upstreams = make([]UpstreamStatus, len(c.cfg.Upstreams))
	var wg sync.WaitGroup
	for i, up := range c.cfg.Upstreams {
		s.Upstreams[i].Name = up.Name
		wg.Go(func() { s.Upstreams[i].Guard = c.clients[up.Name].Status(ctx) })
	}
	wg.Wait()

	for _, span := range statusWindows {
		s.Windows = append(s.Windows, WindowStatus{Span: span, Counts: c.stats.win.sum(now, int(span/time.Second))})
	}
	c.stats.tenants.Range(func(k, v any) bool {
		t := v.(*tenantCounts)
		s.Tenants = append(s.Tenants, TenantStatus{Tenant: k.(string), Calls: t.calls.Load(), Upstream: t.upstream.Load()})
		return true
	})
	slices.SortFunc(s.Tenants, func(a, b TenantStatus) int { return cmp.Compare(a.Tenant, b.Tenant) })
	return s
}

// flightStatus reads f. Its role and stage come from the progress events
// it recorded for its callers.
func (c *Coordinator) flightStatus(f *flight, now time.Time) FlightStatus {
	sum := sha256.Sum256([]byte(f.t.id))
	fs := FlightStatus{
		ID: hex.EncodeToString(sum[:4]), Key: f.t.Key, URL: f.t.URL, Upstream: f.t.upstream.Name, Tenant: f.t.tenant,
		Role: "starting", Age: max(now.Sub(f.started), 0), Waiters: int(f.waiters.Load()), FollowersElsewhere: -1,
	}
	degraded := false
	f.mu.Lock()
	for _, p := range f.events {
		degraded = degraded || p.Stage == StageDegraded
		if p.Role != 0 {
			fs.Role = p.Role.String()
		}
		fs.Stage, fs.Detail = p.Stage.String(), p.Detail
	}
	fs.Stale = f.stale != nil
	f.mu.Unlock()
	if degraded && fs.Role == RoleLeader.String() {
		fs.Role = "degraded"
	}
	if !c.RedisConfigured() || degraded {
		fs.FollowersElsewhere = 0
	}
	return fs
}

// ErrUnknownUpstream reports a name that is not one of the configured
// upstreams'.
var ErrUnknownUpstream = errors.New("coordinator: no such upstream")

// ClearQuotas forgets the quotas learned of the upstream named, and the
// backoff a spent one set, on every instance sharing Redis: the
// operator's way to end a quota spent for hours without a restart (see
// docs/upstream-protection.md). The next answers teach the quota again.
// While Redis is down it clears this instance alone, and says so in its
// error.
func (c *Coordinator) ClearQuotas(ctx context.Context, name string) error {
	cl, ok := c.clients[name]
	if !ok {
		return fmt.Errorf("%w: %q (configured: %s)", ErrUnknownUpstream, name, strings.Join(c.Upstreams(), ", "))
	}
	return cl.ClearQuotas(ctx)
}
