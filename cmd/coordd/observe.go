package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"

	"google.golang.org/grpc"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/logctx"
	"github.com/coordd/coordd/internal/metrics"
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

// metricsServer serves Prometheus metrics on /metrics. A nil
// *metricsServer (no metrics_listen) does nothing.
type metricsServer struct {
	reg *metrics.Registry
	lis net.Listener
	srv *http.Server
}

// listenMetrics listens on addr; nil for an empty addr. Listening before
// anything else starts makes a bad address fail coordd at once.
func listenMetrics(addr string) (*metricsServer, error) {
	if addr == "" {
		return nil, nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("config: metrics_listen: %w", err)
	}
	reg := metrics.New()
	return &metricsServer{reg: reg, lis: lis, srv: reg.HTTPServer()}, nil
}

// coordinatorMetrics is the coordinator.Options.Metrics to use.
func (m *metricsServer) coordinatorMetrics() coordinator.Metrics {
	if m == nil {
		return nil // not a nil *Registry in an interface
	}
	return m.reg
}

// grpcOptions are the gRPC server options that record grpc_server_*.
func (m *metricsServer) grpcOptions() []grpc.ServerOption {
	if m == nil {
		return nil
	}
	return m.reg.ServerOptions()
}

// serve exports c's and g's metrics and serves them until close.
func (m *metricsServer) serve(c *coordinator.Coordinator, g *grpc.Server, log *slog.Logger) {
	if m == nil {
		return
	}
	m.reg.Watch(c, g)
	log.Info("metrics serving", "addr", m.lis.Addr().String(), "path", "/metrics")
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
