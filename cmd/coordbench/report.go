package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// renderTable formats every figure of res with its ratio to its baseline,
// as Markdown tables, one per measurement.
func renderTable(res *results) string {
	var b strings.Builder
	cfg := res.cfg
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("# coordbench: coordd against its baselines, same process, same run\n\n")
	w("Baselines: **%s** (the design coordd replaces: one process per instance, an in-process map, the first caller fetches, the others poll the map every 200 ms; processes share nothing) and **%s** (a bare gRPC server streaming the same bytes, encoded once, from memory). Upstream latency %v after every caller of a cold burst waits. Ratios are coordd ÷ baseline.\n", namePolling, nameFloor, cfg.latency)
	if cfg.quickNote != "" {
		w("\n**%s.**\n", cfg.quickNote)
	}

	w("\n## Upstream requests per cold key (goal: exactly 1)\n\n")
	w("| instances | callers | coordd: per key, mean (max) | %s: per key | coordd ÷ polling | errors (coordd, polling) |\n", namePolling)
	w("|---:|---:|---:|---:|---:|---:|\n")
	for _, c := range res.grid {
		cm, cmax, ce := upstreamPerKey(c.coordd)
		pm, _, pe := upstreamPerKey(c.poll)
		w("| %d | %d | %.2f (%d) | %.2f | %s | %d, %d |\n", c.k, c.callers, cm, cmax, pm, ratio(cm, pm), ce, pe)
	}

	w("\n## Redis commands per cold burst per instance (goal: flat in callers)\n\n")
	w("PING (health checks), INFO and CONFIG are left out; counted with CONFIG RESETSTAT and INFO commandstats around each burst, once every flight ended. Baseline: the same instances with one caller each.\n\n")
	w("| instances | callers | coordd: commands per instance | baseline: 1 caller per instance | ratio |\n")
	w("|---:|---:|---:|---:|---:|\n")
	for _, c := range res.grid {
		base := redisPerInstance(gridBase(res.grid, c.k).coordd, c.k)
		v := redisPerInstance(c.coordd, c.k)
		w("| %d | %d | %.1f | %.1f | %s |\n", c.k, c.callers, v, base, ratio(v, base))
	}
	if c := largestGrid(res.grid); c != nil {
		w("\nBy command, all instances, per burst, at %d instances × %d callers: %s.\n", c.k, c.callers, byCommand(c.coorddRedisBy, len(c.coordd)))
	}

	w("\n## Follower lag, %d callers (upstream's answer leaving → caller receiving), ms p50 / p99 / max\n\n", cfg.lagCallers)
	w("| body | instances | received | coordd | %s | coordd ÷ polling | %s | coordd ÷ floor |\n", namePolling, nameFloor)
	w("|---|---:|---|---:|---:|---:|---:|---:|\n")
	for _, c := range res.lag {
		for _, ev := range []struct {
			name string
			pick func(burstResult) []time.Duration
		}{
			{"metadata", func(r burstResult) []time.Duration { return r.meta }},
			{"full body", func(r burstResult) []time.Duration { return r.body }},
		} {
			co, po, fl := ev.pick(c.coordd), ev.pick(c.poll), ev.pick(c.floor)
			w("| %s | %d | %s | %s | %s | %s | %s | %s |\n", sizeName(c.size), c.k, ev.name,
				triple(co), triple(po), ratios(co, po), triple(fl), ratios(co, fl))
		}
	}
	w("\nErrors: %s.\n", lagErrors(res.lag))

	w("\n## Cross-instance wake-up, %d callers (each instance's first completion after the burst's first), ms p50 / p99 / max\n\n", cfg.lagCallers)
	w("The polling baseline has no cross-instance wake-up to make: each of its processes fetches the upstream itself (K requests per key).\n\n")
	w("| body | instances | coordd | %s | coordd ÷ polling | %s | coordd ÷ floor |\n", namePolling, nameFloor)
	w("|---|---:|---:|---:|---:|---:|---:|\n")
	for _, c := range res.lag {
		if c.k == 1 {
			w("| %s | 1 | — (one instance) | — | — | — | — |\n", sizeName(c.size))
			continue
		}
		w("| %s | %d | %s | %s | %s | %s | %s |\n", sizeName(c.size), c.k,
			triple(c.coordd.wake), triple(c.poll.wake), ratios(c.coordd.wake, c.poll.wake), triple(c.floor.wake), ratios(c.coordd.wake, c.floor.wake))
	}

	w("%s", renderCold(res.cold, cfg))

	w("%s", renderWarm(res.tput, cfg))
	m := res.mem
	w("\n## Memory and GC with %s documents of %s in L1\n\n", thousands(m.docs), sizeName(m.size))
	w("Baseline: the naive cache coordd's L1 (bigcache: bodies in a few large byte slices) avoids, a Go map of *coordinator.Document holding the same documents. Single-node coordinator, filled through Get (an in-memory upstream transport) in %.1f s; L1 then served %d of %d sampled documents.\n\n", m.coordd.fill.Seconds(), m.held, m.sampled)
	w("| figure | coordd L1 | map of *Document | coordd ÷ map |\n")
	w("|---|---:|---:|---:|\n")
	w("| live heap per document | %.0f B | %.0f B | %s |\n", m.coordd.bytesPerDoc, m.map_.bytesPerDoc, ratio(m.coordd.bytesPerDoc, m.map_.bytesPerDoc))
	w("| forced full GC, wall time (median of 3) | %s | %s | %s |\n", dur(m.coordd.gcCycle), dur(m.map_.gcCycle), ratio(float64(m.coordd.gcCycle), float64(m.map_.gcCycle)))
	w("| longest GC stop-the-world pause of those | %s | %s | %s |\n", dur(m.coordd.gcPause), dur(m.map_.gcPause), ratio(float64(m.coordd.gcPause), float64(m.map_.gcPause)))

	s := res.streams
	w("\n## %s concurrent streams on one instance (one cold key of %s, %d client connections)\n\n", thousands(s.n), sizeName(cfg.small), cfg.streamConns)
	w("Memory is the live heap and goroutine stacks while every stream waits, per stream, the client's side of each stream included (it runs in this process). Latency: the upstream's answer leaving → the caller's last byte.\n\n")
	w("| figure | coordd | %s | coordd ÷ floor |\n", nameFloor)
	w("|---|---:|---:|---:|\n")
	w("| memory per stream | %.1f KiB | %.1f KiB | %s |\n", s.coordd.bytesPerStream/1024, s.floor.bytesPerStream/1024, ratio(s.coordd.bytesPerStream, s.floor.bytesPerStream))
	w("| goroutines per stream | %.1f | %.1f | %s |\n", s.coordd.goroutinesPerStream, s.floor.goroutinesPerStream, ratio(s.coordd.goroutinesPerStream, s.floor.goroutinesPerStream))
	w("| errors | %d | %d | — |\n", s.coordd.burst.errors, s.floor.burst.errors)
	w("| latency p50 / p99 / max, ms | %s | %s | %s |\n", triple(s.coordd.burst.body), triple(s.floor.burst.body), ratios(s.coordd.burst.body, s.floor.burst.body))
	w("| upstream requests | %d | — | — |\n", s.coordd.burst.upstream)
	if err := firstError(res); err != "" {
		w("\nFirst error seen: %s\n", err)
	}
	w("\nMeasured in %.0f s.\n", res.elapsed.Seconds())
	if res.swarm != nil {
		w("\n%s", renderSwarm(res.swarm))
	}
	if res.quota != nil {
		w("\n%s", renderQuota(res.quota))
	}
	if res.gateway != nil {
		w("\n%s", renderGateway(res.gateway))
	}
	return b.String()
}

// upstreamPerKey returns the mean and max upstream requests per key, and
// the errors, of rs.
func upstreamPerKey(rs []burstResult) (mean float64, most int64, errs int) {
	for _, r := range rs {
		mean += float64(r.upstream)
		most = max(most, r.upstream)
		errs += r.errors
	}
	if len(rs) > 0 {
		mean /= float64(len(rs))
	}
	return mean, most, errs
}

func redisPerInstance(rs []burstResult, k int) float64 {
	if len(rs) == 0 {
		return 0
	}
	var n int64
	for _, r := range rs {
		n += r.redis
	}
	return float64(n) / float64(len(rs)) / float64(k)
}

// gridBase returns the cell of k instances with one caller each.
func gridBase(grid []gridCell, k int) gridCell {
	for _, c := range grid {
		if c.k == k && c.callers == k {
			return c
		}
	}
	return gridCell{}
}

func largestGrid(grid []gridCell) *gridCell {
	var best *gridCell
	for i := range grid {
		c := &grid[i]
		if best == nil || c.k*c.callers > best.k*best.callers {
			best = c
		}
	}
	return best
}

func byCommand(by map[string]int64, rounds int) string {
	var names []string
	for cmd, n := range by {
		if !ignoredCommand(cmd) && n > 0 {
			names = append(names, cmd)
		}
	}
	slices.Sort(names)
	var parts []string
	for _, cmd := range names {
		parts = append(parts, fmt.Sprintf("%s %.1f", strings.ToUpper(cmd), float64(by[cmd])/float64(max(1, rounds))))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func lagErrors(cells []lagCell) string {
	var co, po, fl int
	for _, c := range cells {
		co += c.coordd.errors
		po += c.poll.errors
		fl += c.floor.errors
	}
	return fmt.Sprintf("coordd %d, polling %d, floor %d", co, po, fl)
}

func firstError(res *results) string {
	var errs []error
	for _, c := range res.grid {
		for _, r := range append(slices.Clone(c.coordd), c.poll...) {
			errs = append(errs, r.firstErr)
		}
	}
	for _, c := range res.lag {
		errs = append(errs, c.coordd.firstErr, c.poll.firstErr, c.floor.firstErr)
	}
	errs = append(errs, res.streams.coordd.burst.firstErr, res.streams.floor.burst.firstErr)
	for _, err := range errs {
		if err != nil {
			return err.Error()
		}
	}
	return ""
}

// triple formats the p50, p99 and max of ds in milliseconds.
func triple(ds []time.Duration) string {
	if len(ds) == 0 {
		return "—"
	}
	a, b, c := percentiles(ds)
	return msNum(a) + " / " + msNum(b) + " / " + msNum(c)
}

// ratios formats the ratios of the p50, p99 and max of a and b.
func ratios(a, b []time.Duration) string {
	if len(a) == 0 || len(b) == 0 {
		return "—"
	}
	a1, a2, a3 := percentiles(a)
	b1, b2, b3 := percentiles(b)
	return ratio(float64(a1), float64(b1)) + " / " + ratio(float64(a2), float64(b2)) + " / " + ratio(float64(a3), float64(b3))
}

func ratio(a, b float64) string {
	if b == 0 {
		return "—"
	}
	r := a / b
	switch {
	case r >= 100:
		return fmt.Sprintf("%.0f×", r)
	case r >= 10:
		return fmt.Sprintf("%.1f×", r)
	case r >= 0.01:
		return fmt.Sprintf("%.2f×", r)
	default:
		return fmt.Sprintf("%.3f×", r)
	}
}

func percent(a, b float64) string {
	if b == 0 {
		return "—"
	}
	return fmt.Sprintf("%.0f%%", 100*a/b)
}

// dur formats d in µs under a millisecond, else in ms.
func dur(d time.Duration) string {
	if d < time.Millisecond {
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	}
	return msNum(d) + " ms"
}

func msNum(d time.Duration) string {
	v := float64(d) / float64(time.Millisecond)
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

func thousands(n int) string {
	s := fmt.Sprint(n)
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

// facts describe the machine a run measured.
type facts struct {
	cpus       int
	cpuModel   string
	goVersion  string
	goarch     string
	gomaxprocs int
	memory     string // MemTotal
	load       string // load averages when the run began
	redis      string
	date       time.Time
}

func machineFacts() facts {
	f := facts{
		cpus: runtime.NumCPU(), goVersion: runtime.Version(), goarch: runtime.GOOS + "/" + runtime.GOARCH,
		gomaxprocs: runtime.GOMAXPROCS(0), date: time.Now().UTC(), cpuModel: "unknown", redis: "unknown",
		memory: "unknown", load: "unknown",
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				if kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64); err == nil {
					f.memory = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
				}
			}
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if fs := strings.Fields(string(b)); len(fs) >= 3 {
			f.load = strings.Join(fs[:3], " ")
		}
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				f.cpuModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if out, err := exec.Command("redis-server", "--version").Output(); err == nil {
		f.redis = strings.TrimSpace(string(out))
	}
	return f
}

// renderReport is the Markdown report: the machine, the command, the
// table, the plots.
func renderReport(res *results, table string, plots []string) string {
	var b strings.Builder
	f := res.facts
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("# coordd benchmark report\n\n")
	w("Generated by `make report` (which `make bench` runs) on %s. Every figure below comes from that one run, and every ratio compares it with a baseline measured in the same process during the same run.\n\n", f.date.Format("2006-01-02 15:04 MST"))
	w("## Machine\n\n")
	w("| fact | value |\n|---|---|\n")
	w("| CPUs | %d × %s (GOMAXPROCS %d) |\n", f.cpus, f.cpuModel, f.gomaxprocs)
	w("| memory | %s |\n", f.memory)
	w("| load average (1, 5, 15 min) when the run began | %s (other work on the machine skews the figures) |\n", f.load)
	w("| Go | %s %s |\n", f.goVersion, f.goarch)
	w("| Redis | %s |\n", f.redis)
	w("\nThe client, every server (five coordd instances, five of each baseline) and the upstream share these CPUs in one process; redis-server is a separate process on loopback.\n\n")
	w("## Command\n\n```\n%s\n```\n\n", res.cfg.commandLine)
	w("`go -C cmd/coordbench run . --quick` prints the same table with fewer rounds (under a minute on two cores).\n\n")
	w("## How each figure is measured\n\n")
	w("- **Cold burst**: N callers call GetOrFetch for one new key at once, spread round-robin over K instances. The upstream holds its answer until every caller has received its first progress event (so every caller waits), then answers after the configured latency. Each burst uses a new key.\n")
	w("- **Follower lag**: from the moment the answer leaves the upstream (just before its body is written) to each caller's metadata and last byte, on one clock (one process). The floor instead sends its bytes the moment the burst is released.\n")
	w("- **Cold path**: callers released at once (one per instance, or %d) for a new key whose upstream answers after its latency without waiting for them; each instance's round trips to Redis counted at its go-redis client (a hook: a pipeline or a script is one), the leader's split at its upstream request's arrival; the leader's first answer from the release to the first caller's last byte, less the upstream's hold as measured there, beside the floor's. `go -C cmd/coordbench run . --cold` prints these two tables alone.\n", res.cfg.lagCallers)
	w("- **Warm hits**: callers loop `Get` (clients/go, zero-copy receive) on a document already in L1 (for the polling baseline: in its map). The floor sends, for this document, the bytes coordd sends for a hit (its progress event, metadata and chunk messages, captured from coordd once, in wire form) with a request id header as coordd does: coordd ÷ floor is what coordd's own work costs.\n")
	w("- **Memory**: live heap after a forced GC, before and after filling, divided by the documents; GC figures from forced `runtime.GC()` calls.\n")
	w("- **Agent swarm**: A go-sdk MCP clients over Streamable HTTP, spread round-robin over M replicas, start at once and run sub-tasks (mdn_search, then mdn_doc twice, pages drawn from a Zipf popularity) against each fleet in turn, each fleet cold. The local MDN sits behind an edge limiter like Cloudflare's (one client IP, a one-second count, 429 with Retry-After past R, a block for a client that keeps asking); upstream requests and 429s are counted there, failed calls and latency at the agents. `go -C cmd/coordbench run . --swarm` prints this table alone; `--swarm --quick` a smaller swarm. The mdn-mcp replicas of the coordd fleet are separate processes (`go build ./cmd/mdn-mcp`); the baselines' MCP servers run in this process, each with its own cache, as separate processes would be.\n")
	w("- **Quota**: a fake API with GitHub's rate limits, scaled down (internal/testing/fakeapi: N requests per window per credential, x-ratelimit-* headers as GitHub sends them, 403 past the limit; a secondary limit of C concurrent requests, 403 with Retry-After), in front of four fleets in turn, each cold: coordd (3 instances sharing Redis, pacing by the quota the headers announce, per credential, with max_in_flight and fair queuing between tenants), the same with a fixed rate_limit 2× too high and 4× too low (learn_quota off), and 3 instances without Redis each pacing by the headers alone (as octokit without clustering). Two tenants, each with its own credential: a heavy one asks for a batch of cold pages at once (background priority), a light one's agents ask for a cold page each at a steady pace (interactive). Refusals and the requests per window are counted at the fake API; waits at the callers. The definitions are under the table. `go -C cmd/coordbench run . --quota` prints this table alone; `--quota --quick` in under a minute.\n")
	w("- **MCP gateway**: go-sdk MCP clients (the agents) call get_file_contents of the reference GitLab MCP server from npm, unmodified, whose API requests go to a local GitLab API with a rate limit (429 with Retry-After past it); three ways in turn, each cold: every agent with its own server process over stdio, as MCP clients start them; three gateway instances without Redis, each its own cache (an in-process-cache proxy); and coordd's gateway on three instances sharing a Redis, the tool listed in `coalesce` with a ttl. API requests and 429s are counted at the API, processes where they start, failed calls at the agents. Then the gateway's own cost: sequential calls of a constant tool on a bare Streamable HTTP server (go-sdk), directly and cached through the gateway, and the calls a second of both under concurrent callers. `go -C cmd/coordbench run . --gateway` prints this table alone; `--gateway --quick` a smaller swarm.\n\n")
	w("%s\n", demoteHeadings(table))
	if len(plots) > 0 {
		w("## Plots\n\n")
		for _, p := range plots {
			w("![%s](%s)\n\n", strings.TrimSuffix(p, ".png"), p)
		}
	}
	return b.String()
}

// demoteHeadings turns the table's "# " title into "## " and its "## "
// sections into "### ", to sit under the report's own title.
func demoteHeadings(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "#") {
			lines[i] = "#" + l
		}
	}
	return strings.Join(lines, "\n")
}

// renderWarm prints the warm-hit throughput section of the table.
func renderWarm(tp []tputPoint, cfg config) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("\n## Warm-hit throughput, one instance, documents/s through the Go client (goal: coordd ≥ 95%% of the floor)\n\n")
	w("| body | callers | coordd | %s | coordd ÷ floor | %s | coordd ÷ polling | errors |\n", nameFloor, namePolling)
	w("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range tp {
		w("| %s | %d | %.0f | %.0f | %s | %.0f | %s | %d |\n", sizeName(p.size), p.callers,
			p.coordd.perSec(), p.floor.perSec(), percent(sliceRatio(p.coordd, p.floor), 1), p.poll.perSec(), ratio(p.coordd.perSec(), p.poll.perSec()),
			p.coordd.errors+p.floor.errors+p.poll.errors)
	}
	per := ""
	if cfg.tputPerCaller > 0 {
		per = fmt.Sprintf(" (%v per caller where that is longer)", cfg.tputPerCaller)
	}
	w("\nEach point: %v per target%s, in %d slices taken in turn, each slice starting with the next target after a forced GC; coordd ÷ floor is the median over the slices of the ratio within each slice.\n", cfg.tputDuration, per, cfg.tputSlices())
	return b.String()
}
