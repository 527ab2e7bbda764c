package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot/vg"
)

// TestTinyGateway runs the gateway benchmark small: coordd's gateway
// makes one API request per distinct file and no call fails; the table
// has every way and the figures of the gateway's own cost.
func TestTinyGateway(t *testing.T) {
	cfg := defaultGateway(true)
	cfg.agents, cfg.tasks, cfg.files, cfg.latCalls, cfg.tputConc, cfg.tputFor = 3, 2, 2, 20, 2, 200*time.Millisecond
	// No rate limit, so no 429s: the counts below are exact.
	cfg.apiRate = 0
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a bound for a stuck run, not a speed check
	defer cancel()
	res, err := runGateway(ctx, t, cfg, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.rows) != 3 {
		t.Fatalf("got %d rows; want 3", len(res.rows))
	}
	co := res.rows[2]
	if co.name != gwCoordd || co.failed != 0 || co.calls != cfg.agents*cfg.tasks || co.apiCalls > cfg.files || co.apiCalls == 0 {
		t.Fatalf("coordd's row: %+v; want %d calls, none failed, at most one API request per file (%d)", co, cfg.agents*cfg.tasks, cfg.files)
	}
	if d := res.rows[0]; d.processes != cfg.agents || d.apiCalls != cfg.agents*cfg.tasks {
		t.Fatalf("direct row: %+v; want a process and an API request per call", d)
	}
	if res.bareTput <= 0 || res.cachedTput <= 0 || res.cachedP50 <= 0 {
		t.Fatalf("the gateway's cost was not measured: %+v", res)
	}
	if table := renderGateway(res); !strings.Contains(table, gwCoordd) || !strings.Contains(table, "What the gateway adds") {
		t.Fatalf("table:\n%s", table)
	}
	p, err := gatewayPlot(&results{gateway: res})
	if err != nil || p == nil {
		t.Fatalf("gatewayPlot: %v, %v; want a plot", p, err)
	}
	if err := p.Save(4*vg.Inch, 3*vg.Inch, filepath.Join(t.TempDir(), "gateway.png")); err != nil {
		t.Errorf("save the gateway plot: %v", err)
	}
}
