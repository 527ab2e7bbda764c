// Package upstream fetches documents from operator-configured upstreams,
// and protects each upstream from the load of every instance together:
// a circuit breaker, a GCRA rate limit with reservations, the backoff the
// upstream asks for (Retry-After), retries under a budget, and redirects
// followed only within the upstream, to canonical urls. The breaker, the
// rate limit and the backoff are shared by every instance through a
// Shared store (Redis), and kept in-process without one or while it is
// down.
package upstream

import (
	"fmt"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"time"
)

// Protection configures how coordd protects one upstream from the load of
// every instance together: the rate limit, the shared Retry-After backoff,
// the cap on requests in flight, retries with a budget, the circuit
// breaker, and the bounds put on the upstream's own Cache-Control. Zero
// fields take the defaults written beside them. The rate limit, the
// backoff, the slots in flight and the breaker live in Redis and are shared
// by every instance; with Redis down, or without Redis, each instance
// applies the same limits in-process.
type Protection struct {
	// RateLimit is the most requests per second sent to the upstream by all
	// instances together, retries and redirects followed included: no
	// one-second window sees more than RateLimit+Burst-1 requests. Requests
	// over it wait their turn, in order. Default: 20. Negative: no limit.
	RateLimit int `yaml:"rate_limit"`
	// Burst is how many requests may go out back to back after a quiet
	// spell. Default: 1 (paced evenly, never bunched).
	Burst int `yaml:"burst"`
	// MaxWait bounds how long one fetch waits for a rate-limit slot or for
	// the end of a Retry-After backoff. A fetch is also bounded by the
	// latest deadline among the callers waiting for it. A fetch that cannot
	// get a slot in time fails with ErrRateLimited (or serves the stale
	// copy). Default: 10s.
	MaxWait time.Duration `yaml:"max_wait"`
	// DegradedRateLimit is the per-instance rate limit while Redis is down
	// (each instance then counts only its own requests). Set it to
	// RateLimit divided by the number of instances to keep the cluster
	// within RateLimit even then. Default: RateLimit. Negative: no limit.
	// In single-node mode (no Redis) RateLimit applies.
	DegradedRateLimit int `yaml:"degraded_rate_limit"`
	// MaxInFlight is the most requests in progress to the upstream at once,
	// across every instance, per credential scope (each credential has its
	// own slots; the fetches without one share theirs). A request holds a
	// slot from its admission until its answer is read, and the slot frees
	// itself at its lease's end (Timeout + 1s) if its instance dies or
	// loses Redis meanwhile. A request that finds every slot taken waits,
	// within MaxWait, for one to free on any instance, else fails with
	// ErrRateLimited. While Redis is down each instance caps its own
	// requests at MaxInFlight. Default: 0, no cap. GitHub refuses more
	// than 100 concurrent requests per credential.
	MaxInFlight int `yaml:"max_in_flight"`
	// RetryAfterCap caps the backoff an upstream can ask for with
	// Retry-After (in seconds or as an HTTP date, on a 429 or 503). Every
	// instance backs off the upstream until then. Default: 60s.
	RetryAfterCap time.Duration `yaml:"retry_after_cap"`
	// Retry configures retries of failed attempts.
	Retry RetryPolicy `yaml:"retry"`
	// Breaker configures the circuit breaker.
	Breaker BreakerPolicy `yaml:"breaker"`
	// MinTTL and MaxTTL bound a positive fresh lifetime that the
	// upstream's Cache-Control (s-maxage, max-age) sets; a zero one
	// (max-age=0, no-cache) stays zero; without one, the upstream's TTL
	// applies. no-store and private answers are delivered but not cached.
	// Defaults: 1m and 24h.
	MinTTL time.Duration `yaml:"min_ttl"`
	MaxTTL time.Duration `yaml:"max_ttl"`
	// LearnQuota paces the upstream by the quota its answers announce
	// (RateLimit and RateLimit-Policy, X-RateLimit-*): per credential
	// scope and per partition, so that what remains of each lasts until
	// its reset, never faster than RateLimit, across every instance. See
	// docs/upstream-protection.md. Default: true.
	LearnQuota *bool `yaml:"learn_quota"`
}

// LearnsQuota reports whether the upstream's announced quotas pace it
// (LearnQuota, default true).
func (p *Protection) LearnsQuota() bool { return p.LearnQuota == nil || *p.LearnQuota }

// RetryPolicy configures retries. Only retryable outcomes are retried:
// connection errors, timeouts, 429 and 5xx other than 501. Never a 4xx
// otherwise, never once the fetch's context has ended.
type RetryPolicy struct {
	// MaxAttempts bounds the attempts per fetch, the first included; a
	// redirect followed starts its own count. Default: 3. 1: no retries.
	MaxAttempts int `yaml:"max_attempts"`
	// BaseDelay and MaxDelay shape the backoff: before retry n the fetch
	// sleeps a uniformly random time in [0, min(MaxDelay, BaseDelay·2^(n-1))]
	// ("full jitter"), or until the upstream's Retry-After if later.
	// Defaults: 100ms and 5s.
	BaseDelay time.Duration `yaml:"base_delay"`
	MaxDelay  time.Duration `yaml:"max_delay"`
	// BudgetRatio bounds retries to this share of the requests that this
	// instance started in the last 10 seconds, so that retries cannot
	// multiply the load on a struggling upstream. Default: 0.2. Negative:
	// only BudgetMinPerSec.
	BudgetRatio float64 `yaml:"budget_ratio"`
	// BudgetMinPerSec is a floor of retries per second allowed whatever the
	// ratio, so that a quiet instance can still retry. Default: 1.
	// Negative: none.
	BudgetMinPerSec float64 `yaml:"budget_min_per_sec"`
}

// BreakerPolicy configures the circuit breaker, one per upstream, shared
// by every instance. Closed, it lets requests through and counts failed
// attempts (the retryable outcomes). It opens after FailureThreshold
// consecutive failures, or when at least MinRequests attempts in the last
// Window failed at FailureRate or more. Open, it fails every fetch at once
// (stale copy, else ErrBreakerOpen) for OpenFor, then turns half-open: it
// admits HalfOpenProbes attempts at a time, closes after CloseAfter
// successes in a row and opens again on a failure.
type BreakerPolicy struct {
	// FailureThreshold is the consecutive failures that open the breaker.
	// Default: 5. Negative: never on this count.
	FailureThreshold int `yaml:"failure_threshold"`
	// FailureRate is the share of failed attempts in Window that opens the
	// breaker, at most 1. Default: 0.5. Negative: never on the rate.
	FailureRate float64 `yaml:"failure_rate"`
	// MinRequests is the attempts in Window below which FailureRate is not
	// judged. Default: 20.
	MinRequests int `yaml:"min_requests"`
	// Window is the span over which FailureRate is measured. Default: 30s.
	Window time.Duration `yaml:"window"`
	// OpenFor is how long the breaker stays open before it probes.
	// Default: 10s.
	OpenFor time.Duration `yaml:"open_for"`
	// HalfOpenProbes is the attempts admitted at a time while half-open;
	// every other fetch fails at once meanwhile. Default: 1.
	HalfOpenProbes int `yaml:"half_open_probes"`
	// CloseAfter is the successful probes in a row that close the breaker.
	// Default: 2.
	CloseAfter int `yaml:"close_after"`
}

func (p *Protection) setDefaults() {
	if p.LearnQuota == nil { // filled in, so that --check-config shows it
		learn := true
		p.LearnQuota = &learn
	}
	setDefault(&p.RateLimit, 20)
	setDefault(&p.Burst, 1)
	setDefault(&p.MaxWait, 10*time.Second)
	setDefault(&p.DegradedRateLimit, p.RateLimit)
	setDefault(&p.RetryAfterCap, time.Minute)
	setDefault(&p.MinTTL, time.Minute)
	setDefault(&p.MaxTTL, 24*time.Hour)
	r := &p.Retry
	setDefault(&r.MaxAttempts, 3)
	setDefault(&r.BaseDelay, 100*time.Millisecond)
	setDefault(&r.MaxDelay, 5*time.Second)
	setDefault(&r.BudgetRatio, 0.2)
	setDefault(&r.BudgetMinPerSec, 1)
	b := &p.Breaker
	setDefault(&b.FailureThreshold, 5)
	setDefault(&b.FailureRate, 0.5)
	setDefault(&b.MinRequests, 20)
	setDefault(&b.Window, 30*time.Second)
	setDefault(&b.OpenFor, 10*time.Second)
	setDefault(&b.HalfOpenProbes, 1)
	setDefault(&b.CloseAfter, 2)
}

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

func (p *Protection) validate(field string) error {
	bad := func(name, format string, args ...any) error {
		return fmt.Errorf("%s.%s: "+format, append([]any{field, name}, args...)...)
	}
	r, b := &p.Retry, &p.Breaker
	switch {
	case p.Burst < 1:
		return bad("burst", "%d must be at least 1", p.Burst)
	case p.MaxWait < 0:
		return bad("max_wait", "must not be negative")
	case p.MaxInFlight < 0:
		return bad("max_in_flight", "%d must not be negative (0: no cap)", p.MaxInFlight)
	case p.RetryAfterCap < 0:
		return bad("retry_after_cap", "must not be negative")
	case p.MinTTL < 0:
		return bad("min_ttl", "must not be negative")
	case p.MaxTTL < p.MinTTL:
		return bad("max_ttl", "%v is below min_ttl %v", p.MaxTTL, p.MinTTL)
	case r.MaxAttempts < 1 || r.MaxAttempts > 10:
		return bad("retry.max_attempts", "%d must be between 1 and 10", r.MaxAttempts)
	case r.BaseDelay < 0:
		return bad("retry.base_delay", "must not be negative")
	case r.MaxDelay < r.BaseDelay:
		return bad("retry.max_delay", "%v is below base_delay %v", r.MaxDelay, r.BaseDelay)
	case math.IsNaN(r.BudgetRatio) || r.BudgetRatio > 10:
		return bad("retry.budget_ratio", "%v must be at most 10", r.BudgetRatio)
	case math.IsNaN(r.BudgetMinPerSec) || r.BudgetMinPerSec > 1000:
		return bad("retry.budget_min_per_sec", "%v must be at most 1000", r.BudgetMinPerSec)
	case math.IsNaN(b.FailureRate) || b.FailureRate > 1:
		return bad("breaker.failure_rate", "%v must be at most 1", b.FailureRate)
	case b.MinRequests < 1:
		return bad("breaker.min_requests", "%d must be at least 1", b.MinRequests)
	case b.Window < 100*time.Millisecond:
		return bad("breaker.window", "%v is below the 100ms minimum", b.Window)
	case b.OpenFor < 0:
		return bad("breaker.open_for", "must not be negative")
	case b.HalfOpenProbes < 1 || b.HalfOpenProbes > 100:
		return bad("breaker.half_open_probes", "%d must be between 1 and 100", b.HalfOpenProbes)
	case b.CloseAfter < 1:
		return bad("breaker.close_after", "%d must be at least 1", b.CloseAfter)
	}
	return nil
}

// Config is one operator-configured documentation upstream. Zero fields
// take the defaults written beside them; SetDefaults sets them, and
// Validate checks the result. Its yaml tags (and Protection's, inline) are
// the keys of an upstream in coordd's configuration file.
type Config struct {
	// Name identifies the upstream in logs, metrics and metadata.
	Name string `yaml:"name"`
	// BaseURL is the scheme, host and optional base path that every url
	// fetched from this upstream, and every redirect followed, must be
	// under, segment by segment. A base path ending in "/" admits only
	// what is under that directory: "https://h/docs/" admits /docs/ and
	// /docs/x but not /docs, while "https://h/docs" admits /docs too. It
	// is canonicalized like a request url, and refused on the same path
	// tricks.
	BaseURL string `yaml:"base_url"`
	// TTL is a document's fresh lifetime. Default: 10m.
	TTL time.Duration `yaml:"ttl"`
	// StaleTTL is how long past TTL a copy may still be served stale.
	// Default: 24h. Negative: no stale window.
	StaleTTL time.Duration `yaml:"stale_ttl"`
	// Timeout bounds one upstream attempt, body included. Default: 10s.
	Timeout time.Duration `yaml:"timeout"`
	// MaxBodyBytes is the largest body accepted; a larger one fails the
	// call and is not cached. Default: 10 MiB.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// NegativeTTL is how long a 404 or 410 is cached. Default: 1m.
	NegativeTTL time.Duration `yaml:"negative_ttl"`
	// Credential, when set, is sent on every request to this upstream
	// (and on redirects, which are followed only within BaseURL). Callers
	// sharing it share fetches and cached copies; see docs/apis.md.
	Credential *Credential `yaml:"credential"`
	// RequestHeaders are sent on every request (User-Agent, a default
	// Accept, an API-version header). A forwarded header overrides one.
	RequestHeaders map[string]string `yaml:"request_headers"`
	// ForwardHeaders lists the request headers a caller may set (Accept,
	// Accept-Language, X-GitHub-Api-Version): they are sent upstream and
	// are part of the cache id. Every other header a caller sends is
	// dropped.
	ForwardHeaders []string `yaml:"forward_headers"`
	// CallerCredentials lets a call carry its own credential, sent in
	// CredentialHeader for that call's fetch and never stored. Default:
	// false (a call carrying one is refused).
	CallerCredentials bool `yaml:"caller_credentials"`
	// Protection configures retries, the breaker and the rate limit.
	Protection Protection `yaml:",inline"`

	base           *url.URL        // parsed BaseURL, canonical, its trailing "/" kept
	requestHeaders http.Header     // RequestHeaders, canonical
	forward        map[string]bool // ForwardHeaders, canonical
}

// Default is the upstream used when none is configured: MDN.
func Default() Config {
	return Config{Name: "mdn", BaseURL: "https://developer.mozilla.org"}
}

var upstreamName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$`)

// SetDefaults gives each zero field of u its default. A function, not a
// method: Config is coordinator.Upstream, whose users configure it and
// leave preparing it to the coordinator.
func SetDefaults(u *Config) {
	if u.TTL == 0 {
		u.TTL = 10 * time.Minute
	}
	if u.StaleTTL == 0 {
		u.StaleTTL = 24 * time.Hour
	}
	if u.StaleTTL < 0 {
		u.StaleTTL = 0
	}
	if u.Timeout == 0 {
		u.Timeout = 10 * time.Second
	}
	if u.MaxBodyBytes == 0 {
		u.MaxBodyBytes = 10 << 20
	}
	if u.NegativeTTL == 0 {
		u.NegativeTTL = time.Minute
	}
	u.Protection.setDefaults()
}

// Validate checks u, once defaulted, and prepares it for use. Its error
// names the bad field under field, the name the caller knows u by (such as
// "upstreams[0]"), as in "upstreams[0] (mdn).ttl".
func Validate(u *Config, field string) error {
	if !upstreamName.MatchString(u.Name) {
		return fmt.Errorf("%s.name: %q must match %s", field, u.Name, upstreamName)
	}
	field = fmt.Sprintf("%s (%s)", field, u.Name)
	b, err := url.Parse(u.BaseURL)
	if err != nil || (b.Scheme != "http" && b.Scheme != "https") || b.Host == "" || b.User != nil || b.RawQuery != "" || b.Fragment != "" {
		return fmt.Errorf("%s.base_url: %q must be an absolute http(s) URL without userinfo, query or fragment", field, u.BaseURL)
	}
	if b, err = CanonicalURL(u.BaseURL); err != nil {
		return fmt.Errorf("%s.base_url: %v", field, err)
	}
	u.base = b
	switch {
	case u.TTL < 0:
		return fmt.Errorf("%s.ttl: must not be negative", field)
	case u.Timeout < 0:
		return fmt.Errorf("%s.timeout: must not be negative", field)
	case u.MaxBodyBytes < 0:
		return fmt.Errorf("%s.max_body_bytes: must not be negative", field)
	case u.NegativeTTL < 0:
		return fmt.Errorf("%s.negative_ttl: must not be negative", field)
	}
	if err := prepareHeaders(u, field); err != nil {
		return err
	}
	return u.Protection.validate(field)
}
