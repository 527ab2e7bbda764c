// Command coordd serves coordd.v1.CoordinatorService: one upstream fetch per
// document across every instance, with the result pushed to every waiter.
//
//	coordd [--config FILE] [--listen ADDR] [--redis URL] [--upstream NAME=BASE_URL]...
//	       [--drain-delay DURATION] [--log-level LEVEL] [--log-format FORMAT]
//	       [--metrics-listen ADDR] [--http-listen ADDR] [--check-config] [--version]
//
// Each flag but --check-config and --version can also be set by the
// environment variable COORDD_<FLAG> (--metrics-listen: COORDD_METRICS_LISTEN).
// Flags beat the environment, which beats the --config file. With no Redis
// configured it runs as a single node.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/peterbourgon/ff/v3"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/version"
	"github.com/coordd/coordd/server"
)

func main() {
	ctx, hurry, stop := signalContext()
	defer stop()
	code := exitCode("coordd", runHurried(ctx, hurry, os.Args[1:], os.Stderr), os.Stderr)
	stop()
	os.Exit(code)
}

// errInterrupted is the cause of run's context when coordd was stopped by
// SIGINT (Ctrl-C): someone at a terminal, not a balancer to wait for.
var errInterrupted = errors.New("interrupted")

// signalContext returns ctx, which ends at the first SIGINT or SIGTERM and
// starts the drain (SIGINT with errInterrupted as its cause), and hurry,
// which ends at the second and makes the drain stop at once, cutting the
// calls in flight but still releasing the fill locks. A third signal
// kills.
func signalContext() (ctx, hurry context.Context, stop context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(context.Background())
	hurry, cancelHurry := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		defer signal.Stop(ch)
		select {
		case s := <-ch:
			if s == os.Interrupt {
				cancel(errInterrupted)
			}
			cancel(context.Canceled)
		case <-ctx.Done():
			return
		}
		select {
		case <-ch:
			cancelHurry()
		case <-hurry.Done():
		}
	}()
	return ctx, hurry, func() { cancelHurry(); cancel(context.Canceled) }
}

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// envPrefix prefixes the environment variable of each flag: --metrics-listen
// is also COORDD_METRICS_LISTEN.
const envPrefix = "COORDD"

// actionFlags do something other than configure coordd; they are read from
// the command line only, never from the environment (a COORDD_VERSION left
// in a container's environment must not turn coordd into a version
// printer).
var actionFlags = map[string]bool{"version": true, "check-config": true}

// usageError is a mistake on the command line: main exits 2 for it, as
// the flag package does. reported: the flag package already printed it,
// with the usage.
type usageError struct {
	err      error
	reported bool
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// flagHint adds to the flag package's error what to do next: the
// nearest flag to one that is not defined, and where they are all listed.
func flagHint(fs *flag.FlagSet, err error) error {
	if name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -"); ok {
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		if hint := closest(name, names); hint != "" {
			return fmt.Errorf("%w; did you mean --%s? (--help lists every flag)", err, hint)
		}
	}
	return fmt.Errorf("%w (--help lists every flag)", err)
}

// exitCode is the exit status for run's error: 0 for none or --help, 2 for
// a usage error, 1 for the rest. It prints the error (once) to stderr.
func exitCode(program string, err error, stderr io.Writer) int {
	var ue *usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		if !ue.reported {
			fmt.Fprintf(stderr, "%s: %v\n", program, err)
		}
		return 2
	}
	// One line an error: a configuration's errors come joined.
	for line := range strings.SplitSeq(err.Error(), "\n") {
		fmt.Fprintf(stderr, "%s: %s\n", program, line)
	}
	return 1
}

// fromEnv is a flag value set from its environment variable. A value it
// refuses is recorded in errs, quoted (the flag package's own errors say
// "parse error" and no more, which is enough on a command line the user
// sees, not for an environment variable), and not returned, so that ff
// goes on to the other variables and one run reports every bad one.
type fromEnv struct {
	flag.Value
	name string
	errs *[]error
}

func (e fromEnv) Set(v string) error {
	if err := e.Value.Set(v); err != nil {
		*e.errs = append(*e.errs, fmt.Errorf("environment: error setting flag %q from environment variable %q: invalid value %q: %w",
			e.name, flagEnvName(e.name), v, err))
	}
	return nil
}

// options are coordd's command line, once parsed.
type options struct {
	fc          fileConfig
	checkConfig bool
	version     bool
	// upstreamsFrom says where fc's upstreams come from: "config file",
	// "--upstream", "COORDD_UPSTREAM", "config file and --upstream"...;
	// "" when none is configured and the default is in force.
	upstreamsFrom string
	// strayEnv are the COORDD_* variables that configure nothing.
	strayEnv []strayVar
}

// parseArgs reads the command line and the environment, then the
// configuration file they name, and returns the configuration with
// precedence flags > COORDD_* environment variables > file > defaults.
// A mistake on the command line is a *usageError, returned at once; the
// configuration's errors (bad environment values, --upstream flags, the
// file's) are all reported, one per line (errors.Join), beside what was
// read despite them.
func parseArgs(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("coordd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "YAML configuration `file`")
	listen := fs.String("listen", "", "gRPC listen `address` (default 127.0.0.1:50051)")
	redisURL := fs.String("redis", "", "Redis `URL`, e.g. redis://127.0.0.1:6379/0 (absent: single-node mode)")
	checkConfig := fs.Bool("check-config", false, "check the configuration (file, environment and flags), print it resolved as YAML (secrets redacted), then exit without serving or connecting")
	drainDelay := fs.Duration("drain-delay", 0, "how long SIGTERM keeps serving while health reports NOT_SERVING (default 5s)")
	logFormat := fs.String("log-format", "", "log `format`: text or json (default text)")
	logLevel := fs.String("log-level", "", "least log `level` written: debug, info, warn or error (default info)")
	metricsListen := fs.String("metrics-listen", "", "serve Prometheus metrics on /metrics at this `address` (default: none)")
	pprofOn := fs.Bool("pprof", false, "serve net/http/pprof under /debug/pprof/ on the metrics listener (default: off)")
	httpListen := fs.String("http-listen", "", "serve the HTTP door (GET /v1/documents, POST /v1/invalidate) at this `address` (default: none)")
	var ups stringList
	fs.Var(&ups, "upstream", "upstream `NAME=BASE_URL`; repeatable; overrides or extends the file")
	version := fs.Bool("version", false, "print the version and build facts, then exit")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: coordd [flags]

coordd serves coordd.v1.CoordinatorService: one upstream fetch per document
across every instance. Settings come from, first to last: flags, COORDD_*
environment variables (--metrics-listen is COORDD_METRICS_LISTEN; one
upstream in COORDD_UPSTREAM), the --config file, defaults. --version and
--check-config are read from the command line only. See docs/configuration.md.

Flags:
`)
		fs.PrintDefaults()
	}

	// The environment first, through ff, into the same values (but
	// upstream's, kept apart so that --upstream replaces it rather than
	// adding to it); then the command line, which overrides it.
	env := flag.NewFlagSet("coordd", flag.ContinueOnError)
	env.SetOutput(io.Discard)
	var envUps stringList
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		switch {
		case actionFlags[f.Name]:
		case f.Name == "upstream":
			env.Var(fromEnv{&envUps, f.Name, &errs}, f.Name, f.Usage)
		default:
			env.Var(fromEnv{f.Value, f.Name, &errs}, f.Name, f.Usage)
		}
	})
	if err := ff.Parse(env, nil, ff.WithEnvVarPrefix(envPrefix)); err != nil {
		return options{}, fmt.Errorf("environment: %w", err)
	}
	// The flag package prints its error and the whole usage itself; coordd
	// prints the usage for --help only, and for a mistake one line with
	// what to do (the nearest flag to a mistyped one), as it does for a
	// mistyped YAML key or COORDD_* variable.
	usage := fs.Usage
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(stderr)
	if errors.Is(err, flag.ErrHelp) {
		usage()
		return options{}, err
	}
	if err != nil {
		return options{}, &usageError{err: flagHint(fs, err)}
	}
	if fs.NArg() > 0 {
		return options{}, &usageError{err: fmt.Errorf("unexpected argument %q: coordd takes flags only (--help lists them); a flag after it would be ignored", fs.Arg(0))}
	}
	upsFrom := "--upstream"
	if len(ups) == 0 {
		ups, upsFrom = envUps, "COORDD_UPSTREAM"
	}
	o := options{checkConfig: *checkConfig, version: *version}
	if o.version {
		return o, nil
	}
	fc := &o.fc
	if *configPath != "" {
		var err error
		if *fc, err = loadConfigFile(*configPath); err != nil {
			errs = append(errs, err)
		}
	}
	if *listen != "" {
		fc.Listen = *listen
	}
	if *redisURL != "" {
		fc.Redis = *redisURL
	}
	if *drainDelay != 0 {
		fc.DrainDelay = *drainDelay
	}
	if *logFormat != "" {
		fc.LogFormat = *logFormat
	}
	if *logLevel != "" {
		fc.LogLevel = *logLevel
	}
	if *metricsListen != "" {
		fc.MetricsListen = *metricsListen
	}
	if *httpListen != "" {
		fc.HTTPListen = *httpListen
	}
	if *pprofOn {
		fc.Pprof = true
	}
	o.strayEnv = strayEnv(os.Environ(), fs, fc)
	switch {
	case len(fc.Upstreams) > 0 && len(ups) > 0:
		o.upstreamsFrom = "config file and " + upsFrom
	case len(fc.Upstreams) > 0:
		o.upstreamsFrom = "config file"
	case len(ups) > 0:
		o.upstreamsFrom = upsFrom
	}
	for _, u := range ups {
		if err := fc.addUpstreamFlag(u); err != nil {
			errs = append(errs, err)
		}
	}
	if fc.Listen == "" {
		fc.Listen = "127.0.0.1:50051"
	}
	switch {
	case fc.ShutdownGrace < 0:
		errs = append(errs, fmt.Errorf("config: shutdown_grace: %v must not be negative", fc.ShutdownGrace))
	case fc.ShutdownGrace == 0:
		fc.ShutdownGrace = 10 * time.Second
	}
	switch {
	case fc.DrainDelay < 0:
		errs = append(errs, fmt.Errorf("config: drain_delay: %v must not be negative", fc.DrainDelay))
	case fc.DrainDelay == 0:
		fc.DrainDelay = 5 * time.Second
	}
	return o, errors.Join(errs...)
}

// run parses args, serves until ctx ends, then drains, taking the whole
// drain delay and shutdown grace.
func run(ctx context.Context, args []string, stderr *os.File) error {
	return runHurried(ctx, context.Background(), args, stderr)
}

// runHurried is run whose drain stops at once when hurry ends: the rest
// of the delay is skipped and the calls in flight are cut.
func runHurried(ctx, hurry context.Context, args []string, stderr *os.File) error {
	if len(args) > 0 && args[0] == "mcp" {
		return runMCP(ctx, args[1:], os.Stdin, os.Stdout, stderr)
	}
	o, err := parseArgs(args, stderr)
	var ue *usageError
	if errors.As(err, &ue) {
		return err
	}
	if o.version {
		fmt.Fprintln(os.Stdout, version.String("coordd"))
		return nil
	}
	// Every error of the configuration is gathered before coordd gives up,
	// so that one run (or one --check-config) reports them all.
	errs := splitErrors(err)
	fc := o.fc
	log, err := newLogger(stderr, fc.LogFormat, fc.LogLevel)
	if err != nil {
		errs = append(errs, err)
		log, _ = newLogger(stderr, "", "") // to log the rest with
	}
	warnStrayEnv(log, o.strayEnv)

	// go-redis logs through a global logger of its own; route it into ours,
	// at debug: coordd already logs Redis going down and coming back. Once:
	// the global is not safe to replace while clients run.
	setRedisLogger.Do(func() { redis.SetLogger(redisLogger{log.With("component", "go-redis")}) })

	cfg, err := fc.coordinatorConfig()
	errs = append(errs, splitErrors(err)...)
	cfg.Logger = log
	errs = append(errs, splitErrors(fc.scopeKey(&cfg))...)
	traceSettings, err := fc.Tracing.settings(os.Getenv)
	errs = append(errs, splitErrors(err)...)
	srvOpts, grpcOpts, httpTLS, certs, err := fc.serverOptions(log, fc.upstreamNames(), fc.mcpServerNames())
	errs = append(errs, splitErrors(err)...)
	_, err = checkMetrics(fc)
	errs = append(errs, splitErrors(err)...)
	rdb, err := redisClient(fc) // connects lazily: on first use
	errs = append(errs, splitErrors(err)...)
	gw, err := fc.newGateway(log, rdb, cfg.KeyPrefix)
	errs = append(errs, splitErrors(err)...)
	if gw != nil {
		if len(cfg.Upstreams) == 0 {
			cfg.Upstreams = []coordinator.Upstream{coordinator.DefaultUpstream()}
		}
		if len(fc.Tenants) == 0 {
			srvOpts = append(srvOpts, server.WithOpenUpstreams(fc.upstreamNames()))
		}
		cfg.Upstreams = append(cfg.Upstreams, gw.Upstreams()...)
		defer gw.Close()
	}
	if len(errs) > 0 || o.checkConfig {
		if rdb != nil {
			_ = rdb.Close()
		}
		if len(errs) > 0 {
			return errors.Join(errs...)
		}
		return checkConfig(fc, cfg, os.Stdout, stderr)
	}
	ms, err := listenMetrics(fc)
	if err != nil {
		return err
	}
	defer ms.close()
	ms.watchCert(certs)
	tr, err := startTracing(ctx, traceSettings, log)
	if err != nil {
		return err
	}
	defer tr.shutdown()                        // after c.Close: flushes the flights' spans
	var grpcServer atomic.Pointer[server.GRPC] // set once serving; Redis health may change before
	opts := coordinator.Options{Redis: rdb, Sentinel: fc.RedisSentinel != nil, Metrics: ms.coordinatorMetrics(), TracerProvider: tr.provider(), OnRedisHealth: func(up bool) {
		if g := grpcServer.Load(); g != nil {
			g.SetRedisHealth(up)
		}
	}}
	if gw != nil {
		opts.Transport = gw.Wrap(nil)
	}
	c, err := coordinator.New(cfg, opts)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	defer c.Close()
	if gw != nil {
		gw.Bind(c)
		if ms != nil {
			gw.SetMetrics(ms.reg)
			ms.reg.MCPServers(gw.Names())
			ms.mcp = gatewayStatus(gw)
		}
	}
	lis, err := net.Listen("tcp", fc.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	g := server.NewGRPC(server.New(c, log, srvOpts...), server.Config{MaxConcurrentCalls: fc.MaxConcurrentCalls}, append(append(grpcOpts, ms.grpcOptions()...), tr.grpcOptions()...)...)
	ms.serve(c, g.Server, lis.Addr().String(), log)
	door, err := listenHTTP(fc.HTTPListen, g, tr.instrumentHTTP(ms.instrumentHTTP(g.HTTPHandler())), httpTLS)
	if err != nil {
		_ = lis.Close()
		return err
	}
	var mcpDoor *httpDoor
	if gw != nil {
		if mcpDoor, err = listenHTTPAt("mcp_listen", fc.MCPListen, g, tr.instrumentHTTP(gw.Handler()), httpTLS); err != nil {
			_ = lis.Close()
			if door != nil {
				_ = door.lis.Close()
			}
			return err
		}
	}
	if rdb != nil {
		g.SetRedisHealth(c.RedisHealthy())
	}
	grpcServer.Store(g)
	mode := "single-node (no redis configured)"
	switch {
	case fc.RedisSentinel != nil:
		mode = "redis sentinel"
	case len(fc.RedisCluster) > 0:
		mode = "redis cluster"
	case rdb != nil:
		mode = "redis"
	}
	if rdb != nil && !c.RedisHealthy() {
		mode += " (unavailable: coordinating in-process until it answers)"
	}
	logUpstreams(log, fc.Upstreams, o.upstreamsFrom)
	log.Info("coordd serving", "addr", lis.Addr().String(), "mode", mode)

	stopCtx := ctx
	eg, ctx := errgroup.WithContext(ctx)
	eg.Go(func() error {
		// A drain hurried by a second signal may stop g before this
		// goroutine gets to Serve: that is a clean stop too.
		if err := g.Serve(lis); !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
		_ = lis.Close()
		return nil
	})
	delayFor := func() time.Duration {
		if errors.Is(context.Cause(stopCtx), errInterrupted) {
			return 0 // Ctrl-C: no balancer needs to see NOT_SERVING first
		}
		return fc.DrainDelay
	}
	eg.Go(func() error {
		<-ctx.Done()
		g.Drain(hurry, delayFor(), fc.ShutdownGrace)
		return nil
	})
	if door != nil {
		log.Info("http door serving", "addr", door.lis.Addr().String(), "tls", httpTLS != nil)
		eg.Go(door.serve)
		eg.Go(func() error {
			<-ctx.Done()
			door.drain(hurry, delayFor(), fc.ShutdownGrace)
			return nil
		})
	}
	if mcpDoor != nil {
		log.Info("mcp gateway serving", "addr", mcpDoor.lis.Addr().String(), "servers", gw.Names(), "tls", httpTLS != nil)
		eg.Go(mcpDoor.serve)
		eg.Go(func() error {
			<-ctx.Done()
			mcpDoor.drain(hurry, delayFor(), fc.ShutdownGrace)
			return nil
		})
	}
	err = eg.Wait()
	c.Close() // releases held locks
	if rdb != nil {
		_ = rdb.Close()
	}
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	log.Info("coordd stopped")
	return err
}

// checkConfig checks cfg as coordinator.New does, without Redis, then
// prints the configuration resolved from fc (file, environment and flags)
// and cfg, defaults filled in and secrets redacted, as YAML on stdout, and
// "configuration ok" on stderr. It binds no address and connects to
// nothing.
func checkConfig(fc fileConfig, cfg coordinator.Config, stdout io.Writer, stderr *os.File) error {
	c, err := coordinator.New(cfg, coordinator.Options{})
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	c.Close()
	resolved, err := fc.resolved()
	if err != nil {
		return err
	}
	if err := printRedacted(stdout, resolved); err != nil {
		return err
	}
	fmt.Fprintln(stderr, "coordd: configuration ok")
	return nil
}

// splitErrors returns the errors err joins (errors.Join), each of them
// split in turn; err alone if it joins none; none for nil.
func splitErrors(err error) []error {
	if err == nil {
		return nil
	}
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []error{err}
	}
	var out []error
	for _, e := range j.Unwrap() {
		out = append(out, splitErrors(e)...)
	}
	return out
}

func redisClient(fc fileConfig) (redis.UniversalClient, error) {
	if err := fc.validateRedis(); err != nil {
		return nil, err
	}
	timeout := fc.RedisTimeout
	if timeout == 0 {
		timeout = 500 * time.Millisecond
	}
	if sc := fc.RedisSentinel; sc != nil {
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: sc.MasterName, SentinelAddrs: sc.Addrs,
			Password: sc.Password, SentinelPassword: sc.SentinelPassword,
			DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout,
			ContextTimeoutEnabled: true,
		}), nil
	}
	if len(fc.RedisCluster) > 0 {
		o := &redis.ClusterOptions{
			Addrs: fc.RedisCluster, DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout,
			ContextTimeoutEnabled: true,
		}
		if err := fc.secureRedisCluster(o); err != nil {
			return nil, err
		}
		return redis.NewClusterClient(o), nil
	}
	if fc.Redis == "" {
		return nil, nil
	}
	o, err := redis.ParseURL(fc.Redis)
	if err != nil {
		return nil, fmt.Errorf("config: redis: %w", err)
	}
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout = timeout, timeout, timeout
	o.ContextTimeoutEnabled = true
	if err := fc.secureRedis(o); err != nil {
		return nil, err
	}
	return redis.NewClient(o), nil
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

var setRedisLogger sync.Once

// redisLogger adapts slog to go-redis's logger interface.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, fmt.Sprintf(format, v...))
}
