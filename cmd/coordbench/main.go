// Command coordbench measures coordd against baselines run in the same
// process and the same run, and prints one table of figures, each with its
// ratio to its baseline.
//
//	coordbench [--quick] [--report FILE] [--latency D] [--small N] [--large N]
//	coordbench --swarm [--quick]
//	coordbench --cold [--quick]
//	coordbench --quota [--quick]
//	coordbench --warm [--quick] [--cpuprofile FILE]
//	coordbench --gateway [--quick]
//
// It starts everything it measures itself, on loopback only: a private
// redis-server on a free port (through internal/testing/redistest), a local
// upstream whose latency and body sizes are flags, five coordd instances
// (coordinator and gRPC server) in this process, and the two baselines:
//
//   - polling: the design coordd replaces. One small gRPC server per
//     "instance", each with its own in-process map; the first caller of a
//     key in a process fetches it, the others poll the map every 200 ms.
//     Processes share nothing, so each fetches the upstream.
//   - floor: a bare gRPC server streaming the same bytes, pre-encoded, from
//     memory: what no service can beat.
//
// --swarm (or --agents) runs only the agent-swarm benchmark (swarm.go):
// go-sdk MCP clients against three fleets of MCP servers, in front of a
// local MDN behind an edge limiter; the full run runs it first and puts
// its table and plot in the report.
//
// --cold runs only the cold path's figures (cold.go): the round trips each
// instance makes to Redis per step for one cold key, and the leader's
// first answer against the floor's, with the callers in this process and
// in a child process (coordbench --callers ADDR..., callers.go); the full
// run includes them.
// --warm runs only the warm-hit throughput table (measure.go): coordd,
// the floor and the polling baseline on one instance each, in slices
// taken in turn; with --quick in seconds, to iterate on the hot path
// (--cpuprofile profiles it).
// --gateway runs only the MCP gateway benchmark (gateway.go): agents
// calling the reference GitLab MCP server (npm; `make mcp-servers`) each
// with its own process, through three gateways each with its own cache,
// and through coordd's gateway on three instances sharing a Redis; then a
// cached call's latency and throughput against a bare Streamable HTTP
// server answering a constant tool.
// --quota runs only the quota benchmark (quota.go): three coordd
// instances, two tenants with a credential each, against a fake API with
// GitHub's rate limits scaled down, beside fleets with a fixed rate limit
// set 2× too high and 4× too low and a fleet of instances pacing by the
// headers alone; the full run (not --quick) runs it after the swarm and
// puts its table and plot in the report.
//
// With --report it also writes the report (machine facts, the command, the
// table) to FILE and the plots as PNG files beside it. --quick measures
// less (fewer rounds, 100,000 documents instead of 1,000,000 in L1, 1,000
// concurrent streams instead of 10,000) and finishes in under a minute on
// two cores. coordbench asserts nothing about speed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	if len(os.Args) > 1 && os.Args[1] == callersFlag {
		// A child running cold bursts' callers (callers.go).
		err := callersMain(os.Args[2:])
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "coordbench --callers:", err)
			os.Exit(1)
		}
		return
	}
	h := &host{}
	err := run(ctx, h, os.Args[1:], os.Stdout)
	stop()
	h.close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "coordbench:", err)
		os.Exit(1)
	}
}

// config is what the flags choose.
type config struct {
	quick     bool
	swarm     bool          // only the agent-swarm benchmark
	cold      bool          // only the cold path's figures
	quota     bool          // only the quota benchmark
	warm      bool          // only the warm-hit throughput table
	gateway   bool          // only the MCP gateway benchmark
	cpuProf   string        // CPU profile file; empty: none
	blockProf string        // block profile file; empty: none
	report    string        // report file; empty: none
	latency   time.Duration // the upstream's answer time
	small     int           // small body, bytes
	large     int           // large body, bytes

	maxK          int           // coordd instances started
	gridCallers   []int         // callers per cold burst in the grid (besides one per instance)
	gridRounds    int           // cold keys per grid cell, coordd
	pollRounds    int           // cold keys per grid cell, polling baseline
	lagCallers    int           // callers per follower-lag round
	lagRounds     int           // rounds per follower-lag cell
	coldRounds    int           // at-once bursts per cold-path cell, of coordd and of the floor each
	tputCallers   []int         // concurrent callers of the warm-hit curve
	tputDuration  time.Duration // per point of the warm-hit curve, at least
	tputPerCaller time.Duration // per point and caller: more callers, longer points
	docs          int           // documents put in L1 for the memory figure
	streams       int           // concurrent streams on one instance
	streamConns   int           // client connections carrying them
	quickNote     string        // said in the output when quick
	commandLine   string        // as run, for the report
	reportDirName string        // where the plots go (the report's directory)
}

func parseConfig(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("coordbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	quick := fs.Bool("quick", false, "measure less: fewer rounds, 100,000 documents in L1, 1,000 streams (under a minute on 2 cores)")
	var swarm bool
	fs.BoolVar(&swarm, "swarm", false, "run only the agent-swarm benchmark: MCP clients against three MCP fleets and an edge-limited MDN (with --quick: a smaller swarm)")
	fs.BoolVar(&swarm, "agents", false, "the same as --swarm")
	cold := fs.Bool("cold", false, "run only the cold path's figures: Redis round trips per step, and the leader's first answer against the floor's")
	cpuProf := fs.String("cpuprofile", "", "write a CPU profile of the run to `FILE`")
	blockProf := fs.String("blockprofile", "", "write a block profile of the run to `FILE` (every blocking event sampled)")
	warm := fs.Bool("warm", false, "run only the warm-hit throughput table: coordd, the floor and polling on one instance each (with --quick: in seconds)")
	gw := fs.Bool("gateway", false, "run only the MCP gateway benchmark: agents calling the reference GitLab MCP server directly, through gateways each with its own cache, and through coordd's gateway on 3 instances; then a cached call against a bare Streamable HTTP server (needs node and `make mcp-servers`)")
	quota := fs.Bool("quota", false, "run only the quota benchmark: coordd, fixed rate limits and per-instance pacing against a fake API with GitHub-like limits (with --quick: under a minute)")
	report := fs.String("report", "", "write the report to `FILE` (Markdown) and its plots as PNG files beside it")
	latency := fs.Duration("latency", 20*time.Millisecond, "the upstream's answer time, once every caller of a cold burst waits")
	small := fs.Int("small", 1<<10, "small body size in `bytes`")
	large := fs.Int("large", 100<<10, "large body size in `bytes`")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	switch {
	case *warm && (swarm || *cold || *quota || *report != ""):
		return config{}, errors.New("--warm prints the warm-hit throughput table only; the full run includes it")
	case *cold && (swarm || *report != ""):
		return config{}, errors.New("--cold prints the cold path's table only; the full run includes it")
	case swarm && *report != "":
		return config{}, errors.New("--swarm prints the swarm's table only; the full run with --report includes it")
	case *quota && *report != "":
		return config{}, errors.New("--quota prints the quota table only; the full run with --report includes it")
	case *quota && swarm:
		return config{}, errors.New("--quota and --swarm each run one benchmark alone; the full run runs both")
	case *small <= 0 || *large <= 0:
		return config{}, errors.New("--small and --large must be positive")
	case *latency < 0:
		return config{}, errors.New("--latency must not be negative")
	}
	c := config{
		cpuProf: *cpuProf, blockProf: *blockProf,
		quick: *quick, swarm: swarm, cold: *cold, quota: *quota, warm: *warm, gateway: *gw, report: *report, latency: *latency, small: *small, large: *large,
		maxK:          5,
		gridCallers:   []int{10, 100, 1000},
		gridRounds:    5,
		pollRounds:    2,
		lagCallers:    100,
		lagRounds:     10,
		coldRounds:    20,
		tputCallers:   []int{1, 10, 100, 1000},
		tputDuration:  2 * time.Second,
		tputPerCaller: 4 * time.Millisecond,
		docs:          1_000_000,
		streams:       10_000,
		streamConns:   8,
		commandLine:   "go -C cmd/coordbench run . " + strings.Join(args, " "),
	}
	if c.quick {
		c.gridRounds, c.pollRounds, c.lagRounds, c.coldRounds = 2, 1, 3, 8
		c.tputDuration, c.tputPerCaller = 300*time.Millisecond, 0
		c.docs, c.streams = 100_000, 1_000
		c.quickNote = "--quick: 100,000 documents in L1 instead of 1,000,000; 1,000 concurrent streams instead of 10,000; fewer rounds"
	}
	if c.warm {
		c.maxK = 1 // the curve uses one instance of each
	}
	if c.report != "" {
		c.reportDirName = filepath.Dir(c.report)
	}
	return c, nil
}

// run measures everything cfg asks for and prints the table to stdout.
func run(ctx context.Context, h *host, args []string, stdout io.Writer) error {
	cfg, err := parseConfig(args, os.Stderr)
	if err != nil {
		return err
	}
	if cfg.cpuProf != "" {
		f, err := os.Create(cfg.cpuProf)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if cfg.blockProf != "" {
		runtime.SetBlockProfileRate(1)
		defer func() {
			if f, err := os.Create(cfg.blockProf); err == nil {
				_ = pprof.Lookup("block").WriteTo(f, 0)
				_ = f.Close()
			}
		}()
	}
	started := time.Now()
	progress := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "coordbench: %5.1fs "+format+"\n", append([]any{time.Since(started).Seconds()}, a...)...)
	}
	if cfg.gateway {
		gr, err := runGateway(ctx, h, defaultGateway(cfg.quick), progress)
		if err != nil {
			return err
		}
		fmt.Fprint(stdout, renderGateway(gr))
		return nil
	}
	if cfg.swarm {
		sw, err := runSwarm(ctx, h, defaultSwarm(cfg.quick), progress)
		if err != nil {
			return err
		}
		fmt.Fprint(stdout, renderSwarm(sw))
		return nil
	}
	if cfg.cold {
		e := newEnv(h, cfg)
		progress("cold path: round trips per step, first answer")
		cells, err := e.measureCold(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "# coordbench --cold: the cold path's own cost\n%s", renderCold(cells, cfg))
		return nil
	}
	if cfg.warm {
		e := newEnv(h, cfg)
		progress("warm-hit throughput")
		tp, err := e.throughputCurve(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "# coordbench --warm: warm-hit throughput\n%s", renderWarm(tp, cfg))
		return nil
	}
	if cfg.quota {
		qr, err := runQuota(ctx, h, defaultQuota(cfg.quick), progress)
		if err != nil {
			return err
		}
		fmt.Fprint(stdout, renderQuota(qr))
		return nil
	}
	// The swarm and the quota benchmark first, before the grid's
	// environment fills the heap.
	sw, err := runSwarm(ctx, h, defaultSwarm(cfg.quick), progress)
	if err != nil {
		return err
	}
	// --quick leaves the quota benchmark out, to stay under a minute:
	// --quota --quick runs it alone.
	var qr *quotaResult
	if !cfg.quick {
		if qr, err = runQuota(ctx, h, defaultQuota(false), progress); err != nil {
			return err
		}
	}
	gr, err := runGateway(ctx, h, defaultGateway(cfg.quick), progress)
	if err != nil {
		return err
	}
	e := newEnv(h, cfg)
	res, err := measure(ctx, e, progress)
	if err != nil {
		return err
	}
	res.swarm, res.quota, res.gateway = sw, qr, gr
	res.elapsed = time.Since(started)
	table := renderTable(res)
	fmt.Fprint(stdout, table)
	if cfg.report == "" {
		return nil
	}
	if err := os.MkdirAll(cfg.reportDirName, 0o755); err != nil {
		return err
	}
	plots, err := drawPlots(res, cfg.reportDirName)
	if err != nil {
		return err
	}
	return os.WriteFile(cfg.report, []byte(renderReport(res, table, plots)), 0o644)
}

// host stands in for testing.TB where internal/testing/redistest needs one: it
// collects cleanups and runs them, last first, on close; Fatalf runs them
// and exits.
type host struct {
	mu       sync.Mutex // protects the fields below
	cleanups []func()
	failed   bool
}

func (h *host) Helper() {}

func (h *host) Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "coordbench: "+format+"\n", args...)
}

func (h *host) Fatalf(format string, args ...any) {
	h.mu.Lock()
	h.failed = true
	h.mu.Unlock()
	h.Logf(format, args...)
	h.close()
	os.Exit(1)
}

func (h *host) Cleanup(f func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cleanups = append(h.cleanups, f)
}

func (h *host) TempDir() string {
	dir, err := os.MkdirTemp("", "coordbench-")
	if err != nil {
		h.Fatalf("temp dir: %v", err)
	}
	h.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func (h *host) Failed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.failed
}

// close runs the cleanups, last registered first, once each.
func (h *host) close() {
	for {
		h.mu.Lock()
		n := len(h.cleanups)
		if n == 0 {
			h.mu.Unlock()
			return
		}
		f := h.cleanups[n-1]
		h.cleanups = h.cleanups[:n-1]
		h.mu.Unlock()
		f()
	}
}

// tputTime is each target's time at a point of the warm-hit curve with n
// callers. With 1,000 callers in 0.2 s slices each caller made one or two
// calls a slice, so the callers' start and the last calls' tail weighed as
// much as the hits, and the 100 KiB ratio read 85–109% from run to run; in
// 0.4 s slices it read 97–104%.
func (c config) tputTime(n int) time.Duration {
	return max(c.tputDuration, time.Duration(n)*c.tputPerCaller)
}

// tputSlices is how many slices each target's time at a point of the
// warm-hit curve is cut into: ten, or five when it is short (--quick).
func (c config) tputSlices() int {
	if c.tputDuration < time.Second {
		return 5
	}
	return 10
}
