package upstream

import (
	"time"

	"github.com/coordd/coordd/internal/observe"
)

// Stage is what a fetch is waiting for, as its Events tell: one of
// StageRateLimited, StageRetrying and StageBreakerOpen, which the
// coordinator passes on to its callers as they are.
type Stage = observe.Stage

// The Stages of a fetch.
const (
	StageRateLimited = observe.StageRateLimited // waiting for a rate-limit slot, or the upstream's backoff
	StageRetrying    = observe.StageRetrying    // a retry is scheduled
	StageBreakerOpen = observe.StageBreakerOpen // the upstream's breaker is open
)

// Event tells the caller of a fetch what it waits for.
type Event struct {
	Stage   Stage
	Detail  string
	Attempt int           // attempt number, for StageRetrying
	Wait    time.Duration // expected wait, when known
}

// Metrics observes a Client: its UpstreamRequest, Retry, Breaker* and
// RateLimit* events.
type Metrics = observe.Metrics

// orNop returns m, or a Metrics that does nothing if m is nil.
func orNop(m Metrics) Metrics { return observe.OrNop(m) }

// statusOf is resp's status code; 0 without a response.
func statusOf(resp *Response) int {
	if resp == nil {
		return 0
	}
	return resp.StatusCode
}
