package upstream

import "time"

// Stage is what a fetch is waiting for, as its Events tell.
type Stage int

// Stages; the coordinator passes each on to its callers as the Stage of
// the same name.
const (
	StageRateLimited Stage = iota + 1 // waiting for a rate-limit slot, or the upstream's backoff
	StageRetrying                     // a retry is scheduled
	StageBreakerOpen                  // the upstream's breaker is open
)

// Event tells the caller of a fetch what it waits for.
type Event struct {
	Stage   Stage
	Detail  string
	Attempt int           // attempt number, for StageRetrying
	Wait    time.Duration // expected wait, when known
}

// Metrics observes a Client; coordinator.Metrics satisfies it. Its
// methods must be fast, must not block, and must be safe for concurrent
// use.
type Metrics interface {
	// UpstreamRequest counts one HTTP attempt by the status code answered;
	// 0 when none was.
	UpstreamRequest(upstream string, status int)
	// Retry counts a retry about to be attempted.
	Retry(upstream string)
	// BreakerTransition counts a breaker state change: scope "cluster"
	// or "instance"; from and to "closed", "half-open" or "open".
	BreakerTransition(upstream, scope, from, to string)
	// BreakerRejected counts a fetch failed at once by an open breaker.
	BreakerRejected(upstream string)
	// RateLimitWait observes a wait for a slot or for a Retry-After.
	RateLimitWait(upstream string, d time.Duration)
	// RateLimitRefused counts a fetch whose slot started past its wait
	// bound.
	RateLimitRefused(upstream string)
}

type nopMetrics struct{}

func (nopMetrics) UpstreamRequest(string, int)         {}
func (nopMetrics) Retry(string)                        {}
func (nopMetrics) BreakerTransition(_, _, _, _ string) {}
func (nopMetrics) BreakerRejected(string)              {}
func (nopMetrics) RateLimitWait(string, time.Duration) {}
func (nopMetrics) RateLimitRefused(string)             {}

// orNop returns m, or a Metrics that does nothing if m is nil.
func orNop(m Metrics) Metrics {
	if m == nil {
		return nopMetrics{}
	}
	return m
}

// statusOf is resp's status code; 0 without a response.
func statusOf(resp *Response) int {
	if resp == nil {
		return 0
	}
	return resp.StatusCode
}
