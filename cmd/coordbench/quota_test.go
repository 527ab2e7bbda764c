package main

import (
	"context"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot/vg"
)

// TestQuotaTable runs the quota benchmark scaled down below --quick (2
// instances, a 1 s window, a batch of 10 pages) and checks the table's
// shape: the columns in order, one row per fleet, coordd's first.
// It checks no figure: on a busy machine any of them may move.
func TestQuotaTable(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and coordd fleets")
	}
	cfg := defaultQuota(true)
	cfg.instances, cfg.limit, cfg.window, cfg.concurrent, cfg.maxInFlight = 2, 10, time.Second, 3, 2
	cfg.pages, cfg.agents, cfg.every, cfg.alone = 10, 2, 500*time.Millisecond, 500*time.Millisecond
	cfg.capFactor, cfg.callTimeout = 1.5, 2*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a bound for a stuck run, not a speed check
	defer cancel()
	res, err := runQuota(ctx, t, cfg, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range res.fleets {
		// Refusals passed on are the figures; a call the harness made
		// wrong is not.
		for _, bad := range []string{"Unauthenticated", "PermissionDenied", "InvalidArgument", "NotFound"} {
			if strings.Contains(f.firstErr, bad) {
				t.Errorf("%s: %s", f.name, f.firstErr)
			}
		}
	}

	table := renderQuota(res)
	lines := strings.Split(table, "\n")
	header := "| " + strings.Join(quotaColumns, " | ") + " |"
	at := -1
	for i, l := range lines {
		if l == header {
			at = i
			break
		}
	}
	if at < 0 {
		t.Fatalf("no header %q in:\n%s", header, table)
	}
	want := []string{"fleet", "refused at the upstream (403 and 429)", "quota used ÷ announced", "drain time ÷ ideal",
		"light tenant's wait p99 alone (ms)", "light tenant's wait p99 beside the heavy batch (ms)", "worst tenant's share ÷ max-min fair share"}
	if got := cells(lines[at]); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("columns: got %q; want %q", got, want)
	}
	var rows [][]string
	for _, l := range lines[at+2:] {
		if !strings.HasPrefix(l, "|") {
			break
		}
		rows = append(rows, cells(l))
	}
	if len(rows) != len(quotaFleets(cfg)) {
		t.Fatalf("got %d rows; want one per fleet, %d:\n%s", len(rows), len(quotaFleets(cfg)), table)
	}
	for i, r := range rows {
		if len(r) != len(want) {
			t.Errorf("row %d: got %d cells; want %d: %q", i, len(r), len(want), r)
		}
	}
	if !strings.HasPrefix(rows[0][0], "coordd") {
		t.Errorf("first row's fleet: got %q; want it to begin with coordd", rows[0][0])
	}

	p, err := quotaPlot(&results{quota: res})
	if err != nil || p == nil {
		t.Fatalf("quotaPlot: %v, %v; want a plot", p, err)
	}
	if err := p.Save(4*vg.Inch, 3*vg.Inch, filepath.Join(t.TempDir(), "quota.png")); err != nil {
		t.Errorf("save the quota plot: %v", err)
	}
}

// cells splits a Markdown table row into its trimmed cells.
func cells(row string) []string {
	parts := strings.Split(strings.Trim(row, "|"), "|")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

func TestMaxMinFair(t *testing.T) {
	for _, c := range []struct {
		name                 string
		capacity             float64
		demand, weight, want []float64
	}{
		{"room for all", 10, []float64{3, 4}, []float64{1, 1}, []float64{3, 4}},
		{"the small demand met, the rest to the large", 10, []float64{2, 100}, []float64{1, 1}, []float64{2, 8}},
		{"both large: halves", 10, []float64{50, 100}, []float64{1, 1}, []float64{5, 5}},
		{"weighted 2:1", 9, []float64{50, 100}, []float64{2, 1}, []float64{6, 3}},
		{"weight 0 is 1", 10, []float64{50, 100}, []float64{0, 1}, []float64{5, 5}},
		{"no demand gets nothing", 10, []float64{0, 100}, []float64{1, 1}, []float64{0, 10}},
		{"three, one met", 12, []float64{2, 20, 20}, []float64{1, 1, 1}, []float64{2, 5, 5}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := maxMinFair(c.capacity, c.demand, c.weight)
			for i := range got {
				if math.Abs(got[i]-c.want[i]) > 1e-6 {
					t.Fatalf("got %v; want %v", got, c.want)
				}
			}
		})
	}
}

func TestFairSharesByCredential(t *testing.T) {
	got := fairShares(10, []claim{
		{tenant: "a", credential: "x", demand: 100, served: 5},
		{tenant: "b", credential: "x", demand: 100, served: 5},
		{tenant: "c", credential: "y", demand: 4, served: 2},
	})
	for i, want := range []float64{5, 5, 4} {
		if got[i].fair != want {
			t.Errorf("%s: fair got %v; want %v", got[i].tenant, got[i].fair, want)
		}
	}
	if r := got[2].ratio(); r != 0.5 {
		t.Errorf("c's ratio: got %v; want 0.5", r)
	}
}
