package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/coordd/coordd/internal/drain"
	"github.com/coordd/coordd/server"
)

// httpDoor serves the HTTP door (server.GRPC.HTTPHandler) on its own
// listener. A nil *httpDoor (no http_listen) is never served.
type httpDoor struct {
	lis net.Listener
	srv *http.Server
}

// listenHTTP listens on addr for the HTTP door of g, served by h (its
// handler, instrumented), over TLS with cfg when not nil; nil for an empty
// addr.
func listenHTTP(addr string, g *server.GRPC, h http.Handler, cfg *tls.Config) (*httpDoor, error) {
	return listenHTTPAt("http_listen", addr, g, h, cfg)
}

// listenHTTPAt is listenHTTP for the listener configured as field.
func listenHTTPAt(field, addr string, g *server.GRPC, h http.Handler, cfg *tls.Config) (*httpDoor, error) {
	if addr == "" {
		return nil, nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("config: %s: %w", field, err)
	}
	if cfg != nil {
		lis = tls.NewListener(lis, cfg)
	}
	return &httpDoor{lis: lis, srv: g.HTTPServer(h, cfg)}, nil
}

// serve serves until drain.
func (d *httpDoor) serve() error {
	if err := d.srv.Serve(d.lis); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http door: %w", err)
	}
	return nil
}

// drain goes on serving for delay, as the gRPC server does while health
// says NOT_SERVING, then closes the listener and lets calls in progress
// finish within grace before it cuts them; when hurry ends, at once
// (drain.Drain).
func (d *httpDoor) drain(hurry context.Context, delay, grace time.Duration) {
	_ = drain.Drain(hurry, d.srv, delay, grace)
}
