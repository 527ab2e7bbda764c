// Package metrics exports coordd's metrics to Prometheus: the
// coordinator's own (coordd_*), pushed through coordinator.Metrics and read
// from the Coordinator at scrape time, and the gRPC server's (grpc_server_*)
// from go-grpc-middleware's Prometheus provider.
//
// It lives under internal/ rather than in server/: it is wiring for the
// coordd binary (cmd/coordd) and its tests (internal/testing/fleettest), not part
// of the gRPC service, and keeping Prometheus out of server/ and
// coordinator/ leaves both usable without it. The metric names, listed in
// docs/observability.md and used by deploy/, are the contract; the Go API is not.
package metrics

import (
	"context"
	"net/http"
	"strconv"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"github.com/coordd/coordd/coordinator"
)

// Registry holds one coordd instance's metrics. It implements
// coordinator.Metrics; pass it in coordinator.Options, its ServerOptions
// to server.NewGRPC, then call Watch. It is safe for concurrent use.
type Registry struct {
	reg  *prometheus.Registry
	grpc *grpcprom.ServerMetrics

	requests         *prometheus.CounterVec        // source
	bySource         map[string]prometheus.Counter // requests' known sources, resolved once for the hit path; read-only
	followers        *prometheus.CounterVec        // scope
	followerLag      prometheus.Histogram
	upstream         *prometheus.CounterVec // upstream, status
	fetches          *prometheus.CounterVec // upstream
	retries          *prometheus.CounterVec // upstream
	transitions      *prometheus.CounterVec // upstream, scope, from, to
	rejected         *prometheus.CounterVec // upstream
	rateWait         *prometheus.HistogramVec
	rateRefused      *prometheus.CounterVec // upstream
	quotaRemaining   *prometheus.GaugeVec   // upstream, partition
	quotaReset       *prometheus.GaugeVec   // upstream, partition
	quotaIgnored     *prometheus.CounterVec // upstream, header
	quotaLimit       *prometheus.GaugeVec   // upstream, partition
	locks            *prometheus.CounterVec // outcome
	extensions       *prometheus.CounterVec // result
	timerWakeups     prometheus.Counter
	flights          prometheus.Gauge
	redisErrors      *prometheus.CounterVec // kind
	redisTransitions *prometheus.CounterVec // to
	httpRequests     *prometheus.CounterVec // code, method: the HTTP door's calls
	httpDuration     *prometheus.HistogramVec
	mcpCalls         *prometheus.CounterVec // server, tool
	mcpExecutions    *prometheus.CounterVec // server, tool
	mcpServed        *prometheus.CounterVec // server, tool, source
	mcpRetries       *prometheus.CounterVec // server
	mcpProcesses     *prometheus.GaugeVec   // server
	mcpRestarts      *prometheus.CounterVec // server
	mcpAbandoned     *prometheus.CounterVec // server, tool
}

var _ coordinator.Metrics = (*Registry)(nil)

// Label values known in advance, exported at 0 from the start so that
// rate() and the alerts see the first increase.
var (
	sources      = []string{"l1", "l2", "upstream", "stale", "canceled", "error"}
	scopes       = []string{"cluster", "instance"}
	lockOutcomes = []string{"acquired", "contended", "unavailable"}
	extResults   = []string{"ok", "lost", "error"}
	redisKinds   = []string{"reply", "unavailable"}
	// breakerMoves lists the breaker's state changes, as from → to.
	breakerMoves = [][2]string{{"closed", "open"}, {"open", "half-open"}, {"half-open", "open"}, {"half-open", "closed"}}
)

// lagBuckets span a push on loopback (well under a millisecond) to a
// struggling Redis (seconds).
var lagBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}

// New returns a Registry with the Go runtime's and the process's
// collectors, and coordd's metrics registered.
func New() *Registry {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	r := &Registry{
		reg: prometheus.NewRegistry(),
		grpc: grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(
			grpcprom.WithHistogramBuckets([]float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}))),
		requests:  counter("coordd_requests_total", "GetOrFetch calls answered, by source: l1, l2, upstream, stale (a stale copy from either tier), canceled (the caller canceled or went away first), error.", "source"),
		followers: counter("coordd_followers_total", "Waits for a fetch started by someone else: local (a call joined this instance's flight), remote (a flight waited for another instance's fill lock).", "scope"),
		followerLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "coordd_follower_lag_seconds",
			Help:    "For calls answered with a document fetched while they waited: time from the upstream's answer to the call's metadata.",
			Buckets: lagBuckets,
		}),
		upstream:    counter("coordd_upstream_requests_total", "HTTP attempts to an upstream, retries included, by status code (error: no answer).", "upstream", "status"),
		fetches:     counter("coordd_upstream_fetches_total", "Upstream fetches started by this instance's flights; each makes one or more attempts (coordd_upstream_requests_total).", "upstream"),
		retries:     counter("coordd_upstream_retries_total", "Retries of failed upstream attempts.", "upstream"),
		transitions: counter("coordd_breaker_transitions_total", "Circuit breaker state changes made by this instance, by scope (cluster: shared through Redis; instance: this instance's own).", "upstream", "scope", "from", "to"),
		rejected:    counter("coordd_breaker_rejected_total", "Fetches failed at once by an open circuit breaker.", "upstream"),
		rateWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "coordd_ratelimit_wait_seconds",
			Help:    "Waits for a rate-limit slot, or for the end of an upstream's Retry-After.",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"upstream"}),
		rateRefused: counter("coordd_ratelimit_refused_total", "Fetches refused because the next rate-limit slot started past the time they could wait.", "upstream"),
		quotaRemaining: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "coordd_upstream_quota_remaining",
			Help: "Requests left in an upstream's announced quota, by partition, summed over the credentials whose answers this instance saw last."}, []string{"upstream", "partition"}),
		quotaLimit: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "coordd_upstream_quota_limit",
			Help: "An upstream's announced quota per window, by partition, summed over the credentials whose answers this instance saw last (0: not said)."}, []string{"upstream", "partition"}),
		quotaReset: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "coordd_upstream_quota_reset_timestamp_seconds",
			Help: "When an upstream's announced quota resets, by partition (Unix time; the latest reset of the credentials summed in coordd_upstream_quota_remaining)."}, []string{"upstream", "partition"}),
		quotaIgnored:     counter("coordd_upstream_quota_ignored_total", "Upstream answers whose quota headers were garbage (a remaining over its limit, no limit, a reset past a day), ignored whole, by header family: RateLimit or X-RateLimit.", "upstream", "header"),
		locks:            counter("coordd_lock_attempts_total", "Attempts at a key's fill lock, by outcome: acquired, contended (another instance holds it), unavailable (Redis down or silent).", "outcome"),
		extensions:       counter("coordd_lock_extensions_total", "Lease extensions by the watchdog of a held fill lock, by result: ok, lost, error.", "result"),
		timerWakeups:     prometheus.NewCounter(prometheus.CounterOpts{Name: "coordd_timer_wakeups_total", Help: "Followers woken by the end of a lock lease instead of a push (a lock takeover); 0 unless a holder died or a push was lost."}),
		flights:          prometheus.NewGauge(prometheus.GaugeOpts{Name: "coordd_flights", Help: "Fills in progress on this instance."}),
		redisErrors:      counter("coordd_redis_errors_total", "Failed Redis operations, by kind: reply (Redis answered an error), unavailable (no answer in time, network error).", "kind"),
		redisTransitions: counter("coordd_redis_transitions_total", "Changes of Redis's health: to down (degraded: in-process coordination) or up.", "to"),
		httpRequests:     counter("coordd_http_requests_total", "Calls to the HTTP door (http_listen), by HTTP status code and method.", "code", "method"),
		httpDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "coordd_http_request_duration_seconds",
			Help:    "Time to answer a call to the HTTP door, body included.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"code", "method"}),
		mcpCalls:      counter("coordd_mcp_calls_total", "tools/call requests to the MCP gateway, by server and tool (the tool's name for a tool allowed to coalesce, other for the rest).", "server", "tool"),
		mcpExecutions: counter("coordd_mcp_executions_total", "Coalesced tool calls run on the server by this instance: calls less executions, summed over the fleet, are the calls coalesced or served from the cache.", "server", "tool"),
		mcpServed:     counter("coordd_mcp_served_total", "Coalesced tool calls answered, by source: l1, l2 (kept, or another instance's execution), upstream (an execution of this instance's).", "server", "tool", "source"),
		mcpRetries:    counter("coordd_mcp_retries_total", "Calls the gateway ran again after their connection to the server was lost.", "server"),
		mcpProcesses: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "coordd_mcp_processes",
			Help: "Live processes of a stdio MCP server (sessions with a remote one) on this instance."}, []string{"server"}),
		mcpRestarts:  counter("coordd_mcp_restarts_total", "Processes (or remote sessions) started again after one ended.", "server"),
		mcpAbandoned: counter("coordd_mcp_abandoned_total", "Coalesced tool calls this instance cancelled on the server because no caller was left on any instance.", "server", "tool"),
	}
	r.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		r.grpc,
		r.requests, r.followers, r.followerLag, r.upstream, r.fetches, r.retries, r.transitions, r.rejected,
		r.rateWait, r.rateRefused, r.quotaRemaining, r.quotaLimit, r.quotaReset, r.quotaIgnored, r.locks, r.extensions, r.timerWakeups, r.flights, r.redisErrors, r.redisTransitions,
		r.httpRequests, r.httpDuration,
		r.mcpCalls, r.mcpExecutions, r.mcpServed, r.mcpRetries, r.mcpProcesses, r.mcpRestarts, r.mcpAbandoned,
	)
	r.bySource = make(map[string]prometheus.Counter, len(sources))
	for _, v := range sources {
		r.bySource[v] = r.requests.WithLabelValues(v)
	}
	for _, v := range []string{"local", "remote"} {
		r.followers.WithLabelValues(v)
	}
	for _, v := range lockOutcomes {
		r.locks.WithLabelValues(v)
	}
	for _, v := range extResults {
		r.extensions.WithLabelValues(v)
	}
	for _, v := range redisKinds {
		r.redisErrors.WithLabelValues(v)
	}
	for _, v := range []string{"down", "up"} {
		r.redisTransitions.WithLabelValues(v)
	}
	return r
}

// MCPCall counts a tools/call to the gateway (gateway.Metrics).
func (r *Registry) MCPCall(server, tool string) { r.mcpCalls.WithLabelValues(server, tool).Inc() }

// MCPExecution counts a coalesced call run on its server.
func (r *Registry) MCPExecution(server, tool string) {
	r.mcpExecutions.WithLabelValues(server, tool).Inc()
}

// MCPServed counts a coalesced call answered, by source.
func (r *Registry) MCPServed(server, tool, source string) {
	r.mcpServed.WithLabelValues(server, tool, source).Inc()
}

// MCPRetry counts a call run again after a lost connection.
func (r *Registry) MCPRetry(server string) { r.mcpRetries.WithLabelValues(server).Inc() }

// MCPProcesses adds delta to a server's live processes.
func (r *Registry) MCPProcesses(server string, delta int) {
	r.mcpProcesses.WithLabelValues(server).Add(float64(delta))
}

// MCPRestart counts a process started again.
func (r *Registry) MCPRestart(server string) { r.mcpRestarts.WithLabelValues(server).Inc() }

// MCPAbandoned counts an execution cancelled with no caller left.
func (r *Registry) MCPAbandoned(server, tool string) {
	r.mcpAbandoned.WithLabelValues(server, tool).Inc()
}

// MCPServers exports the gateway's series of servers at 0 from the
// start, so that rate() and the alerts see the first increase.
func (r *Registry) MCPServers(names []string) {
	for _, n := range names {
		r.mcpRetries.WithLabelValues(n)
		r.mcpProcesses.WithLabelValues(n)
		r.mcpRestarts.WithLabelValues(n)
		r.mcpCalls.WithLabelValues(n, "other")
	}
}

// ServerOptions returns the options that make a gRPC server record
// grpc_server_* metrics. They use grpc.UnaryInterceptor and
// grpc.StreamInterceptor, which gRPC runs before every chained
// interceptor, so that the metrics count every call, those that
// server.NewGRPC's own interceptors refuse included.
func (r *Registry) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.UnaryInterceptor(r.grpc.UnaryServerInterceptor()),
		grpc.StreamInterceptor(r.grpc.StreamServerInterceptor()),
	}
}

// Watch exports the state of c (L1, Redis health, circuit breakers),
// read at each scrape, creates c's upstream series at 0, and
// creates s's grpc_server_* series at 0 for each of its methods. Call it
// once, after registering s's services.
func (r *Registry) Watch(c *coordinator.Coordinator, s *grpc.Server) {
	for _, up := range c.Upstreams() {
		r.fetches.WithLabelValues(up)
		r.retries.WithLabelValues(up)
		r.rejected.WithLabelValues(up)
		r.rateWait.WithLabelValues(up)
		r.rateRefused.WithLabelValues(up)
		for _, scope := range scopes {
			for _, m := range breakerMoves {
				r.transitions.WithLabelValues(up, scope, m[0], m[1])
			}
		}
	}
	r.reg.MustRegister(&stateCollector{c: c})
	if s != nil {
		r.grpc.InitializeMetrics(s)
	}
}

// WatchTLSCert exports coordd_tls_cert_not_after_seconds, read from
// notAfter at each scrape: when the certificate that the TLS listeners
// serve expires. Call it once, and only when serving TLS: without it the
// metric is absent, which leaves the expiry alert nothing to fire on.
func (r *Registry) WatchTLSCert(notAfter func() time.Time) {
	r.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "coordd_tls_cert_not_after_seconds",
		Help: "When the certificate served by the gRPC listener and the HTTP door expires (its leaf's NotAfter), in Unix seconds. Follows each certificate installed by a reload; absent without tls.",
	}, func() float64 { return float64(notAfter().Unix()) }))
}

// InstrumentHTTP wraps the HTTP door's handler so that it records
// coordd_http_requests_total and coordd_http_request_duration_seconds.
// Its calls also count in coordd_requests_total{source}, as gRPC calls do.
func (r *Registry) InstrumentHTTP(h http.Handler) http.Handler {
	return promhttp.InstrumentHandlerDuration(r.httpDuration, promhttp.InstrumentHandlerCounter(r.httpRequests, h))
}

// Handler serves the metrics in Prometheus's exposition formats.
func (r *Registry) Handler() http.Handler {
	return promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{Registry: r.reg})
}

// HTTPServer returns an HTTP server that serves Handler on /metrics.
func (r *Registry) HTTPServer() *http.Server {
	mux := http.NewServeMux()
	mux.Handle("/metrics", r.Handler())
	return &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
}

// Request implements coordinator.Metrics.
func (r *Registry) Request(source string) {
	if c, ok := r.bySource[source]; ok {
		c.Inc()
		return
	}
	r.requests.WithLabelValues(source).Inc()
}

// Follower implements coordinator.Metrics.
func (r *Registry) Follower(scope string) { r.followers.WithLabelValues(scope).Inc() }

// FollowerLag implements coordinator.Metrics.
func (r *Registry) FollowerLag(d time.Duration) { r.followerLag.Observe(d.Seconds()) }

// Fetch implements coordinator.Metrics.
func (r *Registry) Fetch(upstream string) { r.fetches.WithLabelValues(upstream).Inc() }

// UpstreamRequest implements coordinator.Metrics; status 0 is "error".
func (r *Registry) UpstreamRequest(upstream string, status int) {
	s := "error"
	if status > 0 {
		s = strconv.Itoa(status)
	}
	r.upstream.WithLabelValues(upstream, s).Inc()
}

// Retry implements coordinator.Metrics.
func (r *Registry) Retry(upstream string) { r.retries.WithLabelValues(upstream).Inc() }

// BreakerTransition implements coordinator.Metrics.
func (r *Registry) BreakerTransition(upstream, scope, from, to string) {
	r.transitions.WithLabelValues(upstream, scope, from, to).Inc()
}

// BreakerRejected implements coordinator.Metrics.
func (r *Registry) BreakerRejected(upstream string) { r.rejected.WithLabelValues(upstream).Inc() }

// RateLimitWait implements coordinator.Metrics.
func (r *Registry) RateLimitWait(upstream string, d time.Duration) {
	r.rateWait.WithLabelValues(upstream).Observe(d.Seconds())
}

// RateLimitRefused implements coordinator.Metrics.
func (r *Registry) RateLimitRefused(upstream string) { r.rateRefused.WithLabelValues(upstream).Inc() }

// UpstreamQuota implements coordinator.Metrics.
func (r *Registry) UpstreamQuota(upstream, partition string, remaining, limit int64, reset time.Time) {
	r.quotaRemaining.WithLabelValues(upstream, partition).Set(float64(remaining))
	r.quotaLimit.WithLabelValues(upstream, partition).Set(float64(limit))
	r.quotaReset.WithLabelValues(upstream, partition).Set(float64(reset.UnixMilli()) / 1000)
}

// UpstreamQuotaIgnored implements coordinator.Metrics.
func (r *Registry) UpstreamQuotaIgnored(upstream, header string) {
	r.quotaIgnored.WithLabelValues(upstream, header).Inc()
}

// Lock implements coordinator.Metrics.
func (r *Registry) Lock(outcome string) { r.locks.WithLabelValues(outcome).Inc() }

// LockExtension implements coordinator.Metrics.
func (r *Registry) LockExtension(result string) { r.extensions.WithLabelValues(result).Inc() }

// TimerWakeup implements coordinator.Metrics.
func (r *Registry) TimerWakeup() { r.timerWakeups.Inc() }

// Flights implements coordinator.Metrics.
func (r *Registry) Flights(delta int) { r.flights.Add(float64(delta)) }

// RedisError implements coordinator.Metrics.
func (r *Registry) RedisError(kind string) { r.redisErrors.WithLabelValues(kind).Inc() }

// RedisHealth implements coordinator.Metrics.
func (r *Registry) RedisHealth(up bool) {
	to := "down"
	if up {
		to = "up"
	}
	r.redisTransitions.WithLabelValues(to).Inc()
}

// breakerValue is coordd_breaker_state's value of each state.
var breakerValue = map[string]float64{"closed": 0, "half-open": 1, "open": 2}

// stateCollector reads a Coordinator's state at each scrape.
type stateCollector struct {
	c *coordinator.Coordinator
}

var (
	descL1Entries = prometheus.NewDesc("coordd_l1_entries", "Documents in the in-memory cache (L1).", nil, nil)
	descL1Bytes   = prometheus.NewDesc("coordd_l1_bytes", "Memory the in-memory cache (L1) has allocated, up to coordd_l1_max_bytes.", nil, nil)
	descL1Max     = prometheus.NewDesc("coordd_l1_max_bytes", "The in-memory cache's bound (l1_max_bytes).", nil, nil)
	descL1Evicted = prometheus.NewDesc("coordd_l1_evictions_total", "Documents dropped from L1, by reason: no_space (to make room), expired (past the longest lifetime configured).", []string{"reason"}, nil)
	descRedisUp   = prometheus.NewDesc("coordd_redis_up", "1 while Redis is believed up; 0 while degraded (L1 only, in-process coordination). Absent in single-node mode.", nil, nil)
	descBreaker   = prometheus.NewDesc("coordd_breaker_state", "Circuit breaker state: 0 closed, 1 half-open, 2 open. scope cluster: the breaker shared through Redis (absent while Redis is down); instance: this instance's own (single-node mode, Redis down).", []string{"upstream", "scope"}, nil)
)

func (s *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descL1Entries, descL1Bytes, descL1Max, descL1Evicted, descRedisUp, descBreaker} {
		ch <- d
	}
}

func (s *stateCollector) Collect(ch chan<- prometheus.Metric) {
	l1 := s.c.L1Stats()
	ch <- prometheus.MustNewConstMetric(descL1Entries, prometheus.GaugeValue, float64(l1.Entries))
	ch <- prometheus.MustNewConstMetric(descL1Bytes, prometheus.GaugeValue, float64(l1.Bytes))
	ch <- prometheus.MustNewConstMetric(descL1Max, prometheus.GaugeValue, float64(l1.MaxBytes))
	ch <- prometheus.MustNewConstMetric(descL1Evicted, prometheus.CounterValue, float64(l1.Evicted), "no_space")
	ch <- prometheus.MustNewConstMetric(descL1Evicted, prometheus.CounterValue, float64(l1.Expired), "expired")
	if s.c.RedisConfigured() {
		up := 0.0
		if s.c.RedisHealthy() {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(descRedisUp, prometheus.GaugeValue, up)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, b := range s.c.Breakers(ctx) {
		ch <- prometheus.MustNewConstMetric(descBreaker, prometheus.GaugeValue, breakerValue[b.State], b.Upstream, b.Scope)
	}
}
