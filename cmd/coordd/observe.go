package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"

	"google.golang.org/grpc"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/logctx"
	"github.com/coordd/coordd/server/metrics"
	"github.com/coordd/coordd/server/statuspage"
)

// newLogger returns coordd's logger: lines of format ("text", the default,
// or "json") on w from level ("info" by default) up. Its handler is a
// logctx.Handler, so that every line of a call carries the call's
// request_id and key.
func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(strings.ToLower(orDefault(level, "info")))); err != nil {
		return nil, fmt.Errorf("config: log_level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler
	switch strings.ToLower(orDefault(format, "text")) {
	case "text":
		h = slog.NewTextHandler(w, opts)
	case "json":
		h = slog.NewJSONHandler(w, opts)
	default:
		return nil, fmt.Errorf("config: log_format: %q must be text or json", format)
	}
	return slog.New(logctx.NewHandler(h)), nil
}

// metricsServer is the metrics listener: Prometheus metrics on /metrics,
// the live status page on /status and /status.json (server/statuspage),
// and, with pprof, net/http/pprof under /debug/pprof/; all of it behind
// metrics_auth's tokens when set. A nil *metricsServer (no metrics_listen)
// does nothing.
type metricsServer struct {
	reg    *metrics.Registry
	lis    net.Listener
	srv    *http.Server
	tokens []string // metrics_auth's; none: open
	pprof  bool
	mcp    func() []statuspage.MCPServerView // the MCP gateway's servers; nil: none
}

// checkMetrics checks fc's metrics settings, binding nothing, and returns
// the tokens the metrics listener wants.
func checkMetrics(fc fileConfig) ([]string, error) {
	tokens, err := fc.metricsTokens()
	if err != nil {
		return nil, err
	}
	if fc.MetricsListen == "" && fc.Pprof {
		return nil, errors.New("config: pprof: needs metrics_listen (--metrics-listen), where /debug/pprof/ is served")
	}
	return tokens, nil
}

// listenMetrics listens on fc's metrics_listen; nil when it is empty.
// Listening before anything else starts makes a bad address fail coordd
// at once; the settings are checked before that (checkMetrics).
func listenMetrics(fc fileConfig) (*metricsServer, error) {
	tokens, err := checkMetrics(fc)
	if err != nil || fc.MetricsListen == "" {
		return nil, err
	}
	lis, err := net.Listen("tcp", fc.MetricsListen)
	if err != nil {
		return nil, fmt.Errorf("config: metrics_listen: %w", err)
	}
	reg := metrics.New()
	return &metricsServer{reg: reg, lis: lis, srv: reg.HTTPServer(), tokens: tokens, pprof: fc.Pprof}, nil
}

// handler is everything the metrics listener serves for c: instance names
// c in the status page's title.
func (m *metricsServer) handler(c *coordinator.Coordinator, instance string, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.reg.Handler())
	var opts []statuspage.Option
	if m.mcp != nil {
		opts = append(opts, statuspage.WithMCPServers(m.mcp))
	}
	page := statuspage.Handler(c, instance, log, opts...)
	mux.Handle(statuspage.PagePath, page)
	mux.Handle(statuspage.JSONPath, page)
	mux.Handle(clearQuotasPath, clearQuotas(c, log))
	if m.pprof {
		// Registered on this mux, not http.DefaultServeMux, so that
		// importing net/http/pprof exposes nothing by itself.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return requireToken(m.tokens, mux)
}

// clearQuotasPath is where an operator clears the quotas learned of an
// upstream: POST /status/quotas/clear?upstream=NAME (docs/upstream-protection.md).
const clearQuotasPath = "/status/quotas/clear"

// clearQuotas serves clearQuotasPath: it forgets the quotas learned of
// the upstream named and the backoff a spent one set, on every instance
// sharing Redis, and answers what it did as JSON. It is behind
// metrics_auth with the rest of the listener; a browser's cross-origin
// POST is refused (http.CrossOriginProtection), so that Basic credentials
// a browser remembers cannot be used by another site.
func clearQuotas(c *coordinator.Coordinator, log *slog.Logger) http.Handler {
	return http.NewCrossOriginProtection().Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "POST "+clearQuotasPath+"?upstream=NAME clears the quotas learned of an upstream", http.StatusMethodNotAllowed)
			return
		}
		name := r.URL.Query().Get("upstream")
		if name == "" {
			http.Error(w, "upstream=NAME is required, one of: "+strings.Join(c.Upstreams(), ", "), http.StatusBadRequest)
			return
		}
		err := c.ClearQuotas(r.Context(), name)
		answer := map[string]any{"upstream": name, "cleared": "fleet"}
		code := http.StatusOK
		switch {
		case errors.Is(err, coordinator.ErrUnknownUpstream):
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		case err != nil:
			// This instance's are cleared; Redis did not answer.
			answer["cleared"], answer["error"], code = "instance", err.Error(), http.StatusServiceUnavailable
		}
		log.Info("learned quotas cleared", "upstream", name, "cleared", answer["cleared"], "remote", r.RemoteAddr)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(answer)
	}))
}

// coordinatorMetrics is the coordinator.Options.Metrics to use.
func (m *metricsServer) coordinatorMetrics() coordinator.Metrics {
	if m == nil {
		return nil // not a nil *Registry in an interface
	}
	return m.reg
}

// watchCert exports the expiry of the certificate certs serves; nothing
// without TLS (nil certs).
func (m *metricsServer) watchCert(certs *certReloader) {
	if m == nil || certs == nil {
		return
	}
	m.reg.WatchTLSCert(certs.notAfter)
}

// grpcOptions are the gRPC server options that record grpc_server_*.
func (m *metricsServer) grpcOptions() []grpc.ServerOption {
	if m == nil {
		return nil
	}
	return m.reg.ServerOptions()
}

// serve exports c's and g's metrics and serves the listener until close.
func (m *metricsServer) serve(c *coordinator.Coordinator, g *grpc.Server, instance string, log *slog.Logger) {
	if m == nil {
		return
	}
	m.reg.Watch(c, g)
	m.srv.Handler = m.handler(c, instance, log)
	log.Info("metrics serving", "addr", m.lis.Addr().String(), "paths", "/metrics /status /status.json", "pprof", m.pprof, "auth", len(m.tokens) > 0)
	go func() {
		if err := m.srv.Serve(m.lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server failed", "err", err)
		}
	}()
}

// close stops serving; scrapes in progress are cut.
func (m *metricsServer) close() {
	if m == nil {
		return
	}
	_ = m.srv.Close()
	_ = m.lis.Close()
}

// instrumentHTTP wraps the HTTP door's handler to record its metrics.
func (m *metricsServer) instrumentHTTP(h http.Handler) http.Handler {
	if m == nil {
		return h
	}
	return m.reg.InstrumentHTTP(h)
}
