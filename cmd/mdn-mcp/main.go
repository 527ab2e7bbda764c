// Command mdn-mcp is an MCP server that lets an assistant read MDN Web
// Docs. Its tools are mdn_doc (a page as markdown) and mdn_search (MDN's
// search). Every request to MDN goes through coordd, so that many
// assistants asking for the same page cost MDN one request.
//
//	mdn-mcp [--coordd ADDR] [--mdn-base URL] [--timeout DURATION]
//	        [--coordd-token TOKEN] [--coordd-tls] [--coordd-tls-ca FILE]
//	        [--coordd-tls-cert FILE --coordd-tls-key FILE]
//	        [--http ADDR [--allowed-origins ORIGINS] [--drain-delay DURATION]
//	        [--shutdown-grace DURATION]]
//	mdn-mcp --version
//
// coordd must list the --mdn-base URL among its upstreams (MDN is its
// default), and grant it to the token's tenant if it requires tokens. The
// token is best given as $COORDD_TOKEN, out of sight of ps. The server
// speaks MCP on stdin and stdout and logs to stderr; with --http it serves
// MCP Streamable HTTP at /mcp instead, stateless (any replica behind a
// round-robin balancer answers any request), with /healthz, draining on
// SIGTERM, refusing (403) any browser Origin not listed in
// --allowed-origins, and, if $MDN_MCP_TOKEN is set, requiring that bearer
// token of MCP clients.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	coordd "github.com/coordd/coordd/clients/go"
	buildinfo "github.com/coordd/coordd/internal/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := exitCode(run(ctx, os.Args[1:], os.Stderr), os.Stderr)
	stop()
	os.Exit(code)
}

// usageError is a mistake on the command line: main exits 2 for it, as
// the flag package does. reported: the flag package already printed it,
// with the usage.
type usageError struct {
	err      error
	reported bool
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// exitCode is the exit status for run's error: 0 for none or --help, 2 for
// a usage error, 1 for the rest. It prints the error (once) to stderr.
func exitCode(err error, stderr io.Writer) int {
	var ue *usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		if !ue.reported {
			fmt.Fprintln(stderr, "mdn-mcp:", err)
		}
		return 2
	}
	fmt.Fprintln(stderr, "mdn-mcp:", err)
	return 1
}

// run parses args and serves MCP on stdin and stdout until the client
// hangs up or ctx ends.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("mdn-mcp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	// run prints the usage itself: on stdout for --help, on stderr after a
	// mistake (which the flag package reports first).
	fs.Usage = func() {}
	addr := fs.String("coordd", "127.0.0.1:50051", "coordd's gRPC `address`: host:port (resolved through DNS, every address used) or a gRPC target such as dns:///coordd:50051")
	baseFlag := fs.String("mdn-base", "https://developer.mozilla.org", "MDN's base `URL`; coordd must have it as an upstream")
	timeout := fs.Duration("timeout", 30*time.Second, "deadline of one tool call's fetch through coordd, retries included, such as 30s, 1500ms or 2m")
	var sec coorddSecurity
	fs.StringVar(&sec.token, "coordd-token", "", "bearer `token` for a coordd that requires one (default $COORDD_TOKEN, which keeps it out of sight of ps)")
	fs.BoolVar(&sec.tls, "coordd-tls", false, "dial coordd over TLS, trusting the system's roots")
	fs.StringVar(&sec.caFile, "coordd-tls-ca", "", "dial coordd over TLS, trusting the CAs in this PEM `file`")
	fs.StringVar(&sec.certFile, "coordd-tls-cert", "", "client certificate PEM `file`, for a coordd that requires one (mutual TLS); with --coordd-tls-key")
	fs.StringVar(&sec.keyFile, "coordd-tls-key", "", "the client certificate's key PEM `file`; with --coordd-tls-cert")
	httpAddr := fs.String("http", "", "serve MCP Streamable HTTP at http://`ADDR`/mcp (host:port, or :port for every interface) instead of stdio, stateless; MCP clients must send $MDN_MCP_TOKEN as a bearer token if it is set")
	drainDelay := fs.Duration("drain-delay", 0, "with --http: how long /healthz answers 503 after SIGTERM before the listener closes, for the balancer to notice")
	originsFlag := fs.String("allowed-origins", "", "with --http: comma-separated `origins` (scheme://host[:port]) of browser front-ends admitted at /mcp; a request with any other Origin header gets 403 (default $MDN_MCP_ALLOWED_ORIGINS, else none)")
	grace := fs.Duration("shutdown-grace", 10*time.Second, "with --http: how long requests in flight may run once the listener is closed")
	showVersion := fs.Bool("version", false, "print the version and build facts, then exit")
	switch err := fs.Parse(args); {
	case errors.Is(err, flag.ErrHelp):
		writeUsage(os.Stdout, fs)
		return err
	case err != nil:
		writeUsage(stderr, fs)
		return &usageError{err: err, reported: true}
	}
	if err := applyEnvDefaults(fs); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return &usageError{err: fmt.Errorf("unexpected arguments %q: mdn-mcp takes flags only (--help lists them); a flag after them would be ignored", fs.Args())}
	}
	if *showVersion {
		fmt.Fprintln(os.Stdout, buildinfo.String("mdn-mcp"))
		return nil
	}
	base, err := url.Parse(*baseFlag)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" || base.RawQuery != "" || base.Fragment != "" {
		return fmt.Errorf("--mdn-base %q: want an absolute http(s) URL without query or fragment", *baseFlag)
	}
	if *timeout <= 0 {
		return fmt.Errorf("--timeout %v: must be positive", *timeout)
	}
	allowedOrigins, err := parseOrigins(*originsFlag)
	if err != nil {
		return err
	}
	if *drainDelay < 0 || *grace <= 0 {
		return fmt.Errorf("--drain-delay %v, --shutdown-grace %v: want >= 0 and > 0", *drainDelay, *grace)
	}
	// A stdio server logs problems only; an HTTP one, a service, its
	// lifecycle too.
	level := slog.LevelWarn
	if *httpAddr != "" {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})).With("component", "mdn-mcp")

	secOpts, err := sec.options()
	if err != nil {
		return err
	}
	client, err := coordd.Dial(*addr, append(secOpts, coordd.WithTimeout(*timeout))...)
	if err != nil {
		return err
	}
	defer client.Close()

	s := newServer(&mdn{docs: client, base: base, coordd: *addr, log: log}, buildinfo.Current())
	if *httpAddr != "" {
		return serveHTTP(ctx, httpConfig{addr: *httpAddr, token: os.Getenv("MDN_MCP_TOKEN"), allowedOrigins: allowedOrigins, drainDelay: *drainDelay, grace: *grace}, s, log, nil)
	}
	err = s.Run(ctx, &mcp.StdioTransport{})
	if errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}
