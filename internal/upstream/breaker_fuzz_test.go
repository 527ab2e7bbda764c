package upstream

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coordd/coordd/internal/observe"
)

// FuzzBreakerGoVsLua is a differential test of the guard's two
// implementations of one state machine: breaker and gcra in Go
// (localGuard), admitScript and recordScript in Lua (sharedGuard, through
// a real redis-server). Each input is a policy and a sequence of
// operations — admit, record an admitted attempt's outcome (with or
// without a Retry-After backoff), advance the clock — fed to both guards
// on one clock; every verdict, wait, generation, probe slot, breaker
// state and transition must agree. The scripts take the time from ARGV
// (the sharedGuard's clock) in microseconds, so the clock moves by whole
// microseconds and every policy duration is a whole number of them: finer
// differences are the scripts' resolution, not a divergence.
//
// go test runs the seeds in testdata/fuzz/FuzzBreakerGoVsLua; to search:
//
//	go test -fuzz FuzzBreakerGoVsLua -fuzztime 60s ./internal/upstream
func FuzzBreakerGoVsLua(f *testing.F) {
	st := testStore(f) // skips under -short: it needs redis-server
	var keys atomic.Int64
	f.Fuzz(func(t *testing.T, policy, ops []byte) {
		up := fuzzConfig(policy)
		up.Protection.setDefaults()
		if err := up.Protection.validate("fuzz"); err != nil {
			t.Skip(err)
		}
		clk := newTestClock()
		var lm, sm transitions
		local := newLocalGuard(up, false, clk.Now, quietLogger(), &lm)
		sharedUp := *up
		sharedUp.Name = fmt.Sprintf("fuzz%d", keys.Add(1)) // a fresh hash per input
		shared := newSharedGuard(st, &sharedUp, clk.Now, quietLogger(), &sm)

		type pair struct{ l, s admission }
		var pending []pair // admitted attempts whose outcome is still to come
		var trace []string // what happened, for the failure message
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("policy %+v, after\n\t%s\n"+format, append([]any{up.Protection, strings.Join(trace, "\n\t")}, args...)...)
		}
		admit := func(maxWait time.Duration) (pair, bool) {
			l := local.admit(maxWait, quotaAsk{})
			s, err := shared.admit(t.Context(), maxWait, quotaAsk{})
			if err != nil {
				t.Fatalf("shared admit: %v", err)
			}
			trace = append(trace, fmt.Sprintf("admit(maxWait %v) = %v", maxWait, l))
			if l.verdict != s.verdict || l.wait != s.wait || l.backoff != s.backoff || l.gen != s.gen || l.probe != s.probe {
				fail("admit: Go %+v; Lua %+v", l, s)
			}
			return pair{l, s}, l.verdict == verdictAdmitted
		}
		record := func(p pair, o outcome, backoff time.Duration) {
			trace = append(trace, fmt.Sprintf("record(gen %d, probe %d, %v, backoff %v)", p.l.gen, p.l.probe, [...]string{"success", "failure", "none"}[o], backoff))
			local.record(p.l, o, backoff, quotaNote{})
			shared.record(t.Context(), p.s, o, backoff, quotaNote{})
		}
		for len(ops) >= 2 {
			op, arg := ops[0], ops[1]
			ops = ops[2:]
			switch op % 4 {
			case 0: // admit an attempt, whose outcome comes later
				if p, ok := admit(fuzzWaits[arg%byte(len(fuzzWaits))]); ok {
					pending = append(pending, p)
				}
			case 1: // the outcome of an attempt admitted earlier
				if len(pending) == 0 {
					continue
				}
				i := int(arg) % len(pending)
				p := pending[i]
				pending = append(pending[:i], pending[i+1:]...)
				var backoff time.Duration
				if op&0x30 == 0x30 {
					backoff = time.Duration(arg>>2) * 10 * time.Millisecond // a Retry-After
				}
				record(p, outcome((op>>2)%3), backoff)
			case 2: // time passes
				d := fuzzSteps[arg%byte(len(fuzzSteps))] * time.Duration(1+arg>>4)
				if op&0x80 != 0 { // by buckets of the failure-rate window, to its edges
					d = up.Protection.Breaker.Window / breakerBuckets * time.Duration(1+arg%16)
					if arg&0x80 != 0 {
						d -= time.Microsecond
					}
				}
				clk.Advance(d)
				trace = append(trace, fmt.Sprintf("advance %v", d))
			case 3: // an attempt whose outcome comes at once
				if p, ok := admit(fuzzWaits[arg%byte(len(fuzzWaits))]); ok {
					record(p, outcome((op>>2)%3), 0)
				}
			}
			s, err := shared.state(t.Context())
			if err != nil {
				t.Fatalf("shared state: %v", err)
			}
			if l := local.state(); l != s {
				fail("state: Go %s; Lua %s", l, s)
			}
			if l, s := lm.get(), sm.get(); l != s {
				fail("transitions: Go %s; Lua %s", l, s)
			}
		}
	})
}

// fuzzConfig decodes an upstream's guard policy from 9 bytes (missing
// ones read as 0); every duration is a whole number of milliseconds (see
// FuzzBreakerGoVsLua).
func fuzzConfig(policy []byte) *Config {
	var b [9]byte
	copy(b[:], policy)
	threshold := int(b[0] % 6)
	if threshold == 0 {
		threshold = -1 // off
	}
	rate, burst := -1, 1+int(b[7]>>5)%3 // -1: no rate limit
	if b[7]%4 != 0 {
		rate = 1 + int(b[7]>>2)%20
	}
	return &Config{
		Name:    "fuzz",
		Timeout: time.Duration(1+b[8]%20) * 100 * time.Millisecond, // the probe lease is this plus 1s
		Protection: Protection{
			RateLimit: rate,
			Burst:     burst,
			Breaker: BreakerPolicy{
				FailureThreshold: threshold,
				FailureRate:      [...]float64{-1, 0.25, 0.5, 0.75, 1}[b[1]%5],
				MinRequests:      1 + int(b[2]%8),
				Window:           time.Duration(1+b[3]%20) * 100 * time.Millisecond,
				OpenFor:          time.Duration(1+b[4]%30) * 100 * time.Millisecond,
				HalfOpenProbes:   1 + int(b[5]%3),
				CloseAfter:       1 + int(b[6]%3),
			},
		},
	}
}

var (
	// fuzzWaits are the wait bounds an admit is given.
	fuzzWaits = []time.Duration{0, 50 * time.Millisecond, 200 * time.Millisecond, time.Second, 10 * time.Second}
	// fuzzSteps are the clock's steps, multiplied by 1 to 16: around the
	// buckets of a window, the open time, the probe lease.
	fuzzSteps = []time.Duration{time.Microsecond, 7 * time.Microsecond, time.Millisecond, 9 * time.Millisecond,
		10 * time.Millisecond, 25 * time.Millisecond, 99 * time.Millisecond, 100 * time.Millisecond,
		101 * time.Millisecond, 250 * time.Millisecond, 999 * time.Millisecond, time.Second}
)

// transitions records a guard's breaker transitions, without the scope.
type transitions struct {
	observe.Nop
	mu  sync.Mutex
	log []string
}

func (m *transitions) BreakerTransition(_, _, from, to string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.log = append(m.log, from+"→"+to)
}

func (m *transitions) get() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return strings.Join(m.log, " ")
}
