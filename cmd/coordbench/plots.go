package main

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// drawPlots writes the PNG plots into dir and returns their file names.
func drawPlots(res *results, dir string) ([]string, error) {
	var names []string
	for _, p := range []struct {
		name string
		draw func(*results) (*plot.Plot, error)
	}{
		{"lag-cdf.png", lagCDF},
		{"throughput.png", throughputPlot},
		{"swarm.png", swarmPlot},
		{"quota.png", quotaPlot},
		{"gateway.png", gatewayPlot},
	} {
		pl, err := p.draw(res)
		if err != nil {
			return nil, fmt.Errorf("plot %s: %w", p.name, err)
		}
		if pl == nil {
			continue
		}
		if err := pl.Save(8*vg.Inch, 5*vg.Inch, filepath.Join(dir, p.name)); err != nil {
			return nil, fmt.Errorf("plot %s: %w", p.name, err)
		}
		names = append(names, p.name)
	}
	return names, nil
}

// lagCDF plots the CDF of the full-body follower lag at the largest
// instance count, for coordd and both baselines, each body size.
func lagCDF(res *results) (*plot.Plot, error) {
	k := 0
	for _, c := range res.lag {
		k = max(k, c.k)
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Follower lag, %d instances × %d callers: upstream answer → caller's last byte", k, res.cfg.lagCallers)
	p.X.Label.Text = "lag (ms, log scale)"
	p.Y.Label.Text = "share of callers"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	var lines []any
	for _, c := range res.lag {
		if c.k != k {
			continue
		}
		for _, s := range []struct {
			name string
			r    burstResult
		}{{nameCoordd, c.coordd}, {namePolling, c.poll}, {nameFloor, c.floor}} {
			if len(s.r.body) == 0 {
				continue
			}
			lines = append(lines, fmt.Sprintf("%s, %s", s.name, sizeName(c.size)), cdf(s.r.body))
		}
	}
	if len(lines) == 0 {
		return nil, nil
	}
	// The legend goes top left, over a decade left empty for it.
	p.Legend.Top, p.Legend.Left = true, true
	if err := plotutil.AddLines(p, lines...); err != nil {
		return nil, err
	}
	p.X.Min /= 10
	return p, nil
}

// cdf returns the empirical CDF of ds in milliseconds, floored at 1 µs so
// that a log scale can show it.
func cdf(ds []time.Duration) plotter.XYs {
	s := slices.Clone(ds)
	slices.Sort(s)
	xys := make(plotter.XYs, len(s))
	for i, d := range s {
		xys[i].X = max(float64(d)/float64(time.Millisecond), 0.001)
		xys[i].Y = float64(i+1) / float64(len(s))
	}
	return xys
}

// throughputPlot plots warm-hit throughput against callers.
func throughputPlot(res *results) (*plot.Plot, error) {
	if len(res.tput) == 0 {
		return nil, nil
	}
	p := plot.New()
	p.Title.Text = "Warm-hit throughput, one instance, Go client"
	p.X.Label.Text = "concurrent callers (log scale)"
	p.Y.Label.Text = "documents/s"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Tick.Marker = wholeTicks{}
	p.Legend.Top, p.Legend.Left = true, true
	var sizes []int
	for _, pt := range res.tput {
		if !slices.Contains(sizes, pt.size) {
			sizes = append(sizes, pt.size)
		}
	}
	var lines []any
	for _, size := range sizes {
		for _, s := range []struct {
			name string
			pick func(tputPoint) tput
		}{
			{nameCoordd, func(p tputPoint) tput { return p.coordd }},
			{nameFloor, func(p tputPoint) tput { return p.floor }},
			{namePolling, func(p tputPoint) tput { return p.poll }},
		} {
			var xys plotter.XYs
			for _, pt := range res.tput {
				if pt.size == size && s.pick(pt).perSec() > 0 {
					xys = append(xys, plotter.XY{X: float64(pt.callers), Y: s.pick(pt).perSec()})
				}
			}
			if len(xys) > 0 {
				lines = append(lines, fmt.Sprintf("%s, %s", s.name, sizeName(size)), xys)
			}
		}
	}
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return nil, err
	}
	// From zero, with room above the highest point for the legend.
	p.Y.Min, p.Y.Max = 0, p.Y.Max*1.5
	return p, nil
}

// wholeTicks are the default ticks labelled without decimals.
type wholeTicks struct{}

func (wholeTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = strconv.FormatFloat(ts[i].Value, 'f', 0, 64)
		}
	}
	return ts
}

// swarmPlot compares the swarm's three fleets: upstream requests, 429s
// received and failed tool calls, side by side per fleet.
func swarmPlot(res *results) (*plot.Plot, error) {
	sw := res.swarm
	if sw == nil || len(sw.fleets) == 0 {
		return nil, nil
	}
	return countBars(fmt.Sprintf("Agent swarm: %d MCP agents, %d replicas per fleet, edge limit %d req/s", sw.cfg.agents, sw.cfg.replicas, sw.cfg.edge.rate),
		sw.fleets, func(f fleetResult) string { return shortFleet(f.name) }, vg.Points(18), []barMeasure[fleetResult]{
			{"upstream requests", func(f fleetResult) int { return f.upstream }},
			{"429s received", func(f fleetResult) int { return f.limited }},
			{"failed tool calls", func(f fleetResult) int { return f.failedCalls }},
		})
}

// gatewayPlot compares the gateway benchmark's three ways of running the
// swarm: API requests, 429s, failed tool calls and server processes, side
// by side per way.
func gatewayPlot(res *results) (*plot.Plot, error) {
	gr := res.gateway
	if gr == nil || len(gr.rows) == 0 {
		return nil, nil
	}
	return countBars(fmt.Sprintf("MCP gateway: %d agents × %d calls, reference GitLab server, API limit %d req/s", gr.cfg.agents, gr.cfg.tasks, gr.cfg.apiRate),
		gr.rows, func(r gatewayRow) string { return shortWay(r.name) }, vg.Points(14), []barMeasure[gatewayRow]{
			{"API requests", func(r gatewayRow) int { return r.apiCalls }},
			{"429s received", func(r gatewayRow) int { return r.limited }},
			{"failed tool calls", func(r gatewayRow) int { return r.failed }},
			{"server processes", func(r gatewayRow) int { return r.processes }},
		})
}

// barMeasure is one count of a row, drawn as one bar of each group.
type barMeasure[T any] struct {
	name string
	pick func(T) int
}

// countBars draws a group of bars of width w per row, one bar per
// measure, centred on the row's label.
func countBars[T any](title string, rows []T, label func(T) string, w vg.Length, measures []barMeasure[T]) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = "count, whole run"
	p.Y.Tick.Marker = wholeTicks{}
	p.Legend.Top = true
	var names []string
	for _, r := range rows {
		names = append(names, label(r))
	}
	for i, m := range measures {
		var vs plotter.Values
		for _, r := range rows {
			vs = append(vs, float64(m.pick(r)))
		}
		bars, err := plotter.NewBarChart(vs, w)
		if err != nil {
			return nil, err
		}
		bars.Color = plotutil.Color(i)
		bars.LineStyle.Width = 0
		bars.Offset = w * (vg.Length(i) - vg.Length(len(measures)-1)/2)
		p.Add(bars)
		p.Legend.Add(m.name, bars)
	}
	p.NominalX(names...)
	p.Y.Min, p.Y.Max = 0, p.Y.Max*1.3 // room for the legend
	return p, nil
}

// shortWay is a gateway way's name short enough for an axis.
func shortWay(name string) string {
	switch name {
	case gwDirect:
		return "a server per agent"
	case gwLocal:
		return "3 gateways, own caches"
	case gwCoordd:
		return "coordd, 3 instances"
	}
	return name
}

// shortFleet is a fleet's name short enough for an axis.
func shortFleet(name string) string {
	switch name {
	case fleetLocal:
		return "in-process cache"
	case fleetSeed:
		return "seed: SET NX PX + polling"
	case fleetCoordd:
		return "mdn-mcp + coordd"
	}
	return name
}

// quotaPlot draws each quota fleet's batch drain: the share of the batch
// fetched against the time since it began, in ideal times, beside the
// ideal pace.
func quotaPlot(res *results) (*plot.Plot, error) {
	qr := res.quota
	if qr == nil || len(qr.fleets) == 0 {
		return nil, nil
	}
	c := qr.cfg
	ideal := c.ideal().Seconds()
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Quota: a batch of %d cold pages, %d requests per %v per credential", c.pages, c.limit, c.window)
	p.X.Label.Text = "time since the batch began ÷ ideal drain time"
	p.Y.Label.Text = "share of the batch fetched"
	p.Legend.Top, p.Legend.Left = true, true
	lines := []any{"ideal: remaining ÷ reset", plotter.XYs{{X: 0, Y: 0}, {X: 1, Y: 1}}}
	for _, f := range qr.fleets {
		xys := plotter.XYs{{X: 0, Y: 0}}
		for i, d := range f.progress {
			xys = append(xys, plotter.XY{X: d.Seconds() / ideal, Y: float64(i+1) / float64(c.pages)})
		}
		lines = append(lines, f.name, xys)
	}
	if err := plotutil.AddLines(p, lines...); err != nil {
		return nil, err
	}
	p.X.Min, p.X.Max = 0, c.capFactor
	p.Y.Min, p.Y.Max = 0, 1.6 // room above for the legend
	return p, nil
}
