package upstream

import (
	"testing"
	"time"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 10, 21, 7, 28, 0, 0, time.UTC)
	const clamped = maxRetryAfterSecs * time.Second
	for _, tc := range []struct {
		v      string
		want   time.Duration
		wantOK bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{"120", 2 * time.Minute, true},
		{" 120 ", 2 * time.Minute, true},
		{"2147483648", clamped, true},              // 1<<31: the largest kept as is
		{"9223372037", clamped, true},              // overflowed to a negative Duration
		{"99999999999999999999999", clamped, true}, // beyond int64
		{"-1", 0, false},
		{"+5", 0, false},
		{"5s", 0, false},
		{"1.5", 0, false},
		{"Wed, 21 Oct 2026 07:29:00 GMT", time.Minute, true},
		{"Wed, 21 Oct 2026 07:27:00 GMT", 0, true}, // past
		{"soon", 0, false},
	} {
		got, ok := parseRetryAfter(tc.v, now)
		if got != tc.want || ok != tc.wantOK {
			t.Errorf("parseRetryAfter(%q) = %v, %v; want %v, %v", tc.v, got, ok, tc.want, tc.wantOK)
		}
	}
}
