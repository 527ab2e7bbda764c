package coordinator

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/coordd/coordd/internal/secret"
	"github.com/coordd/coordd/internal/upstream"
)

// Upstream is one operator-configured documentation upstream (see
// upstream.Config). Zero fields take the defaults written beside them.
type Upstream = upstream.Config

// Protection configures how coordd protects one upstream (see
// upstream.Protection).
type Protection = upstream.Protection

// RetryPolicy configures retries (see upstream.RetryPolicy).
type RetryPolicy = upstream.RetryPolicy

// BreakerPolicy configures the circuit breaker (see upstream.BreakerPolicy).
type BreakerPolicy = upstream.BreakerPolicy

// MaxRedirects is the most redirects one fetch follows.
const MaxRedirects = upstream.MaxRedirects

// DefaultUpstream is the upstream used when none is configured: MDN.
func DefaultUpstream() Upstream { return upstream.Default() }

// Config configures a Coordinator. Zero fields take the defaults written
// beside them. Its yaml tags, and those of Upstream and Protection, are
// the keys of coordd's configuration file, which decodes straight into
// it; validation errors name fields by them ("upstreams[0] (mdn).ttl").
type Config struct {
	// Upstreams lists the upstreams callers may fetch from. Default: MDN
	// (DefaultUpstream).
	Upstreams []Upstream `yaml:"upstreams"`
	// L1MaxBytes bounds the in-memory cache. Default: 256 MiB.
	L1MaxBytes int64 `yaml:"l1_max_bytes"`
	// LockTTL is the lease of the cross-instance fill lock; a watchdog
	// extends it every LockTTL/3 while the fetch runs, and a holder that
	// dies or is cut off from Redis loses it at most LockTTL after its
	// last extension, when a follower elsewhere takes over. Shorter bounds
	// that wait; longer rides out longer Redis stalls (two extensions in a
	// row must fail for a live holder to lose it). Default: 2s.
	LockTTL time.Duration `yaml:"lock_ttl"`
	// RedisTimeout bounds each Redis operation on the request path, so that
	// no caller waits on a dead or frozen Redis. Default: 500ms.
	RedisTimeout time.Duration `yaml:"redis_timeout"`
	// RedisRetryInterval is how often a degraded coordinator probes Redis to
	// recover. Default: 500ms.
	RedisRetryInterval time.Duration `yaml:"redis_retry_interval"`
	// KeyPrefix prefixes every Redis key and channel. Default: "coordd:".
	KeyPrefix string `yaml:"key_prefix"`
	// ResultTTL is how long a leader keeps an uncacheable answer (a 403,
	// say) in Redis for followers on other instances. Default: 30s.
	ResultTTL time.Duration `yaml:"result_ttl"`
	// MaxAgeFloor is the smallest max_age honoured: a caller's shorter
	// max_age is raised to it, so that no caller can turn every call into
	// an upstream request. Default: 5s. Negative: no floor.
	MaxAgeFloor time.Duration `yaml:"max_age_floor"`
	// RefreshCooldown is how long, after a background refresh of a stale
	// copy failed, stale hits serve that copy without starting another
	// refresh. Default: 5s. Negative: none.
	RefreshCooldown time.Duration `yaml:"refresh_cooldown"`
	// InlineMaxBytes is the largest document (encoded) carried inside the
	// completion event, so that followers on other instances need no L2
	// read. Default: 32 KiB. Negative: never inline.
	InlineMaxBytes int `yaml:"inline_max_bytes"`
	// CredentialScopeKey keys the credential scope ids that documents
	// fetched with a credential are cached under (see Request), so that
	// every instance finds the same id and Redis holds nothing a
	// credential can be found from. Every instance sharing a Redis must
	// have the same one, of at least 16 bytes; required with Redis once
	// any upstream has a Credential or CallerCredentials (and for
	// tenants' credentials: the caller checks those). Default: drawn at
	// random in single-node mode.
	CredentialScopeKey secret.Value `yaml:"-"`
	// Logger receives structured logs. Default: slog.Default().
	Logger *slog.Logger `yaml:"-"`
	// Now is the clock. Default: time.Now.
	Now func() time.Time `yaml:"-"`
}

func (c *Config) setDefaults() {
	if len(c.Upstreams) == 0 {
		c.Upstreams = []Upstream{DefaultUpstream()}
	}
	if c.L1MaxBytes == 0 {
		c.L1MaxBytes = 256 << 20
	}
	if c.LockTTL == 0 {
		c.LockTTL = 2 * time.Second
	}
	if c.RedisTimeout == 0 {
		c.RedisTimeout = 500 * time.Millisecond
	}
	if c.RedisRetryInterval == 0 {
		c.RedisRetryInterval = 500 * time.Millisecond
	}
	if c.KeyPrefix == "" {
		c.KeyPrefix = "coordd:"
	}
	if c.ResultTTL == 0 {
		c.ResultTTL = 30 * time.Second
	}
	setDefault(&c.InlineMaxBytes, 32<<10)
	setDefault(&c.MaxAgeFloor, 5*time.Second)
	c.MaxAgeFloor = max(c.MaxAgeFloor, 0)
	setDefault(&c.RefreshCooldown, 5*time.Second)
	c.RefreshCooldown = max(c.RefreshCooldown, 0)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	ups := make([]Upstream, len(c.Upstreams)) // never alias the caller's slice
	copy(ups, c.Upstreams)
	c.Upstreams = ups
	for i := range c.Upstreams {
		upstream.SetDefaults(&c.Upstreams[i])
	}
}

// validate names every bad field of c, each error on its own
// (errors.Join), so that one run reports them all.
func (c *Config) validate() error {
	var errs []error
	seen := map[string]bool{}
	for i := range c.Upstreams {
		u := &c.Upstreams[i]
		field := fmt.Sprintf("upstreams[%d]", i)
		if seen[u.Name] {
			errs = append(errs, fmt.Errorf("%s.name: duplicate name %q", field, u.Name))
		}
		seen[u.Name] = true
		if err := upstream.Validate(u, field); err != nil {
			errs = append(errs, err)
		}
		if u.Credential != nil {
			if err := u.Credential.Load(fmt.Sprintf("%s (%s).credential", field, u.Name), c.Logger.With("component", "credentials")); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if k := c.CredentialScopeKey; !k.IsZero() && len(k.Reveal()) < 16 {
		errs = append(errs, fmt.Errorf("credential_scope_key: must be at least 16 bytes"))
	}
	if c.L1MaxBytes < 1<<20 {
		errs = append(errs, fmt.Errorf("l1_max_bytes: %d is below the 1 MiB minimum", c.L1MaxBytes))
	}
	if c.LockTTL < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("lock_ttl: %v is below the 100ms minimum", c.LockTTL))
	}
	if c.RedisTimeout < 0 {
		errs = append(errs, fmt.Errorf("redis_timeout: must not be negative"))
	}
	if strings.ContainsAny(c.KeyPrefix, "{}") {
		errs = append(errs, fmt.Errorf("key_prefix: %q must not contain { or }: coordd puts each key's id in a hash tag", c.KeyPrefix))
	}
	return errors.Join(errs...)
}

// Resolved returns c as New uses it: every zero field given its default,
// and checked. The error names every bad field by its key, each on its own
// (errors.Join); New returns the same. c's fields are left as they are,
// but for the upstreams' credentials, which it shares and loads, as New
// does (reading their values).
func (c Config) Resolved() (Config, error) {
	c.setDefaults()
	return c, c.validate()
}

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// NeedsScopeKey reports whether any upstream sends a credential or
// accepts callers' own: then, with Redis, CredentialScopeKey is required.
func (c *Config) NeedsScopeKey() bool {
	for _, u := range c.Upstreams {
		if u.Credential != nil || u.CallerCredentials {
			return true
		}
	}
	return false
}
