package upstream

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"
)

func TestClassify(t *testing.T) {
	live, done := context.Background(), func() context.Context {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx
	}()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		code int
		err  error
		want outcome
	}{
		{"200", live, 200, nil, outcomeSuccess},
		{"304", live, 304, nil, outcomeSuccess},
		{"400", live, 400, nil, outcomeSuccess},
		{"403", live, 403, nil, outcomeSuccess},
		{"404", live, 404, nil, outcomeSuccess},
		{"429", live, 429, nil, outcomeFailure},
		{"500", live, 500, nil, outcomeFailure},
		{"501", live, 501, nil, outcomeSuccess},
		{"502", live, 502, nil, outcomeFailure},
		{"503", live, 503, nil, outcomeFailure},
		{"504", live, 504, nil, outcomeFailure},
		{"network error", live, 0, fmt.Errorf("%w: connection refused", ErrUnavailable), outcomeFailure},
		{"too large", live, 0, fmt.Errorf("%w: big", ErrTooLarge), outcomeNone},
		{"503 after cancel", done, 503, nil, outcomeNone},
		{"error after cancel", done, 0, fmt.Errorf("%w: context canceled", ErrUnavailable), outcomeNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var resp *Response
			if tc.err == nil {
				resp = &Response{StatusCode: tc.code, Header: http.Header{}}
			}
			if got, _ := classify(tc.ctx, resp, tc.err); got != tc.want {
				t.Errorf("got %v; want %v", got, tc.want)
			}
		})
	}
}

func TestBackoffDelayFullJitter(t *testing.T) {
	r := &RetryPolicy{BaseDelay: 100 * time.Millisecond, MaxDelay: 300 * time.Millisecond}
	for n, ceil := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 300 * time.Millisecond, 9: 300 * time.Millisecond} {
		var lo, hi time.Duration = ceil, 0
		for range 2000 {
			d := backoffDelay(r, n)
			if d < 0 || d > ceil {
				t.Fatalf("retry %d: delay %v outside [0, %v]", n, d, ceil)
			}
			lo, hi = min(lo, d), max(hi, d)
		}
		// Full jitter spreads over the whole range.
		if lo > ceil/10 || hi < ceil*9/10 {
			t.Errorf("retry %d: delays spread over [%v, %v]; want most of [0, %v]", n, lo, hi, ceil)
		}
	}
}

func TestRetryBudget(t *testing.T) {
	clk := newTestClock()
	for _, tc := range []struct {
		name      string
		ratio     float64
		minPerSec float64
		requests  int
		want      int // retries granted
	}{
		{"ratio only", 0.2, -1, 100, 20},
		{"floor only", -1, 0.5, 100, 5},
		{"ratio and floor", 0.2, 0.5, 100, 25},
		{"no requests, floor", 0.2, 1, 0, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newRetryBudget(RetryPolicy{BudgetRatio: tc.ratio, BudgetMinPerSec: tc.minPerSec})
			for range tc.requests {
				b.request(clk.Now())
			}
			got := 0
			for range 1000 {
				if b.tryRetry(clk.Now()) {
					got++
				}
			}
			if got != tc.want {
				t.Errorf("granted %d retries; want %d", got, tc.want)
			}
		})
	}
	t.Run("window slides", func(t *testing.T) {
		b := newRetryBudget(RetryPolicy{BudgetRatio: 0.5, BudgetMinPerSec: -1})
		for range 10 {
			b.request(clk.Now())
		}
		for range 5 {
			if !b.tryRetry(clk.Now()) {
				t.Fatal("budget refused a retry within the ratio")
			}
		}
		if b.tryRetry(clk.Now()) {
			t.Fatal("budget granted a retry beyond the ratio")
		}
		clk.Advance(budgetWindow * time.Second)
		if b.tryRetry(clk.Now()) {
			t.Error("budget granted a retry with no recent requests")
		}
		b.request(clk.Now())
		b.request(clk.Now())
		if !b.tryRetry(clk.Now()) {
			t.Error("old retries still count after the window")
		}
	})
}
