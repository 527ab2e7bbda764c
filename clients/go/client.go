// Package coordd is the Go client of coordd, the service that stops cache
// stampedes on documentation upstreams.
//
// A Client calls coordd's CoordinatorService over one gRPC channel that
// spreads calls round-robin across every address its target resolves to,
// keeps connections alive, and puts a deadline on every call. Around each
// call it retries what is worth retrying (UNAVAILABLE and RESOURCE_EXHAUSTED,
// with capped exponential backoff, full jitter and gRPC's retry throttling)
// and fails fast with ErrCircuitOpen while coordd cannot be reached.
//
//	c, err := coordd.Dial("coordd.internal:50051")
//	if err != nil { ... }
//	defer c.Close()
//	doc, err := c.Get(ctx, "https://developer.mozilla.org/en-US/docs/Web/HTTP/index.json")
//
// For a coordd with tenants and a TLS listener, add WithToken and WithTLS.
//
// NewTransport makes the Client an http.RoundTripper, so that any library
// taking an *http.Client reads its upstream through coordd:
//
//	hc := &http.Client{Transport: coordd.NewTransport(c)}
package coordd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/health" // registers client-side health checking, used by the service config
	"google.golang.org/grpc/keepalive"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
)

// Errors returned by the Client, besides gRPC status errors (inspect those
// with status.Code).
var (
	// ErrUnreachable reports that no coordd answered: the connection was
	// refused or cut, no address resolved, no instance was healthy, or
	// nothing came back before the deadline. Such an error also wraps the
	// gRPC status error (UNAVAILABLE or DEADLINE_EXCEEDED). An error that
	// coordd sent, such as UNAVAILABLE for an upstream that is down, does
	// not wrap it.
	ErrUnreachable = errors.New("coordd: unreachable")
	// ErrCircuitOpen reports a call refused without touching the network
	// because coordd was found unreachable: the circuit breaker is open, or
	// half-open with its one probe call already in flight. It wraps
	// ErrUnreachable, and the error returned also wraps the last failure
	// seen, so status.Code reports UNAVAILABLE.
	ErrCircuitOpen = fmt.Errorf("%w; circuit breaker open", ErrUnreachable)
	// ErrBadStream reports a GetOrFetch stream that broke the protocol:
	// progress after metadata, a second metadata, a chunk before metadata,
	// no metadata, a negative size, or a body whose length differs from the
	// metadata's size (a body longer than that fails as soon as its excess
	// arrives). It is not retried.
	ErrBadStream = errors.New("coordd: malformed GetOrFetch stream")
	// ErrBodyTooLarge reports a document whose metadata announces a body
	// larger than WithMaxBodyBytes allows. Get fails as soon as the
	// metadata arrives, before any chunk, and cancels the stream, so that
	// coordd stops sending. It is not retried.
	ErrBodyTooLarge = errors.New("coordd: body too large")
)

// serviceConfig spreads calls over every resolved address and leaves out
// the instances whose health service reports NOT_SERVING, as a draining
// coordd does before it stops.
const serviceConfig = `{
	"loadBalancingConfig": [{"round_robin": {}}],
	"healthCheckConfig": {"serviceName": "coordd.v1.CoordinatorService"}
}`

// DefaultTimeout is the deadline given to a call whose context has none.
const DefaultTimeout = 30 * time.Second

// Client is a coordd client. It is safe for concurrent use; Close releases
// its connections.
type Client struct {
	cc      *grpc.ClientConn
	api     coorddv1.CoordinatorServiceClient
	target  string
	timeout time.Duration // for calls whose context has no deadline; 0: none
	maxBody int64         // the largest body Get accepts; 0: no limit
	retry   RetryPolicy   // defaults applied
	bucket  *throttle     // nil: retries are not throttled
	breaker *breaker
}

// Option configures Dial.
type Option func(*options)

type options struct {
	timeout  time.Duration
	maxBody  int64
	retry    RetryPolicy
	breaker  BreakerPolicy
	dialOpts []grpc.DialOption
	token    string
	tls      *tls.Config // nil: plaintext
}

// WithTimeout sets the deadline of a call whose context has none; it covers
// every attempt of the call, backoff included. Default: DefaultTimeout
// (30s). Zero or negative: no deadline beyond the context's.
func WithTimeout(d time.Duration) Option {
	return func(o *options) { o.timeout = max(d, 0) }
}

// WithMaxBodyBytes makes Get refuse a document whose body is larger than n
// bytes, with ErrBodyTooLarge, before receiving any of it: for a caller
// that cannot hold more in memory. Default: 0, no limit.
func WithMaxBodyBytes(n int64) Option {
	return func(o *options) { o.maxBody = max(n, 0) }
}

// WithRetryPolicy sets how failed attempts are retried. Zero fields take
// their defaults.
func WithRetryPolicy(p RetryPolicy) Option {
	return func(o *options) { o.retry = p }
}

// WithBreakerPolicy sets when the circuit breaker around coordd opens and
// for how long. Zero fields take their defaults.
func WithBreakerPolicy(p BreakerPolicy) Option {
	return func(o *options) { o.breaker = p }
}

// WithToken sends token on every call as "authorization: Bearer <token>",
// for a coordd that requires one (its tenants). Without WithTLS the token
// crosses the network in clear text, as on a private network. Default: no
// token, for a coordd without tenants.
func WithToken(token string) Option {
	return func(o *options) { o.token = token }
}

// WithTLS dials coordd over TLS configured by cfg: RootCAs for a private
// CA, Certificates for a coordd that requires client certificates (mutual
// TLS). A nil cfg uses the system's roots and no client certificate.
// Default: plaintext.
func WithTLS(cfg *tls.Config) Option {
	return func(o *options) {
		if cfg == nil {
			cfg = &tls.Config{}
		}
		o.tls = cfg.Clone()
	}
}

// WithDialOptions appends gRPC dial options after the Client's own, so they
// win: transport credentials (the default is insecure, for a coordd on a
// private network; see also WithTLS), a resolver, interceptors. A stream interceptor sees
// GetOrFetch's received messages as values of an unexported type, not
// *coorddv1.GetOrFetchResponse: Get decodes chunks itself, copying their
// data straight into the document's body.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOpts = append(o.dialOpts, opts...) }
}

// The flow-control windows Dial sets: per stream, and per connection.
const (
	streamWindow = 1 << 20
	connWindow   = 8 << 20
)

// Dial returns a Client for the coordd instances target names. A target
// without a scheme, such as "coordd.internal:50051" or "127.0.0.1:50051",
// is resolved through DNS ("dns:///coordd.internal:50051"), and every
// address it resolves to gets a connection; calls go round-robin across
// those that are healthy. Any other gRPC target (with a scheme) is used as
// it is.
//
// Dial does no I/O: connections are made on first use and re-made in the
// background, so an unreachable coordd shows up as call errors, not here.
func Dial(target string, opts ...Option) (*Client, error) {
	o := options{timeout: DefaultTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	retry := o.retry.withDefaults()
	if err := retry.validate(); err != nil {
		return nil, err
	}
	target = normalizeTarget(target)
	dialOpts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(serviceConfig),
		// Flow-control windows fixed rather than estimated. grpc-go grows
		// a connection's window from its bandwidth-delay estimate only on
		// a sample that sets a new bandwidth peak, so a connection that
		// once measured a spurious peak keeps the 64 KiB default, and
		// every larger document waits halfway for a window update: warm
		// 100 KiB hits ran at 43–81% of their speed on such a connection
		// (docs/performance.md). Get reads whole documents; the
		// connection's window bounds what all its streams buffer.
		grpc.WithInitialWindowSize(streamWindow),
		grpc.WithInitialConnWindowSize(connWindow),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time:                30 * time.Second, // ping a quiet connection after this (coordd allows every 10s)
			Timeout:             10 * time.Second, // and drop it if no ack by then
			PermitWithoutStream: true,             // so that idle connections to a dead instance are noticed
		}),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  time.Second, // first reconnect to a failed instance
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   10 * time.Second, // a restarted coordd is found within ~10s, not gRPC's default 120s
			},
			MinConnectTimeout: 5 * time.Second,
		}),
		grpc.WithStatsHandler(answerRecorder{}), // tells the breaker whether coordd answered
	}
	if o.tls != nil {
		dialOpts[0] = grpc.WithTransportCredentials(credentials.NewTLS(o.tls))
	}
	if o.token != "" {
		dialOpts = append(dialOpts, grpc.WithPerRPCCredentials(bearerToken(o.token)))
	}
	cc, err := grpc.NewClient(target, append(dialOpts, o.dialOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("coordd: dial %s: %w", target, err)
	}
	c := &Client{
		cc:      cc,
		api:     coorddv1.NewCoordinatorServiceClient(cc),
		target:  target,
		timeout: o.timeout,
		maxBody: o.maxBody,
		retry:   retry,
		bucket:  newThrottle(retry.MaxTokens, retry.TokenRatio),
		breaker: newBreaker(target, o.breaker),
	}
	return c, nil
}

// bearerToken is per-RPC credentials sending a bearer token. Hand-rolled
// because grpc's oauth credentials refuse a plaintext connection, which a
// coordd on a private network may use.
type bearerToken string

func (b bearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearerToken) RequireTransportSecurity() bool { return false }

// normalizeTarget prefixes a target without a scheme with dns:///.
func normalizeTarget(target string) string {
	if strings.Contains(target, "://") || strings.HasPrefix(target, "unix:") || strings.HasPrefix(target, "unix-abstract:") {
		return target
	}
	return "dns:///" + target
}

// Target returns the gRPC target the Client dials, e.g. "dns:///127.0.0.1:50051".
func (c *Client) Target() string { return c.target }

// Close closes the Client's connections. Calls in flight fail with
// codes.Canceled.
func (c *Client) Close() error {
	return c.cc.Close()
}

// CallOption configures one call.
type CallOption func(*callOptions)

type callOptions struct {
	key      string
	noStale  bool
	maxAge   time.Duration
	priority coorddv1.Priority
	progress func(*coorddv1.Progress)
}

// WithKey sets the cache key of the document instead of the canonical form
// of its url.
func WithKey(key string) CallOption {
	return func(o *callOptions) { o.key = key }
}

// NoStale refuses stale copies: Get waits for a fresh document or fails,
// instead of being served stale-while-revalidate or stale-if-error.
func NoStale() CallOption {
	return func(o *callOptions) { o.noStale = true }
}

// MaxAge makes Get refuse copies fetched from the upstream more than d
// before the call, fresh or stale: coordd fetches a newer one (once, shared
// with every other caller who needs it).
func MaxAge(d time.Duration) CallOption {
	return func(o *callOptions) { o.maxAge = d }
}

// The priorities of a call (GetOrFetchRequest.priority), for WithPriority
// and WithDefaultPriority.
const (
	// Interactive: a caller is waiting on the call. A call without
	// WithPriority is interactive too.
	Interactive = coorddv1.Priority_PRIORITY_INTERACTIVE
	// Background: no one is waiting on the call (a prefetch, a warm-up
	// job). Within its tenant, a fetch that only background calls wait for
	// takes the upstream's slots after every fetch an interactive call
	// waits for; a background call that joins a fetch an interactive one
	// waits for shares it as any call does.
	Background = coorddv1.Priority_PRIORITY_BACKGROUND
)

// WithPriority sets the call's priority: Interactive or Background.
// Default: none sent, which coordd takes for Interactive. coordd refuses a
// value it does not know with INVALID_ARGUMENT.
func WithPriority(p coorddv1.Priority) CallOption {
	return func(o *callOptions) { o.priority = p }
}

// WithProgress makes Get call f with every progress event as it arrives,
// from the goroutine that called Get. When Get retries, f also sees the
// events of the failed attempts.
func WithProgress(f func(*coorddv1.Progress)) CallOption {
	return func(o *callOptions) { o.progress = f }
}

func newCallOptions(opts []CallOption) callOptions {
	var o callOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// withDeadline gives ctx the Client's default deadline if it has none.
func (c *Client) withDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok || c.timeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, c.timeout)
}
