package upstream

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"
)

// The retry loop itself lives in Client.Fetch. It is hand-rolled rather
// than failsafe-go's retrypolicy: each attempt must pass the shared guard
// (one Redis script) anyway, the backoff wanted is full jitter (failsafe's
// jitter is ± a factor), and failsafe's budget bounds concurrent retries,
// not retries as a share of recent requests, so it admits every retry of a
// sequential caller.

// outcome is what an attempt says about the upstream's health.
type outcome int

const (
	outcomeSuccess outcome = iota // the upstream answered
	outcomeFailure                // a retryable failure: it counts against the breaker
	outcomeNone                   // nothing learnt: the attempt did not run, or was cut short by us
)

// retryable reports whether the caller's fetch is tried again after an
// attempt judged o that answered resp: a failure, or a rate-limited 403
// (a quota spent, waited out as a 429 is, but counted against no breaker).
func retryable(o outcome, resp *Response) bool {
	return o == outcomeFailure || o == outcomeNone && resp != nil && resp.StatusCode == http.StatusForbidden && RateLimited(resp)
}

// classify judges an attempt: failures are connection errors, timeouts,
// 429 and 5xx other than 501. why names the failure for progress events.
// An attempt cut short by the end of ctx says nothing of the upstream.
func classify(ctx context.Context, resp *Response, err error) (o outcome, why string) {
	switch {
	case ctx.Err() != nil:
		return outcomeNone, "cancellation"
	case err != nil && errors.Is(err, ErrUnavailable):
		return outcomeFailure, "a network error"
	case err != nil: // too large: an answer, but not one to judge by
		return outcomeNone, err.Error()
	case resp.StatusCode == http.StatusForbidden && RateLimited(resp):
		// A quota spent, not a sick upstream: backed off (Backoff), not
		// counted against the breaker.
		return outcomeNone, "a rate limit (403)"
	case resp.StatusCode == http.StatusTooManyRequests,
		resp.StatusCode >= 500 && resp.StatusCode != http.StatusNotImplemented:
		return outcomeFailure, fmt.Sprintf("status %d", resp.StatusCode)
	}
	return outcomeSuccess, ""
}

// backoffDelay is the sleep before retry n (1 for the first retry):
// uniformly random in [0, min(MaxDelay, BaseDelay·2^(n-1))], "full jitter",
// so that the retries of many flights do not arrive together.
func backoffDelay(r *RetryPolicy, n int) time.Duration {
	ceil := r.MaxDelay
	if n-1 < 32 && r.BaseDelay<<(n-1) < ceil {
		ceil = r.BaseDelay << (n - 1)
	}
	if ceil <= 0 {
		return 0
	}
	return rand.N(ceil + 1)
}

// budgetWindow is the span, in one-second buckets, over which a retry
// budget counts requests and retries.
const budgetWindow = 10

// retryBudget bounds an instance's retries to a share of its recent
// requests, plus a small floor, as Finagle's RetryBudget and Envoy's retry
// budgets do: once an upstream fails often, retries stop adding load to it.
// Each instance keeps its own; as a share, it holds for the cluster too.
// It is safe for concurrent use.
type retryBudget struct {
	ratio     float64 // retries allowed per request
	minPerSec float64 // retries allowed per second whatever the ratio

	mu      sync.Mutex // protects buckets
	buckets [budgetWindow]budgetBucket
}

type budgetBucket struct {
	sec      int64 // unix second the counts belong to
	requests int
	retries  int
}

func newRetryBudget(r RetryPolicy) *retryBudget {
	return &retryBudget{ratio: max(r.BudgetRatio, 0), minPerSec: max(r.BudgetMinPerSec, 0)}
}

// bucket returns now's bucket, emptied if it held an older second. b.mu
// must be held.
func (b *retryBudget) bucket(now time.Time) *budgetBucket {
	s := now.Unix()
	k := &b.buckets[uint64(s)%budgetWindow]
	if k.sec != s {
		*k = budgetBucket{sec: s}
	}
	return k
}

// request counts a fetch (its first attempt).
func (b *retryBudget) request(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.bucket(now).requests++
}

// tryRetry takes a retry from the budget, and reports false if none is
// left.
func (b *retryBudget) tryRetry(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := now.Unix()
	var requests, retries int
	for _, k := range b.buckets {
		if k.sec > s-budgetWindow && k.sec <= s {
			requests += k.requests
			retries += k.retries
		}
	}
	if float64(retries+1) > b.ratio*float64(requests)+b.minPerSec*budgetWindow {
		return false
	}
	b.bucket(now).retries++
	return true
}
