package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/redistest"
	"github.com/coordd/coordd/server"
)

// TestMetricsAndJSONLogs runs coordd as main does with --metrics-listen
// and --log-format json (log_level from the file): /metrics answers with
// coordd's and gRPC's metrics, and each call's JSON log lines, its own and
// its flight's, carry its request id (the caller's x-request-id, or one
// made up and sent back) and its key.
func TestMetricsAndJSONLogs(t *testing.T) {
	rs := redistest.Start(t)
	up := fakeupstream.New(t)
	up.Set("/broken", fakeupstream.Status(500))
	addr, maddr := freeAddr(t), freeAddr(t)
	logs, err := os.CreateTemp(t.TempDir(), "coordd-log")
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	path := t.TempDir() + "/coordd.yaml"
	if err := os.WriteFile(path, []byte("log_level: debug\nlog_format: text\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--config", path, "--listen", addr, "--redis", rs.URL(), "--upstream", "fake=" + up.URL(),
			"--metrics-listen", maddr, "--log-format", "json"}, logs)
	}()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	c := coorddv1.NewCoordinatorServiceClient(cc)
	call := func(id, path string) (string, error) {
		cctx := ctx
		if id != "" {
			cctx = metadata.AppendToOutgoingContext(ctx, server.RequestIDHeader, id)
		}
		st, err := c.GetOrFetch(cctx, &coorddv1.GetOrFetchRequest{Url: up.URL() + path})
		if err != nil {
			return "", err
		}
		for err == nil {
			_, err = st.Recv()
		}
		md, _ := st.Header()
		if err == io.EOF {
			err = nil
		}
		return strings.Join(md.Get(server.RequestIDHeader), ","), err
	}
	if got, err := call("rid-ok", "/doc"); err != nil || got != "rid-ok" {
		t.Fatalf("call rid-ok: header %q, %v; want rid-ok echoed", got, err)
	}
	if got, err := call("rid-broken", "/broken"); err == nil || got != "rid-broken" {
		t.Fatalf("call rid-broken: header %q, %v; want rid-broken echoed and an error", got, err)
	}
	made, err := call("", "/other")
	if err != nil || made == "" {
		t.Fatalf("call without id: header %q, %v; want a request id made up", made, err)
	}

	resp, err := http.Get("http://" + maddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`coordd_upstream_requests_total{status="200",upstream="fake"} 2`,
		`coordd_upstream_requests_total{status="500",upstream="fake"}`,
		`coordd_redis_up 1`,
		`grpc_server_handled_total{grpc_code="OK",grpc_method="GetOrFetch"`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	if _, err := http.Get("http://" + maddr + "/metrics"); err == nil {
		t.Errorf("/metrics still served after shutdown")
	}
	type line struct {
		Msg       string `json:"msg"`
		RequestID string `json:"request_id"`
		Key       string `json:"key"`
	}
	var lines []line
	if _, err := logs.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(logs)
	for sc.Scan() {
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("log line is not JSON: %s", sc.Text())
		}
		lines = append(lines, l)
	}
	has := func(msg, id, key string) bool {
		for _, l := range lines {
			if strings.Contains(l.Msg, msg) && l.RequestID == id && l.Key == key {
				return true
			}
		}
		return false
	}
	tests := []struct {
		name, msg, id, key string
	}{
		{"call finished", "finished call", "rid-ok", up.URL() + "/doc"},
		{"failed call finished", "finished call", "rid-broken", up.URL() + "/broken"},
		{"its flight's fetch failed", "upstream fetch failed", "rid-broken", up.URL() + "/broken"},
		{"made-up id", "finished call", made, up.URL() + "/other"},
	}
	for _, tt := range tests {
		if !has(tt.msg, tt.id, tt.key) {
			t.Errorf("%s: no log line %q with request_id %q and key %q in:\n%+v", tt.name, tt.msg, tt.id, tt.key, lines)
		}
	}
}
