package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/coordd/coordd/internal/testing/storetest"
)

// The cold path's own cost: the round trips each instance makes to Redis
// for one cold key, counted at its client (a go-redis hook: a pipeline or
// a script is one round trip, however many commands it runs inside
// Redis), and the leader's first answer against the floor's.

// instanceTrips is one instance's round trips during one cold burst.
type instanceTrips struct {
	leader bool     // it fetched (its trips include the guard's record of the outcome)
	before []string // leader: sent before the upstream request arrived
	after  []string // leader: sent after it; follower: every trip
}

// roundTrips returns the round trips of the first k instances since the
// burst began, split at arrived (the leader's upstream request). It waits
// (at most 2s) for the leader's landing and its guard's record, which run
// after its callers were answered.
func (e *env) roundTrips(ctx context.Context, k int, arrived time.Time) []instanceTrips {
	ins := e.coordd[:k]
	has := func(ts []storetest.Trip, steps ...string) bool {
		for _, s := range steps {
			if storetest.Count(ts, s) > 0 {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		done := false
		for _, in := range ins {
			ts := in.rt.Seen()
			// The leader lands (or hands off) and records its outcome:
			// the followers run the claim's script too, which admits
			// only the instance taking the lock (store's claimAdmitScript).
			if has(ts, "land", "handoff") && has(ts, "record") {
				done = true
			}
		}
		if done {
			break
		}
		time.Sleep(time.Millisecond) // the store offers no notification for this
	}
	out := make([]instanceTrips, len(ins))
	for i, in := range ins {
		ts := in.rt.Take()
		it := &out[i]
		it.leader = has(ts, "record")
		for _, t := range ts {
			if t.Step == "extend" {
				continue // a lease's renewal, by time, not by step
			}
			if it.leader && !arrived.IsZero() && t.At.Before(arrived) {
				it.before = append(it.before, t.Step)
			} else {
				it.after = append(it.after, t.Step)
			}
		}
	}
	return out
}

// coldCell is the at-once cold bursts of one (size, instances) pair,
// coordd and the floor interleaved.
type coldCell struct {
	size, k, callers int
	coordd, floor    []burstResult
	// The same bursts with the callers in a child process (callers.go).
	coorddOut, floorOut []burstResult
}

// measureCold runs cfg.coldRounds at-once bursts for each body size at 1
// and 3 instances, of one caller per instance (the cold path alone) and
// of cfg.lagCallers callers, coordd and the floor in turn.
func (e *env) measureCold(ctx context.Context) ([]coldCell, error) {
	const maxK = 3
	coorddOut, err := startCallers(e.coorddT.addrs[:maxK])
	if err != nil {
		return nil, err
	}
	defer coorddOut.close()
	floorOut, err := startCallers(e.floorT.addrs[:maxK])
	if err != nil {
		return nil, err
	}
	defer floorOut.close()
	var out []coldCell
	for _, size := range []int{e.cfg.small, e.cfg.large} {
		for _, k := range []int{1, maxK} {
			for _, n := range []int{k, e.cfg.lagCallers} {
				c := coldCell{size: size, k: k, callers: n}
				for range e.cfg.coldRounds {
					for _, b := range []struct {
						spec burstSpec
						into *[]burstResult
					}{
						{burstSpec{stubs: e.coorddT.stubs[:k], coorddK: k}, &c.coordd},
						{burstSpec{stubs: e.floorT.stubs[:k]}, &c.floor},
						{burstSpec{stubs: e.coorddT.stubs[:k], coorddK: k, remote: coorddOut}, &c.coorddOut},
						{burstSpec{stubs: e.floorT.stubs[:k], remote: floorOut}, &c.floorOut},
					} {
						b.spec.callers, b.spec.size, b.spec.atOnce = n, size, true
						r, err := e.burst(ctx, b.spec)
						if err != nil {
							return nil, err
						}
						*b.into = append(*b.into, r)
					}
				}
				out = append(out, c)
			}
		}
	}
	return out, ctx.Err()
}

// tripFigures sums the round trips of rs: per burst, the leader's before
// and after its upstream request, and each follower's, with their steps.
type tripFigures struct {
	bursts, followers               int
	before, after, follower         int // totals
	maxBefore, maxAfter, maxFollows int
	beforeBy, afterBy, followerBy   map[string]int
}

func countTrips(rs []burstResult) tripFigures {
	f := tripFigures{beforeBy: map[string]int{}, afterBy: map[string]int{}, followerBy: map[string]int{}}
	for _, r := range rs {
		f.bursts++
		for _, it := range r.trips {
			if it.leader {
				f.before += len(it.before)
				f.after += len(it.after)
				f.maxBefore = max(f.maxBefore, len(it.before))
				f.maxAfter = max(f.maxAfter, len(it.after))
				for _, s := range it.before {
					f.beforeBy[s]++
				}
				for _, s := range it.after {
					f.afterBy[s]++
				}
				continue
			}
			f.followers++
			f.follower += len(it.after)
			f.maxFollows = max(f.maxFollows, len(it.after))
			for _, s := range it.after {
				f.followerBy[s]++
			}
		}
	}
	return f
}

// steps prints by's steps with their mean count per n.
func steps(by map[string]int, n int) string {
	if n == 0 || len(by) == 0 {
		return "—"
	}
	names := make([]string, 0, len(by))
	for s := range by {
		names = append(names, s)
	}
	sort.Slice(names, func(i, j int) bool {
		if by[names[i]] != by[names[j]] {
			return by[names[i]] > by[names[j]]
		}
		return names[i] < names[j]
	})
	parts := make([]string, len(names))
	for i, s := range names {
		parts[i] = fmt.Sprintf("%s ×%s", s, strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", float64(by[s])/float64(n)), "0"), "."))
	}
	return strings.Join(parts, ", ")
}

func mean(total, n int) string {
	if n == 0 {
		return "—"
	}
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", float64(total)/float64(n)), "0"), ".")
}

// firsts returns the first answers of rs, less the time the upstream
// held each (held: as measured, else nominal).
func firsts(rs []burstResult, held bool, nominal time.Duration) []time.Duration {
	var ds []time.Duration
	for _, r := range rs {
		if r.errors == 0 && r.first > 0 {
			if held {
				ds = append(ds, r.first-r.held)
			} else {
				ds = append(ds, r.first-nominal)
			}
		}
	}
	return ds
}

// renderCold prints the cold path's section of the table.
func renderCold(cells []coldCell, cfg config) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("\n## Cold path: Redis round trips per step (goal: leader ≤ 3 before the upstream request and ≤ 2 after, follower ≤ 3)\n\n")
	w("Counted at each instance's go-redis client by a hook (cmd/coordbench → internal/testing/storetest.RoundTrips): a pipeline, or a script however many commands it runs inside Redis, is one round trip; PING and a lease's watchdog renewals are left out. The callers of a burst are released at once, over K instances; per burst (leader) or per following instance, mean (max). Steps: a store script by its name, another command by its own.\n\n")
	w("| body | K | callers | leader before upstream | steps | leader after | steps | follower (all) | steps | errors |\n")
	w("|---|---:|---:|---:|---|---:|---|---:|---|---:|\n")
	for _, c := range cells {
		f := countTrips(c.coordd)
		errs := 0
		for _, r := range c.coordd {
			errs += r.errors
		}
		fol, folSteps := "—", "— (one instance)"
		if c.k > 1 {
			fol, folSteps = fmt.Sprintf("%s (%d)", mean(f.follower, f.followers), f.maxFollows), steps(f.followerBy, f.followers)
		}
		w("| %s | %d | %d | %s (%d) | %s | %s (%d) | %s | %s | %s | %d |\n", sizeName(c.size), c.k, c.callers,
			mean(f.before, f.bursts), f.maxBefore, steps(f.beforeBy, f.bursts),
			mean(f.after, f.bursts), f.maxAfter, steps(f.afterBy, f.bursts), fol, folSteps, errs)
	}
	w("\n## Cold path: the leader's first answer (goal: within 3 ms of the floor), ms p50 / p99 / max\n\n")
	w("The callers (one per instance, or %d) released at once over K instances; from the release to the first caller's last byte, less the time the upstream held the request: as measured there (its arrival to its answer leaving; the nominal latency is %v, which a busy machine's timer overshoots), and, beside it, the nominal latency. The floor answers from memory at once. %d bursts of each, interleaved, with the callers in coordbench's process and (the second table) in a child process, as an MCP server's are: callers in the servers' own process share their scheduler and network poller, so a caller's connection is read only once the servers' work in flight has drained, and a server's Redis reply is seen only once the callers' work has.\n\n", cfg.lagCallers, cfg.latency, cfg.coldRounds)
	firstAnswers := func(title string, coordd func(coldCell) []burstResult, floor func(coldCell) []burstResult) {
		w("%s\n\n", title)
		w("| body | K | callers | coordd − upstream held | coordd − %v | %s | difference, p50 | coordd: release → upstream request | coordd: answer leaving → first last byte |\n", cfg.latency, nameFloor)
		w("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, c := range cells {
			co, cn, fl := firsts(coordd(c), true, 0), firsts(coordd(c), false, cfg.latency), firsts(floor(c), false, 0)
			var pre, post []time.Duration
			for _, r := range coordd(c) {
				if r.errors == 0 && r.pre > 0 {
					pre, post = append(pre, r.pre), append(post, r.post)
				}
			}
			c50, _, _ := percentiles(co)
			f50, _, _ := percentiles(fl)
			w("| %s | %d | %d | %s | %s | %s | %s | %s | %s |\n", sizeName(c.size), c.k, c.callers, triple(co), triple(cn), triple(fl), msNum(c50-f50), triple(pre), triple(post))
		}
		w("\n")
	}
	firstAnswers("Callers in coordbench's process:", func(c coldCell) []burstResult { return c.coordd }, func(c coldCell) []burstResult { return c.floor })
	firstAnswers("Callers in a child process (`coordbench --callers`):", func(c coldCell) []burstResult { return c.coorddOut }, func(c coldCell) []burstResult { return c.floorOut })
	return b.String()
}
