package server

import (
	"container/list"
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"sync"
	"time"
)

// Timeouts of the listeners, besides Config's bounds.
const (
	// handshakeTimeout bounds a connection's TLS handshake and, on the
	// gRPC listener, its HTTP/2 preface; on the HTTP door, the reading of
	// a request's headers (ReadHeaderTimeout).
	handshakeTimeout = 10 * time.Second
	// httpIdleTimeout closes a kept-alive HTTP connection that has had no
	// request for this long, as the gRPC listener's MaxConnectionIdle.
	httpIdleTimeout = 5 * time.Minute
)

// HTTPServer returns the http.Server that serves h, the HTTP door
// (HTTPHandler, possibly wrapped by instrumentation), with TLS config
// tlsCfg when not nil (the caller wraps the listener). Its bounds protect
// the callers that hold a token from those that do not:
//
//   - a request's headers must arrive within 10s (ReadHeaderTimeout);
//   - its body within Config.HTTPBodyTimeout, read before the call takes a
//     slot of Config.MaxConcurrentCalls (the door does that);
//   - at most Config.HTTPMaxPendingConns connections may be waiting for a
//     request's headers and Config.HTTPMaxIdleConns idle between requests;
//     past either, the oldest such connection is closed;
//   - an idle connection is closed after 5 minutes.
func (g *GRPC) HTTPServer(h http.Handler, tlsCfg *tls.Config) *http.Server {
	cfg := g.door.cfg
	b := newConnBounds(cfg.HTTPMaxPendingConns, cfg.HTTPMaxIdleConns)
	return &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b.serving(r.Context())
			// The door sets the body's read deadline on this writer: the
			// wrappers of h (metrics, traces) may not unwrap to it.
			h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), rawWriterKey{}, w)))
		}),
		ReadHeaderTimeout: handshakeTimeout,
		IdleTimeout:       httpIdleTimeout,
		TLSConfig:         tlsCfg,
		ConnState:         b.connState,
		ConnContext:       b.connContext,
	}
}

type rawWriterKey struct{}

// responseController is the controller of the connection's own
// ResponseWriter where HTTPServer put it in ctx, else of w.
func responseController(ctx context.Context, w http.ResponseWriter) *http.ResponseController {
	if raw, ok := ctx.Value(rawWriterKey{}).(http.ResponseWriter); ok {
		return http.NewResponseController(raw)
	}
	return http.NewResponseController(w)
}

// connBounds caps a listener's connections that are waiting for a request's
// headers (pending) and those idle between requests, closing the oldest
// of a kind past its cap. Hand-rolled: net/http bounds the time of each
// (ReadHeaderTimeout, IdleTimeout) but not their number, and
// golang.org/x/net/netutil.LimitListener caps all connections, busy ones
// included, so that a crowd of idle sockets would lock callers out.
type connBounds struct {
	maxPending, maxIdle int

	mu      sync.Mutex                // protects what follows
	conns   map[net.Conn]*trackedConn // every open connection
	pending list.List                 // of *trackedConn, oldest first
	idle    list.List                 // of *trackedConn, oldest first
}

// trackedConn is a connection and where it stands in connBounds.
type trackedConn struct {
	c    net.Conn
	in   *list.List    // &pending, &idle, or nil: serving, or closed
	elem *list.Element // its element in in
}

type trackedConnKey struct{}

func newConnBounds(maxPending, maxIdle int) *connBounds {
	return &connBounds{maxPending: maxPending, maxIdle: maxIdle, conns: make(map[net.Conn]*trackedConn)}
}

// connContext registers a new connection (net/http calls it before
// ConnState's StateNew) and tags its context, so that serving finds it.
func (b *connBounds) connContext(ctx context.Context, c net.Conn) context.Context {
	tc := &trackedConn{c: c}
	b.mu.Lock()
	b.conns[c] = tc
	b.mu.Unlock()
	return context.WithValue(ctx, trackedConnKey{}, tc)
}

func (b *connBounds) connState(c net.Conn, st http.ConnState) {
	var evict net.Conn
	b.mu.Lock()
	tc := b.conns[c]
	switch {
	case tc == nil:
	case st == http.StateNew:
		evict = b.move(tc, &b.pending, b.maxPending)
	case st == http.StateActive && tc.in == &b.idle:
		// The first byte of the next request is in, its headers not yet.
		evict = b.move(tc, &b.pending, b.maxPending)
	case st == http.StateIdle:
		evict = b.move(tc, &b.idle, b.maxIdle)
	case st == http.StateHijacked || st == http.StateClosed:
		b.move(tc, nil, 0)
		delete(b.conns, c)
	}
	b.mu.Unlock()
	if evict != nil {
		// Not under mu: closing a TLS connection sends an alert, which
		// may block.
		go evict.Close()
	}
}

// serving marks the connection of a request's context as serving a
// request: its headers are in.
func (b *connBounds) serving(ctx context.Context) {
	tc, ok := ctx.Value(trackedConnKey{}).(*trackedConn)
	if !ok {
		return
	}
	b.mu.Lock()
	if tc.in == &b.pending {
		b.move(tc, nil, 0)
	}
	b.mu.Unlock()
}

// move takes tc out of its list and into to (nil: none); past max, the
// oldest connection of to is taken out and returned, to be closed.
func (b *connBounds) move(tc *trackedConn, to *list.List, max int) net.Conn {
	if tc.in != nil {
		tc.in.Remove(tc.elem)
		tc.in, tc.elem = nil, nil
	}
	if to == nil {
		return nil
	}
	tc.in, tc.elem = to, to.PushBack(tc)
	if to.Len() <= max {
		return nil
	}
	oldest := to.Front().Value.(*trackedConn)
	to.Remove(oldest.elem)
	oldest.in, oldest.elem = nil, nil
	return oldest.c
}
