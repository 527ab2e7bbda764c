package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestSmallRound runs the core of one small round, coordd and both
// baselines, 2 instances × 20 callers of a tiny body, and renders the
// table from it. It checks counts, never speed.
func TestSmallRound(t *testing.T) {
	cfg, err := parseConfig([]string{"--quick", "--latency", "1ms", "--small", "64"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.maxK, cfg.lagCallers = 2, 20
	e := newEnv(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const k, callers = 2, 20
	run := func(tg *target, coorddK int) burstResult {
		t.Helper()
		r, err := e.burst(ctx, burstSpec{stubs: tg.stubs[:k], callers: callers, size: cfg.small, coorddK: coorddK})
		if err != nil {
			t.Fatalf("%s: %v", tg.name, err)
		}
		if r.errors != 0 {
			t.Fatalf("%s: %d errors, the first: %v", tg.name, r.errors, r.firstErr)
		}
		if len(r.body) != callers {
			t.Errorf("%s: got %d lags; want %d", tg.name, len(r.body), callers)
		}
		return r
	}
	co, po, fl := run(e.coorddT, k), run(e.pollT, 0), run(e.floorT, 0)
	for _, c := range []struct {
		name      string
		got, want int64
	}{
		{"coordd upstream requests per key", co.upstream, 1},
		{"polling upstream requests per key (one per process)", po.upstream, k},
		{"floor upstream requests per key", fl.upstream, 0},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %d; want %d", c.name, c.got, c.want)
		}
	}
	if co.redis <= 0 {
		t.Errorf("coordd Redis commands: got %d; want > 0", co.redis)
	}

	res := &results{
		cfg:  cfg,
		grid: []gridCell{{k: k, callers: callers, coordd: []burstResult{co}, poll: []burstResult{po}, coorddRedisBy: co.redisBy}},
		lag:  []lagCell{{size: cfg.small, k: k, coordd: co, poll: po, floor: fl}},
	}
	table := renderTable(res)
	for _, want := range []string{
		"## Upstream requests per cold key (goal: exactly 1)",
		"| 2 | 20 | 1.00 (1) | 2.00 | 0.50× | 0, 0 |",
		"## Follower lag",
		"| 64 B | 2 | full body |",
		"## Cross-instance wake-up",
		"## Warm-hit throughput",
		"## Memory and GC",
		"concurrent streams on one instance",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}

func TestParseCommandStats(t *testing.T) {
	got := parseCommandStats("# Commandstats\r\ncmdstat_get:calls=21,usec=175,usec_per_call=8.33,rejected_calls=0,failed_calls=0\r\ncmdstat_config|resetstat:calls=2,usec=9\r\n")
	for cmd, want := range map[string]int64{"get": 21, "config|resetstat": 2} {
		if got[cmd] != want {
			t.Errorf("%s: got %d; want %d", cmd, got[cmd], want)
		}
	}
}
