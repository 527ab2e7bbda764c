package server_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/coordd/coordd/coordinator"
	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/logctx"
	"github.com/coordd/coordd/internal/testing/enginetest"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/server"
)

// waitLogLine waits until logs hold a line with every one of want as a
// whole field (key=value, or a word), and returns it.
func waitLogLine(t *testing.T, ctx context.Context, logs *enginetest.SyncBuffer, want ...string) string {
	t.Helper()
	for {
		for line := range strings.SplitSeq(logs.String(), "\n") {
			ok := true
			for _, w := range want {
				ok = ok && strings.Contains(line+" ", " "+w+" ")
			}
			if ok {
				return line
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no log line with %q:\n%s", want, logs.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestCallerGoneIsCanceled: a caller that gives up while its cold fetch is
// held at the upstream, over gRPC and over HTTP, is logged at DEBUG as
// Canceled (HTTP: status 499, nginx's "client closed request"), counted
// as Canceled in grpc_server_handled_total and not as an error in
// coordd_requests_total; the fetch goes on and fills the cache.
func TestCallerGoneIsCanceled(t *testing.T) {
	u := fakeupstream.New(t)
	release := make(chan struct{})
	u.Set("/held", fakeupstream.Behavior{Block: release})
	u.Set("/held-http", fakeupstream.Behavior{Block: release})
	var logs enginetest.SyncBuffer
	log := slog.New(logctx.NewHandler(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	in := fleettest.Start(t, fleettest.Options{Metrics: true, HTTP: true, Config: coordinator.Config{
		Upstreams: []coordinator.Upstream{{Name: "fake", BaseURL: u.URL()}},
		Logger:    log,
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	defer close(release)

	// gRPC: the caller cancels mid-GetOrFetch.
	callCtx, hangUp := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := fleettest.Get(callCtx, in.Dial(t), &coorddv1.GetOrFetchRequest{Url: u.URL() + "/held"})
		done <- err
	}()
	if err := u.WaitCount(ctx, "/held", 1); err != nil {
		t.Fatal(err)
	}
	hangUp()
	if err := <-done; err == nil {
		t.Fatal("the canceled call succeeded")
	}
	line := waitLogLine(t, ctx, &logs, `msg="finished call"`, "protocol=grpc", "grpc.method=GetOrFetch", "key="+u.URL()+"/held")
	if !strings.Contains(line, "grpc.code=Canceled") || !strings.Contains(line, "level=DEBUG") {
		t.Errorf("call line of a caller that hung up: %s\nwant level=DEBUG and grpc.code=Canceled", line)
	}

	// gRPC: the caller hangs up (closes its connection) while the body is
	// streamed to it. Small flow-control windows hold the server in Send
	// once the metadata went out, so that the hang-up meets a Send.
	release2 := make(chan struct{})
	u.Set("/big", fakeupstream.Behavior{Block: release2, Size: 4 << 20})
	cc := in.Conn(t, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	stream, err := coorddv1.NewCoordinatorServiceClient(cc).GetOrFetch(ctx, &coorddv1.GetOrFetchRequest{Url: u.URL() + "/big"})
	if err != nil {
		t.Fatal(err)
	}
	if err := u.WaitCount(ctx, "/big", 1); err != nil {
		t.Fatal(err)
	}
	close(release2)
	for {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("before the metadata: %v", err)
		}
		if m.GetMetadata() != nil {
			break
		}
	}
	cc.Close() // hang up mid-body
	line = waitLogLine(t, ctx, &logs, `msg="finished call"`, "protocol=grpc", "grpc.method=GetOrFetch", "key="+u.URL()+"/big")
	if !strings.Contains(line, "grpc.code=Canceled") || !strings.Contains(line, "level=DEBUG") {
		t.Errorf("call line of a caller that hung up mid-body: %s\nwant level=DEBUG and grpc.code=Canceled", line)
	}

	// HTTP: the client closes the request.
	reqCtx, closeReq := context.WithCancel(ctx)
	req, err := http.NewRequestWithContext(reqCtx, http.MethodGet,
		in.HTTPURL+server.HTTPDocumentsPath+"?"+url.Values{"url": {u.URL() + "/held-http"}}.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	httpDone := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		httpDone <- err
	}()
	if err := u.WaitCount(ctx, "/held-http", 1); err != nil {
		t.Fatal(err)
	}
	closeReq()
	if err := <-httpDone; err == nil {
		t.Fatal("the closed HTTP request got an answer")
	}
	line = waitLogLine(t, ctx, &logs, `msg="finished call"`, "protocol=http")
	if !strings.Contains(line, "http.status=499") || !strings.Contains(line, "grpc.code=Canceled") || !strings.Contains(line, "level=DEBUG") {
		t.Errorf("call line of an HTTP client that went away: %s\nwant level=DEBUG, http.status=499, grpc.code=Canceled", line)
	}
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "finished call") && (strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR")) {
			t.Errorf("a caller that went away logged above DEBUG: %s", l)
		}
	}

	s := in.Scrape(t)
	handled := func(code string) float64 {
		return s.Value("grpc_server_handled_total", "grpc_method", "GetOrFetch", "grpc_code", code)
	}
	if got := handled("Canceled"); got != 2 {
		t.Errorf("grpc_server_handled_total{GetOrFetch, Canceled} = %v; want 2", got)
	}
	if got := handled("Unavailable"); got != 0 {
		t.Errorf("grpc_server_handled_total{GetOrFetch, Unavailable} = %v; want 0", got)
	}
	if got := s.Value("coordd_requests_total", "source", "error"); got != 0 {
		t.Errorf("coordd_requests_total{source=error} = %v; want 0: a caller that went away is no error", got)
	}
	if got := s.Value("coordd_requests_total", "source", "canceled"); got != 2 {
		t.Errorf("coordd_requests_total{source=canceled} = %v; want 2", got)
	}
	if got := s.Value("coordd_http_requests_total", "code", "499"); got != 1 {
		t.Errorf("coordd_http_requests_total{code=499} = %v; want 1", got)
	}
}
