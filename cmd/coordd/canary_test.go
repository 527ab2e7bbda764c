package main

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/prototext"

	coorddv1 "github.com/coordd/coordd/gen/coordd/v1"
	"github.com/coordd/coordd/internal/testing/fakeapi"
	"github.com/coordd/coordd/internal/testing/oteltest"
	"github.com/coordd/coordd/internal/testing/redistest"
)

// TestSecretsStayInTheirField plants canary credentials (the upstream's,
// a tenant's, and callers' own, good and malformed) in a coordd with
// Redis, tracing, the metrics listener and the HTTP door, logging at
// debug, and looks for them, and for unsalted SHA-256 digests of them,
// everywhere they must not be: the log, the spans, /metrics, /status,
// /status.json, every answer (progress, metadata, errors) over gRPC and
// HTTP, --check-config's output, and every key and value in Redis. The
// fake API checks that the canaries were sent upstream, so the search
// looks where they could have leaked.
func TestSecretsStayInTheirField(t *testing.T) {
	redistest.SkipShort(t)
	const (
		upTok     = "CANARYupstream0123456789"
		tenantTok = "CANARYtenant0123456789"
		callerTok = "CANARYcaller0123456789"
		badTok    = "CANARYunknown0123456789"
		tenantA   = "canary-team-a-token-0123456789"
		tenantB   = "canary-team-b-token-0123456789"
		metricsT  = "canary-metrics-token-0123456789"
	)
	canaries := []string{upTok, tenantTok, callerTok, badTok}
	api := fakeapi.New(t, fakeapi.Options{Tokens: map[string]string{upTok: "bot", tenantTok: "teamer", callerTok: "caller"}})
	strict := fakeapi.New(t, fakeapi.Options{})
	rs := redistest.Start(t)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	recv := oteltest.Start(t)
	t.Setenv("CANARY_UP_TOKEN", "Bearer "+upTok)
	t.Setenv("CANARY_TENANT_TOKEN", "token "+tenantTok)
	t.Setenv("CANARY_SCOPE_KEY", "canary-scope-key-0123456789")
	dir := t.TempDir()
	addr, haddr, maddr := freeAddr(t), freeAddr(t), freeAddr(t)
	cfg := fmt.Sprintf(`listen: %s
http_listen: %s
metrics_listen: %s
redis: %s
redis_timeout: 2s
log_level: debug
credential_scope_key_env: CANARY_SCOPE_KEY
tracing: {endpoint: %s}
upstreams:
  - name: api
    base_url: %s/
    credential: {value_env: CANARY_UP_TOKEN}
    forward_headers: [Accept]
    caller_credentials: true
    retry: {max_attempts: 1}
  - name: strict
    base_url: %s/
tenants:
  - name: team-a
    tokens: [%s]
    upstreams: ["*"]
    admin: true
    credentials:
      api: {value_env: CANARY_TENANT_TOKEN}
  - name: team-b
    tokens: [%s]
    upstreams: ["*"]
    admin: true
metrics_auth:
  tokens: [%s]
`, addr, haddr, maddr, rs.URL(), recv.GRPCEndpoint, api.URL(), strict.URL(), tenantA, tenantB, metricsT)
	path := filepath.Join(dir, "coordd.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(dir, "coordd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()

	// --check-config's output, in process as a user would run it.
	checkOut, err := os.Create(filepath.Join(dir, "check.out"))
	if err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), []string{"--config", path, "--check-config"}, checkOut); err != nil {
		t.Fatalf("--check-config: %v", err)
	}
	checkOut.Close()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"--config", path, "--drain-delay", "1ms"}, logFile) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
		}
	}
	defer stop()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	cctx, ccancel := context.WithTimeout(ctx, 60*time.Second)
	defer ccancel()
	if _, err := healthpb.NewHealthClient(cc).Check(cctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	c := coorddv1.NewCoordinatorServiceClient(cc)
	var seen strings.Builder // every answer, as text
	call := func(tenant string, req *coorddv1.GetOrFetchRequest) {
		st, err := c.GetOrFetch(metadata.AppendToOutgoingContext(cctx, "authorization", "Bearer "+tenant), req)
		for err == nil {
			var m *coorddv1.GetOrFetchResponse
			if m, err = st.Recv(); err == nil {
				seen.WriteString(prototext.Format(m))
			}
		}
		if err != io.EOF {
			seen.WriteString(err.Error() + "\n")
		}
	}
	u := api.URL() + "/user"
	call(tenantA, &coorddv1.GetOrFetchRequest{Url: u})                                                         // the tenant's credential
	call(tenantB, &coorddv1.GetOrFetchRequest{Url: u})                                                         // the upstream's
	call(tenantB, &coorddv1.GetOrFetchRequest{Url: u, Credential: "Bearer " + callerTok})                      // the caller's
	call(tenantB, &coorddv1.GetOrFetchRequest{Url: u, Credential: "Bearer " + badTok})                         // refused upstream: 401
	call(tenantB, &coorddv1.GetOrFetchRequest{Url: u, Credential: "Bearer " + callerTok + "\nX-Evil"})         // malformed
	call(tenantB, &coorddv1.GetOrFetchRequest{Url: strict.URL() + "/user", Credential: "Bearer " + callerTok}) // not accepted there
	call(tenantB, &coorddv1.GetOrFetchRequest{Url: u, Credential: "Bearer " + callerTok, Head: true})
	if _, err := c.Invalidate(metadata.AppendToOutgoingContext(cctx, "authorization", "Bearer "+tenantB),
		&coorddv1.InvalidateRequest{Url: u, Credential: "Bearer " + callerTok}); err != nil {
		t.Fatalf("Invalidate: %v", err)
	}
	httpGet := func(url string, hdr map[string]string) {
		req, _ := http.NewRequestWithContext(cctx, http.MethodGet, url, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Fprintf(&seen, "%s %v\n%s\n", resp.Status, resp.Header, b)
	}
	door := "http://" + haddr + "/v1/documents?url=" + u
	httpGet(door, map[string]string{"Authorization": "Bearer " + tenantB, "X-Coordd-Credential": "Bearer " + callerTok})
	httpGet(door, map[string]string{"Authorization": "Bearer " + tenantB, "X-Coordd-Credential": "Bearer " + badTok})
	for _, p := range []string{"/metrics", "/status", "/status.json"} {
		httpGet("http://"+maddr+p, map[string]string{"Authorization": "Bearer " + metricsT})
	}
	for _, who := range []string{"bot", "teamer", "caller"} {
		if api.Requests("/user", who) == 0 {
			t.Fatalf("the fake API saw no request as %s: the canary was never sent, so this test proves nothing", who)
		}
	}
	if api.Requests("/user", "") == 0 { // the unknown token: 401, counted as anonymous
		t.Fatal("the unknown canary token never reached the fake API")
	}

	// Redis: every key and every value.
	rdb := rs.Client(t)
	var redisDump strings.Builder
	iter := rdb.Scan(cctx, 0, "*", 1000).Iterator()
	keys := 0
	for iter.Next(cctx) {
		k := iter.Val()
		keys++
		redisDump.WriteString(k + "\n")
		redisDump.WriteString(redisValue(cctx, t, rdb, k) + "\n")
	}
	if err := iter.Err(); err != nil || keys == 0 {
		t.Fatalf("scanning redis: %d keys, %v", keys, err)
	}

	stop() // flushes the spans
	if err := recv.Wait(cctx, func(s []oteltest.Span) bool { return len(oteltest.Named(s, "coordd.fetch")) >= 4 }); err != nil {
		t.Fatalf("spans: %v", err)
	}
	var spans strings.Builder
	for _, s := range recv.Spans() {
		fmt.Fprintf(&spans, "%+v\n", s)
	}
	logs, _ := os.ReadFile(logFile.Name())
	check, _ := os.ReadFile(checkOut.Name())
	places := map[string]string{
		"the log (debug)": string(logs), "--check-config": string(check), "answers, /metrics and /status": seen.String(),
		"redis": redisDump.String(), "spans": spans.String(),
	}
	if !strings.Contains(string(logs), "level=DEBUG") || !strings.Contains(seen.String(), "x-ratelimit-limit") && !strings.Contains(seen.String(), "X-Ratelimit-Limit") {
		t.Fatalf("the log has no debug line or the answers no headers: the search would look at too little")
	}
	for place, text := range places {
		for _, canary := range canaries {
			for _, form := range secretForms(canary) {
				if strings.Contains(text, form) {
					i := strings.Index(text, form)
					t.Errorf("%s holds the canary %s (as %q): …%s…", place, canary, form, text[max(0, i-200):min(len(text), i+100)])
				}
			}
		}
	}
}

// secretForms are the ways a secret s could show: itself, with its
// scheme, and unsalted SHA-256 digests of either in hex and base64.
func secretForms(s string) []string {
	forms := []string{s}
	for _, v := range []string{s, "Bearer " + s, "token " + s} {
		sum := sha256.Sum256([]byte(v))
		forms = append(forms, hex.EncodeToString(sum[:]), base64.StdEncoding.EncodeToString(sum[:]), base64.RawURLEncoding.EncodeToString(sum[:]))
	}
	return forms
}

// redisValue renders key's value, whatever its type.
func redisValue(ctx context.Context, t *testing.T, rdb *redis.Client, key string) string {
	typ, err := rdb.Type(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	var v any
	switch typ {
	case "string":
		v, err = rdb.Get(ctx, key).Result()
	case "hash":
		v, err = rdb.HGetAll(ctx, key).Result()
	case "list":
		v, err = rdb.LRange(ctx, key, 0, -1).Result()
	case "set":
		v, err = rdb.SMembers(ctx, key).Result()
	case "zset":
		v, err = rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
	case "stream":
		v, err = rdb.XRange(ctx, key, "-", "+").Result()
	case "none":
		return "(gone)"
	default:
		v = "(type " + typ + ")"
	}
	if err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	return fmt.Sprint(v)
}
