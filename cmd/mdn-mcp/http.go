package main

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/coordd/coordd/internal/drain"
)

// httpConfig configures serveHTTP.
type httpConfig struct {
	// addr is where to listen, host:port.
	addr string
	// token, if set, is the bearer token every MCP request must carry
	// ($MDN_MCP_TOKEN). /healthz needs none.
	token string
	// allowedOrigins are the browser origins admitted at /mcp
	// (--allowed-origins, $MDN_MCP_ALLOWED_ORIGINS); a request with any
	// other Origin header gets 403. Default: none.
	allowedOrigins map[string]bool
	// drainDelay is how long /healthz answers 503 after SIGTERM while
	// requests are still served, so that the balancer takes the replica out
	// of rotation before it stops accepting. Default: 0.
	drainDelay time.Duration
	// grace bounds how long requests in flight may run once the replica
	// stops accepting; those still running then are cut. Default: 10s.
	grace time.Duration
}

// mcpPath is where MCP Streamable HTTP is served.
const mcpPath = "/mcp"

// serveHTTP serves s over MCP Streamable HTTP at /mcp, and /healthz, until
// ctx ends; then it drains: /healthz turns 503 for drainDelay, the listener
// closes, and requests in flight get up to grace to finish. ready, if not
// nil, is called with the address once the listener is open.
//
// The transport is stateless: no Mcp-Session-Id is issued or read, every
// request carries all it needs, so any replica behind a round-robin
// balancer answers any request, with no session affinity.
func serveHTTP(ctx context.Context, cfg httpConfig, s *mcp.Server, log *slog.Logger, ready func(addr string)) error {
	if cfg.grace <= 0 {
		cfg.grace = 10 * time.Second
	}
	lis, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return fmt.Errorf("--http: %w", err)
	}
	var draining atomic.Bool
	mcpHandler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{
		Stateless: true,
		Logger:    log,
	})
	mux := http.NewServeMux()
	mux.Handle(mcpPath, requireOrigin(cfg.allowedOrigins, requireToken(cfg.token, checkJSONRPC(mcpHandler))))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if draining.Load() {
			http.Error(w, "draining", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	srv := &http.Server{
		Handler:           refuseTransferEncoding(mux),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	// Shutdown closes the listener before it calls these.
	srv.RegisterOnShutdown(func() {
		log.Info("draining: no longer accepting; finishing requests in flight", "grace", cfg.grace)
	})
	served := make(chan error, 1)
	failed, fail := context.WithCancel(context.Background()) // Serve failed: nothing left to drain
	defer fail()
	go func() {
		err := srv.Serve(lis)
		if !errors.Is(err, http.ErrServerClosed) { // not Shutdown's doing
			fail()
		}
		served <- err
	}()
	log.Info("serving MCP Streamable HTTP", "url", "http://"+lis.Addr().String()+mcpPath, "auth", cfg.token != "")
	if ready != nil {
		ready(lis.Addr().String())
	}

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	draining.Store(true)
	log.Info("draining: /healthz answers 503", "drain_delay", cfg.drainDelay)
	if err := drain.Drain(failed, srv, cfg.drainDelay, cfg.grace); err != nil {
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			return err // Serve failed, during the delay or the grace
		}
		return err
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	log.Info("drained")
	return nil
}

// requireToken lets through requests that carry "Authorization: Bearer
// token", and answers others 401 with a WWW-Authenticate challenge (RFC
// 6750). An empty token lets everything through.
//
// Hand-rolled rather than the go-sdk's auth.RequireBearerToken: that
// middleware expects OAuth token information (an expiry, scopes) and sends
// a challenge only with protected resource metadata, which a static shared
// token has none of.
func requireToken(token string, next http.Handler) http.Handler {
	if token == "" {
		return next
	}
	want := []byte(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="mdn-mcp"`)
			http.Error(w, "mdn-mcp: a valid bearer token is required (Authorization: Bearer ...)", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// refuseTransferEncoding answers 400 and closes the connection for a
// request that carries Transfer-Encoding, on every path. With
// Content-Length too (RFC 9112 §6.3) that is how requests are smuggled
// past a front proxy that frames by Content-Length; and an MCP request is
// bounded JSON that needs no chunking. net/http has already dropped the
// Content-Length header of such a request and read its body as chunked:
// r.TransferEncoding is what tells.
func refuseTransferEncoding(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TransferEncoding) > 0 {
			w.Header().Set("Connection", "close")
			http.Error(w, "mdn-mcp: Transfer-Encoding is not accepted; send the body with Content-Length", http.StatusBadRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}
