package server_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/server"
)

// Hostile callers at the doors (issue 21): stalled bodies, stalled
// streams, request smuggling, crowds of silent or idle connections.

// startDoor runs one instance with tenants (testTenants), its HTTP door
// and metrics, over a fake upstream named "a" (and "b"), with cfg.
func startDoor(t *testing.T, cfg server.Config) (*fleettest.Instance, *fakeupstream.Upstream) {
	t.Helper()
	a, err := server.NewAuth(testTenants)
	if err != nil {
		t.Fatal(err)
	}
	u := fakeupstream.New(t)
	in := fleettest.Start(t, fleettest.Options{
		Config: coordinator.Config{
			Upstreams: []coordinator.Upstream{{Name: "a", BaseURL: u.URL() + "/a"}, {Name: "b", BaseURL: u.URL() + "/b"}},
			Logger:    slog.New(slog.DiscardHandler),
		},
		Server:        cfg,
		ServerOptions: []server.Option{server.WithAuth(a)},
		HTTP:          true,
		Metrics:       true,
	})
	return in, u
}

// rawConn is a plain TCP connection to the door, read line by line.
type rawConn struct {
	net.Conn
	r *bufio.Reader
}

func dialDoor(t *testing.T, in *fleettest.Instance) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(in.HTTPURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{Conn: c, r: bufio.NewReader(c)}
}

func (c *rawConn) send(t *testing.T, s string) {
	t.Helper()
	if _, err := io.WriteString(c, s); err != nil {
		t.Fatalf("write: %v", err)
	}
}

// response reads one response (a 1xx included) within ctx's deadline.
func (c *rawConn) response(ctx context.Context) (*http.Response, error) {
	dl, _ := ctx.Deadline()
	_ = c.SetReadDeadline(dl)
	defer c.SetReadDeadline(time.Time{})
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		return nil, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp, err
}

// closed waits, within ctx's deadline, for the server to close c: a read
// that ends in EOF (or a reset) rather than data or the deadline.
func (c *rawConn) closed(ctx context.Context) error {
	dl, _ := ctx.Deadline()
	_ = c.SetReadDeadline(dl)
	return c.readEOF()
}

// readEOF reads one byte under the read deadline already set: nil if the
// connection was closed instead.
func (c *rawConn) readEOF() error {
	b, err := c.r.ReadByte()
	var ne net.Error
	switch {
	case err == nil:
		return fmt.Errorf("read %q; want the connection closed", b)
	case errors.As(err, &ne) && ne.Timeout():
		return errors.New("still open at the deadline; want it closed")
	}
	return nil
}

// A stalled request holds no call slot: with max_concurrent_calls 2, more
// than 2 callers that stall (HTTP bodies that never finish, with and
// without a token; gRPC streams that never send their request) leave
// authenticated callers answered at once on both doors.
func TestStalledCallersHoldNoSlot(t *testing.T) {
	const limit = 2
	in, u := startDoor(t, server.Config{MaxConcurrentCalls: limit, HTTPBodyTimeout: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	invalidate := "POST " + server.HTTPInvalidatePath + " HTTP/1.1\r\nHost: coordd\r\nContent-Type: application/json\r\nContent-Length: 100\r\nExpect: 100-continue\r\n"

	// HTTP callers with a token whose body stalls: 100 Continue says the
	// door is reading their body; then 10 of its 100 bytes come.
	for range limit + 1 {
		c := dialDoor(t, in)
		c.send(t, invalidate+"Authorization: Bearer "+tokenB+"\r\n\r\n")
		resp, err := c.response(ctx)
		if err != nil {
			t.Fatalf("stalled caller with a token: %v", err)
		}
		if resp.StatusCode != http.StatusContinue {
			t.Fatalf("stalled caller with a token: %s; want 100 Continue", resp.Status)
		}
		c.send(t, `{"url": "h`)
	}
	// Callers without a token are refused before their body is read.
	for range limit + 1 {
		c := dialDoor(t, in)
		c.send(t, invalidate+"\r\n")
		resp, err := c.response(ctx)
		if err != nil {
			t.Fatalf("stalled caller without a token: %v", err)
		}
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("stalled caller without a token: %s; want 401", resp.Status)
		}
	}
	// gRPC streams with a token that never send their request message.
	stalled := in.Conn(t, grpc.WithPerRPCCredentials(bearer(tokenB)))
	desc := &grpc.StreamDesc{StreamName: "GetOrFetch", ServerStreams: true, ClientStreams: true}
	const started = "grpc_server_started_total"
	before := in.Scrape(t).Value(started, "grpc_method", "GetOrFetch")
	for range limit + 1 {
		if _, err := stalled.NewStream(ctx, desc, "/coordd.v1.CoordinatorService/GetOrFetch"); err != nil {
			t.Fatal(err)
		}
	}
	waitMetric(t, ctx, in, before+limit+1, started, "grpc_method", "GetOrFetch")

	// Authenticated callers are answered at once, on both doors.
	docURL := u.URL() + "/b/doc"
	d, err := fleettest.Get(ctx, in.Dial(t, grpc.WithPerRPCCredentials(bearer(tokenB))), &coorddv1.GetOrFetchRequest{Url: docURL})
	if err != nil {
		t.Fatalf("gRPC GetOrFetch beside stalled callers: %v", err)
	}
	if len(d.Body) == 0 {
		t.Error("gRPC GetOrFetch: empty body")
	}
	a := httpGetDoc(t, ctx, in, docURL, http.Header{"Authorization": {"Bearer " + tokenB}})
	if a.status != http.StatusOK {
		t.Errorf("HTTP GET beside stalled callers: %d %s; want 200", a.status, a.body)
	}
	// Invalidate needs an admin: team-a (upstream "a").
	adminURL := u.URL() + "/a/doc"
	a = httpDo(t, ctx, in, http.MethodPost, server.HTTPInvalidatePath, url.Values{"url": {adminURL}}, http.Header{"Authorization": {"Bearer " + tokenA}}, nil)
	if a.status != http.StatusOK {
		t.Errorf("HTTP invalidate beside stalled callers: %d %s; want 200", a.status, a.body)
	}
	if _, err := in.Dial(t, grpc.WithPerRPCCredentials(bearer(tokenA))).Invalidate(ctx, &coorddv1.InvalidateRequest{Url: adminURL}); err != nil {
		t.Errorf("gRPC Invalidate beside stalled callers: %v", err)
	}
}

// A body that does not arrive within HTTPBodyTimeout is 408, and its
// connection is closed. (Time is the subject: the timeout is short.)
func TestStalledBodyIsCutOff(t *testing.T) {
	in, _ := startDoor(t, server.Config{HTTPBodyTimeout: 200 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := dialDoor(t, in)
	c.send(t, "POST "+server.HTTPInvalidatePath+" HTTP/1.1\r\nHost: coordd\r\nAuthorization: Bearer "+tokenB+
		"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"url\": ")
	resp, err := c.response(ctx)
	if err != nil {
		t.Fatalf("stalled body: %v; want a 408", err)
	}
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Errorf("stalled body: %s; want 408", resp.Status)
	}
	if err := c.closed(ctx); err != nil {
		t.Errorf("after the 408: %v", err)
	}
}

// A request with Transfer-Encoding (with or without Content-Length, RFC
// 9112 6.3) is refused with 400 and its connection closed: a request
// hidden in its body is neither answered nor fetched.
func TestTransferEncodingRefused(t *testing.T) {
	in, u := startDoor(t, server.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	smuggled := "GET " + server.HTTPDocumentsPath + "?url=" + url.QueryEscape(u.URL()+"/b/smuggled") +
		" HTTP/1.1\r\nHost: coordd\r\nAuthorization: Bearer " + tokenB + "\r\n\r\n"
	for _, tc := range []struct{ name, req string }{
		{"CL and TE", "POST " + server.HTTPInvalidatePath + "?url=" + url.QueryEscape(u.URL()+"/b/x") +
			" HTTP/1.1\r\nHost: coordd\r\nAuthorization: Bearer " + tokenB +
			"\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled},
		{"TE only", "POST " + server.HTTPInvalidatePath + "?url=" + url.QueryEscape(u.URL()+"/b/x") +
			" HTTP/1.1\r\nHost: coordd\r\nAuthorization: Bearer " + tokenB +
			"\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled},
		{"GET with TE", "GET " + server.HTTPDocumentsPath + "?url=" + url.QueryEscape(u.URL()+"/b/x") +
			" HTTP/1.1\r\nHost: coordd\r\nAuthorization: Bearer " + tokenB +
			"\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialDoor(t, in)
			c.send(t, tc.req)
			resp, err := c.response(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("got %s; want 400", resp.Status)
			}
			if err := c.closed(ctx); err != nil {
				t.Errorf("after the 400: %v", err)
			}
			if n := u.Count("/b/smuggled"); n != 0 {
				t.Errorf("the smuggled request reached the upstream %d times", n)
			}
			if n := u.Count("/b/x"); n != 0 {
				t.Errorf("the refused request reached the upstream %d times", n)
			}
		})
	}
}

// Connections that send nothing, or stay idle, are bounded per listener:
// past the bound the oldest are closed, and a caller still gets in.
func TestHTTPConnectionBounds(t *testing.T) {
	const bound, extra = 4, 3
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	notFound := "GET /nowhere HTTP/1.1\r\nHost: coordd\r\n\r\n"
	// Each subtest has an instance of its own: a connection of another
	// may turn idle late on a busy machine, and take an idle slot.
	start := func(t *testing.T) *fleettest.Instance {
		in, _ := startDoor(t, server.Config{HTTPMaxPendingConns: bound, HTTPMaxIdleConns: bound})
		return in
	}

	t.Run("silent", func(t *testing.T) {
		in := start(t)
		var conns []*rawConn
		for range bound + extra {
			conns = append(conns, dialDoor(t, in))
		}
		for i, c := range conns[:extra] {
			if err := c.closed(ctx); err != nil {
				t.Errorf("silent connection %d of %d: %v", i, bound+extra, err)
			}
		}
		// The newest are still open: each gets an answer.
		for i, c := range conns[extra:] {
			c.send(t, notFound)
			if resp, err := c.response(ctx); err != nil || resp.StatusCode != http.StatusNotFound {
				t.Errorf("silent connection %d: %v %v; want 404", extra+i, resp, err)
			}
		}
	})
	t.Run("idle", func(t *testing.T) {
		in := start(t)
		var conns []*rawConn
		for i := range bound + extra {
			c := dialDoor(t, in)
			c.send(t, notFound)
			if resp, err := c.response(ctx); err != nil || resp.StatusCode != http.StatusNotFound {
				t.Fatalf("connection %d: %v %v; want 404", i, resp, err)
			}
			conns = append(conns, c)
		}
		// Exactly extra are closed: the oldest by the time each turned
		// idle, which a busy server may see in another order than ours.
		open := closedExactly(t, ctx, conns, extra)
		for i, c := range open {
			c.send(t, notFound)
			if resp, err := c.response(ctx); err != nil || resp.StatusCode != http.StatusNotFound {
				t.Errorf("idle connection %d still open: %v %v; want 404", i, resp, err)
			}
		}
	})
}

// closedExactly waits until n of conns are closed by the server, then
// returns the others; it fails t if fewer than n close within ctx.
func closedExactly(t *testing.T, ctx context.Context, conns []*rawConn, n int) []*rawConn {
	t.Helper()
	done := make(chan int, len(conns))
	dl, _ := ctx.Deadline()
	for _, c := range conns {
		// Before the readers start, so that waking them below comes after.
		_ = c.SetReadDeadline(dl)
	}
	for i, c := range conns {
		go func() {
			if c.readEOF() == nil {
				done <- i
			} else {
				done <- -1 - i
			}
		}()
	}
	closed := make(map[int]bool)
	for range n {
		i := <-done
		if i < 0 {
			t.Fatalf("only %d of %d connections were closed; want %d", len(closed), len(conns), n)
		}
		closed[i] = true
	}
	// Wake the other readers: a read deadline in the past ends them.
	var open []*rawConn
	for i, c := range conns {
		if !closed[i] {
			_ = c.SetReadDeadline(time.Now())
			open = append(open, c)
		}
	}
	for range len(conns) - n {
		if i := <-done; i >= 0 {
			t.Errorf("connection %d closed too; want %d closed of %d", i, n, len(conns))
		}
	}
	for _, c := range open {
		_ = c.SetReadDeadline(time.Time{})
	}
	return open
}

// gRPC: a stream without a valid token is refused at once, before any
// message, so it cannot hold a slot either.
func TestGRPCUnauthenticatedStreamRefusedAtOnce(t *testing.T) {
	in, _ := startDoor(t, server.Config{MaxConcurrentCalls: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn := in.Conn(t)
	desc := &grpc.StreamDesc{StreamName: "GetOrFetch", ServerStreams: true, ClientStreams: true}
	s, err := conn.NewStream(ctx, desc, "/coordd.v1.CoordinatorService/GetOrFetch")
	if err != nil {
		t.Fatal(err)
	}
	var m coorddv1.GetOrFetchResponse
	if err := s.RecvMsg(&m); status.Code(err) != codes.Unauthenticated {
		t.Errorf("stream without a token, no request sent: %v; want Unauthenticated", err)
	}
}

// An answer given before the request's body is read closes the
// connection at once (issue 35): 60 connections that announce a body of
// 100 bytes, send half of it and stall are each answered and closed within
// seconds, not held while the server waits for the rest, with tenants (a
// 401 for want of a token) and without (a 404, a 405, a GET's 400, an
// invalidation whose body the body deadline cuts off).
func TestRefusedBodyClosesConnection(t *testing.T) {
	const conns = 60
	half := "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n" + strings.Repeat(" ", 50)
	tenants, _ := startDoor(t, server.Config{})
	open := fleettest.Start(t, fleettest.Options{
		Config: coordinator.Config{Upstreams: []coordinator.Upstream{{Name: "a", BaseURL: fakeupstream.New(t).URL()}},
			Logger: slog.New(slog.DiscardHandler)},
		Server: server.Config{HTTPBodyTimeout: time.Second},
		HTTP:   true,
	})
	for _, tc := range []struct {
		name string
		in   *fleettest.Instance
		req  string
		want int
	}{
		{"no token", tenants, "POST " + server.HTTPInvalidatePath + " HTTP/1.1\r\nHost: coordd\r\n" + half, http.StatusUnauthorized},
		{"no such path", open, "POST /nowhere HTTP/1.1\r\nHost: coordd\r\n" + half, http.StatusNotFound},
		{"wrong method", open, "PUT " + server.HTTPInvalidatePath + " HTTP/1.1\r\nHost: coordd\r\n" + half, http.StatusMethodNotAllowed},
		{"bad GET", open, "GET " + server.HTTPDocumentsPath + "?nourl=1 HTTP/1.1\r\nHost: coordd\r\n" + half, http.StatusBadRequest},
		{"stalled invalidation", open, "POST " + server.HTTPInvalidatePath + " HTTP/1.1\r\nHost: coordd\r\n" + half, http.StatusRequestTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cs := make([]*rawConn, conns)
			for i := range cs {
				cs[i] = dialDoor(t, tc.in)
				cs[i].send(t, tc.req)
			}
			for i, c := range cs {
				resp, err := c.response(ctx)
				if err != nil {
					t.Fatalf("connection %d: %v; want a %d", i, err, tc.want)
				}
				if resp.StatusCode != tc.want {
					t.Fatalf("connection %d: %s; want %d", i, resp.Status, tc.want)
				}
			}
			for i, c := range cs {
				if err := c.closed(ctx); err != nil {
					t.Fatalf("connection %d after its %d: %v", i, tc.want, err)
				}
			}
		})
	}
}

// A body announced over the bound (8 KiB) is refused with 413 at once,
// before anything of it is read, and its connection closed (issue 35): not
// 408 once the body deadline has passed.
func TestAnnouncedBodyOverTheBound(t *testing.T) {
	in, _ := startDoor(t, server.Config{HTTPBodyTimeout: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := dialDoor(t, in)
	c.send(t, "POST "+server.HTTPInvalidatePath+" HTTP/1.1\r\nHost: coordd\r\nAuthorization: Bearer "+tokenB+
		"\r\nContent-Type: application/json\r\nContent-Length: 10737418240\r\n\r\n{")
	resp, err := c.response(ctx)
	if err != nil {
		t.Fatalf("announced 10 GiB: %v; want a 413", err)
	}
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("announced 10 GiB: %s; want 413", resp.Status)
	}
	if err := c.closed(ctx); err != nil {
		t.Errorf("after the 413: %v", err)
	}
}
