package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot/vg"
)

// TestTinySwarm runs the agent swarm at its smallest: 3 agents, one MCP
// replica per fleet, one coordd. The coordd fleet must fetch each URL at
// most once and fail no call; the baselines are only run, not judged (at
// this load the edge limits nobody). It checks counts, never speed.
func TestTinySwarm(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server, coordd and an mdn-mcp process")
	}
	cfg := defaultSwarm(true)
	cfg.agents, cfg.replicas, cfg.coordd, cfg.tasks, cfg.pages = 3, 1, 1, 1, 3
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a bound for a stuck run, not a speed check
	defer cancel()
	res, err := runSwarm(ctx, t, cfg, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.fleets) != 3 {
		t.Fatalf("got %d fleets; want 3", len(res.fleets))
	}
	co := res.fleets[2]
	if co.name != fleetCoordd {
		t.Fatalf("third fleet: got %q; want %q", co.name, fleetCoordd)
	}
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"tool calls", co.calls, cfg.agents * cfg.tasks * 3},
		{"failed tool calls", co.failedCalls, 0},
		{"failed tasks", co.failedTasks, 0},
		{"429s", co.limited, 0},
	} {
		if c.got != c.want {
			t.Errorf("coordd fleet, %s: got %d; want %d (first failure: %s)", c.name, c.got, c.want, co.firstErr)
		}
	}
	if co.maxPerURL > 1 || co.upstream != co.urls {
		t.Errorf("coordd fleet: %d upstream requests for %d URLs, at most %d for one; want one per URL", co.upstream, co.urls, co.maxPerURL)
	}
	if co.urls == 0 {
		t.Errorf("coordd fleet: no URL fetched")
	}
	if table := renderSwarm(res); !strings.Contains(table, fleetCoordd) || !strings.Contains(table, "coordd ÷") {
		t.Errorf("table lacks the coordd fleet or the ratios:\n%s", table)
	}
	p, err := swarmPlot(&results{swarm: res})
	if err != nil || p == nil {
		t.Fatalf("swarmPlot: %v, %v; want a plot", p, err)
	}
	if err := p.Save(4*vg.Inch, 3*vg.Inch, filepath.Join(t.TempDir(), "swarm.png")); err != nil {
		t.Errorf("save the swarm plot: %v", err)
	}
}
