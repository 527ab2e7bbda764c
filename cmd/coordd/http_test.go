package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	coordd "github.com/coordd/coordd/clients/go"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/testpki"
	"github.com/coordd/coordd/server"
)

// TestHTTPDoorConfig runs coordd as main does with http_listen beside a
// TLS gRPC listener and a tenant: the door serves over the same TLS (HTTP/2
// and HTTP/1.1) with the same tokens, shares the document cache with gRPC,
// and is counted in the metrics.
func TestHTTPDoorConfig(t *testing.T) {
	ca := testpki.NewCA(t, "door")
	cert := ca.Server(t, "coordd")
	up := fakeupstream.New(t)
	addr, httpAddr, metricsAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	const token, metricsToken = "door-token-0123456789", "door-metrics-token-0123"
	yaml := fmt.Sprintf(`listen: %s
http_listen: %s
upstreams:
  - name: docs
    base_url: %s
tls:
  cert_file: %s
  key_file: %s
tenants:
  - name: team-a
    tokens: [%s]
    upstreams: [docs]
metrics_auth:
  tokens: [%s]
`, addr, "127.0.0.1:1", up.URL(), cert.CertFile, cert.KeyFile, token, metricsToken)
	path := filepath.Join(t.TempDir(), "coordd.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	done := make(chan error, 1)
	// --http-listen overrides the file's address.
	go func() {
		done <- run(ctx, []string{"--config", path, "--http-listen", httpAddr, "--metrics-listen", metricsAddr, "--drain-delay", "1ms"}, os.Stderr)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	trust := &tls.Config{RootCAs: ca.Pool()}
	waitServing(t, ctx, addr, trust)

	// gRPC first: the document is cached, and the door serves that copy.
	c, err := coordd.Dial(addr, coordd.WithTLS(trust), coordd.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Get(ctx, up.URL()+"/doc"); err != nil {
		t.Fatal(err)
	}
	for _, h2 := range []bool{true, false} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			tr := &http.Transport{TLSClientConfig: trust.Clone(), ForceAttemptHTTP2: h2}
			if !h2 {
				tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{} // HTTP/1.1 only
			}
			defer tr.CloseIdleConnections()
			hc := &http.Client{Transport: tr}
			get := func(auth string) (*http.Response, []byte) {
				t.Helper()
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+httpAddr+server.HTTPDocumentsPath+"?url="+url.QueryEscape(up.URL()+"/doc"), nil)
				if auth != "" {
					req.Header.Set("Authorization", auth)
				}
				resp, err := hc.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp, b
			}
			resp, body := get("Bearer " + token)
			if resp.StatusCode != http.StatusOK || !bytes.Equal(body, up.Body("/doc")) || resp.Header.Get(server.HTTPSourceHeader) != "l1" {
				t.Errorf("get: %d, source %q, body %q; want 200 from l1 and the body", resp.StatusCode, resp.Header.Get(server.HTTPSourceHeader), body)
			}
			if wantMajor := map[bool]int{true: 2, false: 1}[h2]; resp.ProtoMajor != wantMajor {
				t.Errorf("protocol %s; want HTTP/%d", resp.Proto, wantMajor)
			}
			if resp, _ := get(""); resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("without a token: %d; want 401", resp.StatusCode)
			}
		})
	}
	if got := up.Count("/doc"); got != 1 {
		t.Errorf("upstream requests = %d; want 1", got)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+metricsAddr+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+metricsToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	m, _ := io.ReadAll(resp.Body)
	for _, want := range []string{`coordd_http_requests_total{code="200",method="get"} 2`, `coordd_http_requests_total{code="401",method="get"} 2`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestHTTPListenBadAddress: a bad http_listen fails the start, naming it.
func TestHTTPListenBadAddress(t *testing.T) {
	err := run(context.Background(), []string{"--listen", "127.0.0.1:0", "--http-listen", "256.0.0.1:x"}, os.Stderr)
	if err == nil || !strings.Contains(err.Error(), "http_listen") {
		t.Fatalf("run error = %v; want one naming http_listen", err)
	}
}

// waitServing waits until coordd at addr serves its health service over
// TLS with trust.
func waitServing(t *testing.T, ctx context.Context, addr string, trust *tls.Config) {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(trust)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	// WaitForReady: the call waits for the listener instead of failing.
	r, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v, %v; want SERVING", r.GetStatus(), err)
	}
}
