package upstream

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// quotaResolution is how far the two pacings may differ: the scripts
// keep times in whole microseconds and round each booked slot's start,
// Go in nanoseconds, so over the at most 50 slots of a window the two
// drift by up to a microsecond a slot. Any difference of policy is a
// whole interval (5 ms at the least here) or a margin.
const quotaResolution = 100 * time.Microsecond

func near(a, b time.Duration) bool { return (a - b).Abs() <= quotaResolution }

// FuzzQuotaGoVsLua is the differential test of the two implementations of
// learned-quota pacing: quotaWindow in Go (localGuard) and the quota parts
// of admitScript and recordScript in Lua (sharedGuard, through a real
// redis-server), as FuzzBreakerGoVsLua is of the breaker's (which passes
// no quota). Each input is a rate limit and a sequence of operations —
// admit an attempt for one of two credential scopes, partitions and
// routes (interactive or background, with a wait bound), record an
// admitted attempt's answer announcing a quota (remaining, limit, reset,
// in its partition or none), advance the clock — fed to both guards on
// one clock; every admission (verdict, wait, the quota's pacing, whether
// the quota was unknown, whether it asks again, its slack, whether the
// rate limit is booked later) must agree, the times within
// quotaResolution.
//
// go test runs the seeds in testdata/fuzz/FuzzQuotaGoVsLua; to search:
//
//	go test -fuzz FuzzQuotaGoVsLua -fuzztime 60s ./internal/upstream
func FuzzQuotaGoVsLua(f *testing.F) {
	st := testStore(f) // skips under -short: it needs redis-server
	var keys atomic.Int64
	f.Fuzz(func(t *testing.T, policy, ops []byte) {
		var b [2]byte
		copy(b[:], policy)
		up := &Config{Name: "fuzz", Timeout: time.Second, Protection: Protection{
			RateLimit: -1, Burst: 1 + int(b[1]%3),
			Breaker: BreakerPolicy{FailureThreshold: -1, FailureRate: -1},
		}}
		if b[0]%3 != 0 {
			up.Protection.RateLimit = 1 + int(b[0]>>2)%20
		}
		up.Protection.setDefaults()
		if err := up.Protection.validate("fuzz"); err != nil {
			t.Skip(err)
		}
		clk := newTestClock()
		var lm, sm transitions
		local := newLocalGuard(up, false, clk.Now, quietLogger(), &lm)
		sharedUp := *up
		sharedUp.Name = fmt.Sprintf("fuzzq%d", keys.Add(1)) // fresh hashes per input
		shared := newSharedGuard(st, &sharedUp, clk.Now, quietLogger(), &sm)

		type attempt struct {
			l, s admission
			ask  quotaAsk
		}
		var pending []attempt
		parts := newPartitions("https://api.example/") // the routes' partitions, as the Client learns them
		var trace []string
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("policy %+v, after\n\t%s\n"+format, append([]any{up.Protection, strings.Join(trace, "\n\t")}, args...)...)
		}
		scopes := [...]string{"s/a", "s/b"}
		names := [...]string{"", "core"} // partitions an answer may name
		routes := [...]string{"repos", "search"}
		askOf := func(arg byte) quotaAsk {
			// As Client.quotaAsk: the partition its route was last answered
			// under (the shared guard maps the route itself).
			scope, route := scopes[arg&1], routes[arg>>2&1]
			part := parts.of(scope, route)
			return quotaAsk{key: quotaKey(scope, part), scope: scope, partition: part, route: route, background: arg&8 != 0}
		}
		for len(ops) >= 3 {
			op, arg, arg2 := ops[0], ops[1], ops[2]
			ops = ops[3:]
			switch op % 3 {
			case 0: // admit
				ask := askOf(arg)
				maxWait := fuzzWaits[arg>>4%byte(len(fuzzWaits))]
				l := local.admit(maxWait, ask)
				s, err := shared.admit(t.Context(), maxWait, ask)
				if err != nil {
					t.Fatalf("shared admit: %v", err)
				}
				trace = append(trace, fmt.Sprintf("admit(%+v, maxWait %v) = %+v", ask, maxWait, l))
				if l.verdict != s.verdict || !near(l.wait, s.wait) || !near(l.paced, s.paced) || l.unknown != s.unknown ||
					l.again() != s.again() || !near(l.slack, s.slack) || l.rateLater() != s.rateLater() || l.backoff != s.backoff {
					show := func(a admission) string {
						return fmt.Sprintf("%v paced %v unknown %v again %v slack %v rateLater %v backoff %v", a, a.paced, a.unknown, a.again(), a.slack, a.rateLater(), a.backoff)
					}
					if w := local.quotas[ask.key]; w != nil {
						t.Logf("the Go window: %+v at %v", *w, clk.Now())
					}
					fail("admit: Go %s; Lua %s", show(l), show(s))
				}
				if l.verdict == verdictAdmitted {
					pending = append(pending, attempt{l, s, ask})
				}
			case 1: // an admitted attempt's answer, announcing a quota or not
				if len(pending) == 0 {
					continue
				}
				i := int(arg) % len(pending)
				a := pending[i]
				pending = append(pending[:i], pending[i+1:]...)
				var n quotaNote
				if op&0x80 == 0 {
					limit := int64(1 + arg2%50)
					q := Quota{Limit: limit, Remaining: int64(arg2>>1) % (limit + 1),
						Reset: time.Duration(1+arg>>3) * 250 * time.Millisecond, Partition: names[arg>>1&1], Source: "X-RateLimit-Remaining"}
					if op&0x40 != 0 { // the other partition
						q.Partition = names[1-arg>>1&1]
					}
					parts.learn(a.ask.scope, a.ask.route, q.Partition)
					n = quotaNote{key: quotaKey(a.ask.scope, q.Partition), scope: a.ask.scope, route: a.ask.route, label: "upstream", q: q}
				}
				ln, sn := n, n
				ln.unbooked, sn.unbooked = a.l.unknown, a.s.unknown
				trace = append(trace, fmt.Sprintf("record(%+v, note %+v)", a.ask, n.q))
				local.record(a.l, outcomeSuccess, 0, ln)
				shared.record(t.Context(), a.s, outcomeSuccess, 0, sn)
			case 2: // time passes
				d := time.Duration(1+int(arg)%64) * time.Duration([...]int{1, 10, 100, 997}[arg2%4]) * time.Millisecond
				clk.Advance(d)
				trace = append(trace, fmt.Sprintf("advance %v", d))
			}
		}
	})
}
