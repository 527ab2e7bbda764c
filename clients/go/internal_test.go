package coordd

import (
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

func TestNormalizeTarget(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"host and port", "coordd.internal:50051", "dns:///coordd.internal:50051"},
		{"ipv4", "127.0.0.1:50051", "dns:///127.0.0.1:50051"},
		{"ipv6", "[::1]:50051", "dns:///[::1]:50051"},
		{"dns kept", "dns:///coordd:50051", "dns:///coordd:50051"},
		{"dns with authority kept", "dns://8.8.8.8/coordd:50051", "dns://8.8.8.8/coordd:50051"},
		{"custom scheme kept", "static:///a,b", "static:///a,b"},
		{"unix kept", "unix:/run/coordd.sock", "unix:/run/coordd.sock"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := normalizeTarget(tt.in); got != tt.want {
				t.Errorf("normalizeTarget(%q) = %q; want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestBackoffFullJitter(t *testing.T) {
	p := RetryPolicy{InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second}.withDefaults()
	bounds := []time.Duration{100, 200, 400, 800, 1000, 1000, 1000}
	for i, bound := range bounds {
		bound *= time.Millisecond
		n := i + 1
		var top time.Duration
		for range 1000 {
			d := p.backoff(n)
			if d < 0 || d >= bound {
				t.Fatalf("backoff(%d) = %v; want in [0, %v)", n, d, bound)
			}
			top = max(top, d)
		}
		// Full jitter spreads over the whole range: with 1000 draws, the
		// chance that none lands in the top half is 2^-1000.
		if top < bound/2 {
			t.Errorf("backoff(%d): largest of 1000 draws is %v; want some above %v", n, top, bound/2)
		}
	}
}

func TestThrottle(t *testing.T) {
	// maxTokens 10, ratio 0.1: retries allowed while tokens > 5.
	th := newThrottle(10, 0.1)
	var got []bool
	for range 7 {
		got = append(got, th.failure())
	}
	want := []bool{true, true, true, true, false, false, false} // 9 8 7 6 5 4 3
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("failure %d allowed a retry: %v; want %v (all: %v)", i+1, got[i], want[i], got)
		}
	}
	// Tokens are at 3; 30 successes refill to 6, just above the half.
	for range 29 {
		th.success()
	}
	if th.failure() { // 5.9 - 1 = 4.9
		t.Errorf("retry allowed after 29 successes; want throttled")
	}
	for range 22 { // 4.9 + 2.2 = 7.1
		th.success()
	}
	if !th.failure() { // 6.1
		t.Errorf("retry throttled after the bucket refilled; want allowed")
	}
	// The bucket never holds more than maxTokens, nor less than zero.
	for range 1000 {
		th.success()
	}
	if th.tokens != 10 {
		t.Errorf("tokens after many successes = %v; want 10", th.tokens)
	}
	for range 1000 {
		th.failure()
	}
	if th.tokens != 0 {
		t.Errorf("tokens after many failures = %v; want 0", th.tokens)
	}
	if newThrottle(-1, 0.1) != nil || !(*throttle)(nil).failure() {
		t.Errorf("negative MaxTokens: want no throttling")
	}
}

func TestRetryable(t *testing.T) {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		want := c == codes.Unavailable || c == codes.ResourceExhausted
		if got := retryable(c); got != want {
			t.Errorf("retryable(%v) = %v; want %v", c, got, want)
		}
	}
}

func TestRetryPolicyValidate(t *testing.T) {
	tests := []struct {
		name string
		p    RetryPolicy
		ok   bool
	}{
		{"defaults", RetryPolicy{}, true},
		{"no retries", RetryPolicy{MaxAttempts: 1}, true},
		{"negative attempts", RetryPolicy{MaxAttempts: -1}, false},
		{"max below initial", RetryPolicy{InitialBackoff: time.Second, MaxBackoff: time.Millisecond}, false},
		{"shrinking multiplier", RetryPolicy{Multiplier: 0.5}, false},
		{"negative ratio", RetryPolicy{TokenRatio: -1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.withDefaults().validate()
			if (err == nil) != tt.ok {
				t.Errorf("validate() = %v; want ok %v", err, tt.ok)
			}
		})
	}
}

func TestRetryDelayFromRetryInfo(t *testing.T) {
	st, err := status.New(codes.Unavailable, "breaker open").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(300 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	if got := retryDelay(st.Err()); got != 300*time.Millisecond {
		t.Fatalf("retryDelay = %v; want 300ms", got)
	}
	if got := retryDelay(status.Error(codes.Unavailable, "x")); got != 0 {
		t.Fatalf("retryDelay without details = %v; want 0", got)
	}
	huge, _ := status.New(codes.Unavailable, "x").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Hour)})
	if got := retryDelay(huge.Err()); got != maxRetryDelay {
		t.Fatalf("retryDelay = %v; want the %v cap", got, maxRetryDelay)
	}
}
