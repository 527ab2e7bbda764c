package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	coordd "github.com/coordd/coordd/clients/go"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/redistest"
	"github.com/coordd/coordd/internal/testing/storetest"
	"github.com/coordd/coordd/internal/testing/testclock"
	"github.com/coordd/coordd/internal/testing/testpki"
	"github.com/coordd/coordd/server"
)

func TestBadSecurityConfigNamesField(t *testing.T) {
	const secret = "s3cret-s3cret-s3cret"
	t.Setenv("COORDD_TEST_SHORT", "short")
	tests := []struct{ name, yaml, field string }{
		{"tenant without upstreams", "tenants:\n  - name: a\n    tokens: [" + secret + "]\n", "tenants[0] (a).upstreams"},
		{"tenant with unknown upstream", "tenants:\n  - name: a\n    tokens: [" + secret + "]\n    upstreams: [nope]\n", "tenants[0] (a).upstreams[0]"},
		{"tenant without tokens", "tenants:\n  - name: a\n    upstreams: [\"*\"]\n", "tenants[0] (a)"},
		{"tokens_env unset", "tenants:\n  - name: a\n    tokens_env: COORDD_TEST_UNSET\n    upstreams: [\"*\"]\n", "tenants[0] (a).tokens_env"},
		{"tokens_file missing", "tenants:\n  - name: a\n    tokens_file: /nonexistent/tokens\n    upstreams: [\"*\"]\n", "tenants[0] (a).tokens_file"},
		{"short token", "tenants:\n  - name: a\n    tokens_env: COORDD_TEST_SHORT\n    upstreams: [\"*\"]\n", "tenants[0] (a).tokens_env: token 1 of $COORDD_TEST_SHORT: 5 bytes"},
		{"bad tenant name", "tenants:\n  - name: a/b\n    tokens: [" + secret + "]\n    upstreams: [\"*\"]\n", "tenants[0].name"},
		{"shared token", "tenants:\n  - name: a\n    tokens: [" + secret + "]\n    upstreams: [\"*\"]\n  - name: b\n    tokens: [" + secret + "]\n    upstreams: [\"*\"]\n", "tenants[1] (b).tokens[0]"},
		{"tenant weight 0", "tenants:\n  - name: a\n    tokens: [" + secret + "]\n    upstreams: [\"*\"]\n    weight: 0\n", "tenants[0] (a).weight"},
		{"tenant weight too large", "tenants:\n  - name: a\n    tokens: [" + secret + "]\n    upstreams: [\"*\"]\n    weight: 1001\n", "tenants[0] (a).weight"},
		{"tls without key", "tls:\n  cert_file: /x.pem\n", "tls"},
		{"tls cert missing", "tls:\n  cert_file: /nonexistent.pem\n  key_file: /nonexistent-key.pem\n", "tls.cert_file"},
		{"redis ca without rediss", "redis: redis://127.0.0.1:1/0\nredis_tls_ca_file: /x.pem\n", "redis_tls_ca_file"},
		{"redis password env unset", "redis: redis://127.0.0.1:1/0\nredis_password_env: COORDD_TEST_UNSET\n", "redis_password_env"},
		{"reflection not a bool", "reflection: sometimes\n", "sometimes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := t.TempDir() + "/coordd.yaml"
			if err := os.WriteFile(path, []byte(tt.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			err := run(context.Background(), []string{"--config", path, "--listen", "127.0.0.1:0"}, os.Stderr)
			if err == nil || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("run error = %v; want one naming %q", err, tt.field)
			}
			if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "short:") {
				t.Errorf("error %q quotes a token", err)
			}
		})
	}
}

// TestSecureDeployment runs coordd as main does with a TLS listener, a
// tenant whose tokens come from the environment and a file, and a Redis
// that requires a password (AUTH or an ACL user, over plaintext or TLS):
// the tenant's document lands in Redis under its namespace. With a wrong
// Redis password coordd runs degraded and says so on its health service.
func TestSecureDeployment(t *testing.T) {
	const redisPW, aclPW = "redis-pw-123", "acl-pw-456"
	ca := testpki.NewCA(t, "deploy")
	redisCert := ca.Server(t, "redis")
	tests := []struct {
		name     string
		args     []string // redis-server's
		url      func(plain, tlsAddr string) string
		yaml     string // extra coordd config
		env      string // COORDD_TEST_REDIS_PW's value
		wantDown bool
	}{
		{
			name: "requirepass in the url",
			args: []string{"--requirepass", redisPW},
			url:  func(plain, _ string) string { return "redis://:" + redisPW + "@" + plain + "/0" },
		},
		{
			name: "acl user, password from the environment",
			args: []string{"--requirepass", redisPW, "--user", "coordd", "on", ">" + aclPW, "~*", "&*", "+@all"},
			url:  func(plain, _ string) string { return "redis://coordd@" + plain + "/0" },
			yaml: "redis_password_env: COORDD_TEST_REDIS_PW\n",
			env:  aclPW,
		},
		{
			name: "rediss with a private CA",
			args: []string{"--requirepass", redisPW, "--tls-cert-file", redisCert.CertFile, "--tls-key-file", redisCert.KeyFile,
				"--tls-ca-cert-file", ca.CertFile, "--tls-auth-clients", "no"},
			url:  func(_, tlsAddr string) string { return "rediss://:" + redisPW + "@" + tlsAddr + "/0" },
			yaml: "redis_tls_ca_file: " + ca.CertFile + "\n",
		},
		{
			name:     "wrong password",
			args:     []string{"--requirepass", redisPW},
			url:      func(plain, _ string) string { return "redis://:wrong-password@" + plain + "/0" },
			wantDown: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.args
			tlsAddr := ""
			if strings.HasPrefix(tt.url("", "x"), "rediss") {
				tlsAddr = freeAddr(t) // another process may take it first; rare
				_, port, _ := net.SplitHostPort(tlsAddr)
				args = append([]string{"--tls-port", port}, args...)
			}
			rs := redistest.Start(t, redistest.WithArgs(args...))
			if tt.env != "" {
				t.Setenv("COORDD_TEST_REDIS_PW", tt.env)
			}
			const tokenEnv, tokenFile = "env-token-0123456789", "file-token-0123456789"
			t.Setenv("COORDD_TEST_TOKENS", "x-unused-token-0123456789, "+tokenEnv)
			tokens := filepath.Join(t.TempDir(), "tokens")
			if err := os.WriteFile(tokens, []byte("# rotated in on Monday\n"+tokenFile+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			up := fakeupstream.New(t)
			listener := ca.Server(t, "coordd")
			addr := freeAddr(t)
			yaml := fmt.Sprintf(`listen: %s
redis: %q
redis_timeout: 200ms
upstreams:
  - name: docs
    base_url: %s
tls:
  cert_file: %s
  key_file: %s
tenants:
  - name: team-a
    tokens_env: COORDD_TEST_TOKENS
    tokens_file: %s
    upstreams: [docs]
`, addr, tt.url(rs.Addr(), tlsAddr), up.URL(), listener.CertFile, listener.KeyFile, tokens) + tt.yaml
			path := filepath.Join(t.TempDir(), "coordd.yaml")
			if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			done := make(chan error, 1)
			go func() { done <- run(ctx, []string{"--config", path}, os.Stderr) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("run: %v", err)
				}
			}()
			trust := &tls.Config{RootCAs: ca.Pool()}
			redisUp := waitRedisHealth(t, ctx, addr, trust)
			if redisUp == tt.wantDown {
				t.Fatalf("redis health SERVING = %v; want %v", redisUp, !tt.wantDown)
			}
			if tt.wantDown {
				return
			}
			for i, token := range []string{tokenEnv, tokenFile} {
				c, err := coordd.Dial(addr, coordd.WithTLS(trust), coordd.WithToken(token))
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				if _, err := c.Get(ctx, up.URL()+"/doc"); err != nil {
					t.Fatalf("Get with token %d: %v", i, err)
				}
			}
			if got := up.Count("/doc"); got != 1 {
				t.Errorf("upstream requests = %d; want 1", got)
			}
			// The document is in Redis, under its url: tenants with the
			// same credential (here none) share it.
			o, err := redis.ParseURL(tt.url(rs.Addr(), tlsAddr))
			if err != nil {
				t.Fatal(err)
			}
			if o.TLSConfig != nil {
				o.TLSConfig.RootCAs = ca.Pool()
			}
			if tt.env != "" {
				o.Password = tt.env
			}
			rdb := redis.NewClient(o)
			defer rdb.Close()
			id := up.URL() + "/doc"
			if stored, err := storetest.New(rdb, "").DocStored(ctx, id); err != nil || !stored {
				t.Errorf("document %s stored = %v, %v; want true", id, stored, err)
			}
			// Without a token: refused.
			anon, err := coordd.Dial(addr, coordd.WithTLS(trust))
			if err != nil {
				t.Fatal(err)
			}
			defer anon.Close()
			if _, err := anon.Get(ctx, up.URL()+"/doc"); status.Code(err) != codes.Unauthenticated {
				t.Errorf("Get without token: %v; want UNAUTHENTICATED", err)
			}
		})
	}
}

// waitRedisHealth waits until coordd at addr serves its health service and
// returns whether it reports Redis SERVING.
func waitRedisHealth(t *testing.T, ctx context.Context, addr string, trust *tls.Config) bool {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(trust)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	for {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: server.RedisHealthService}, grpc.WaitForReady(true))
		if err == nil {
			return r.GetStatus() == healthpb.HealthCheckResponse_SERVING
		}
		if ctx.Err() != nil {
			t.Fatalf("coordd never served health: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // the service is registered before Serve; polling until it listens
	}
}

// TestTLSCertificateRotation swaps the listener's cert_file and key_file
// under a running coordd, as cert-manager does: a new connection gets the
// new certificate, a broken pair (key mismatch, half-written) keeps the last
// good one in use with one WARN per change, and coordd keeps serving.
func TestTLSCertificateRotation(t *testing.T) {
	ca := testpki.NewCA(t, "rotate")
	a, b, c := ca.Server(t, "coordd-a"), ca.Server(t, "coordd-b"), ca.Server(t, "coordd-c")
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	install := func(cert, key []byte) {
		t.Helper()
		replaceFile(t, certFile, cert)
		replaceFile(t, keyFile, key)
	}
	install(readFile(t, a.CertFile), readFile(t, a.KeyFile))
	addr, logs, done := startTLS(t, fmt.Sprintf("tls:\n  cert_file: %s\n  key_file: %s\n", certFile, keyFile))
	trust := &tls.Config{RootCAs: ca.Pool()}
	served := func() string {
		t.Helper()
		conn, err := tls.Dial("tcp", addr, trust)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	await := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("gave up waiting for %s; log:\n%s", what, readFile(t, logs))
			}
		}
	}
	const warn = "cannot reload tls.cert_file"
	warnings := func() int { return strings.Count(string(readFile(t, logs)), warn) }
	if got := served(); got != "coordd-a" {
		t.Fatalf("served %s at start; want coordd-a", got)
	}

	install(readFile(t, b.CertFile), readFile(t, b.KeyFile))
	await("coordd-b served", func() bool { return served() == "coordd-b" })

	install(readFile(t, c.CertFile), readFile(t, a.KeyFile)) // c's certificate, a's key
	// Files are looked at on a handshake: each try connects.
	await("a WARN on the mismatched pair", func() bool { served(); return warnings() == 1 })
	if log := string(readFile(t, logs)); !strings.Contains(log, keyFile) || !strings.Contains(log, "key does not match") {
		t.Errorf("the WARN on a mismatched pair names no %s or not %q; log:\n%s", keyFile, "key does not match", log)
	}
	// Connecting for longer than certCheckEvery (1s) makes coordd look at
	// the same broken files again: still the last good certificate, no new
	// WARN.
	for end := time.Now().Add(1500 * time.Millisecond); ; time.Sleep(50 * time.Millisecond) {
		if got := served(); got != "coordd-b" {
			t.Fatalf("served %s after a mismatched pair; want the last good, coordd-b", got)
		}
		if time.Now().After(end) {
			break
		}
	}
	if n := warnings(); n != 1 {
		t.Fatalf("%d WARNs %q for one mismatched pair; want 1", n, warn)
	}
	cert := readFile(t, c.CertFile)
	install(cert[:len(cert)/2], readFile(t, c.KeyFile)) // half-written
	await("a WARN on the half-written pair", func() bool { served(); return warnings() == 2 })
	if got := served(); got != "coordd-b" {
		t.Errorf("served %s after a half-written pair; want the last good, coordd-b", got)
	}
	select {
	case err := <-done:
		t.Fatalf("coordd stopped: %v", err)
	default:
	}

	install(cert, readFile(t, c.KeyFile))
	await("coordd-c served", func() bool { return served() == "coordd-c" })
	if n := warnings(); n != 2 {
		t.Errorf("%d WARNs %q; want one per broken change, 2", n, warn)
	}
}

// TestTLSClientCARotation swaps client_ca_file under a running coordd with
// mutual TLS, as the kubelet swaps a mounted Secret (a ..data symlink): a
// client whose certificate CA2 signed is refused, then accepted once
// client_ca_file holds CA2, and CA1's client is refused from then on.
func TestTLSClientCARotation(t *testing.T) {
	ca1, ca2 := testpki.NewCA(t, "clients-1"), testpki.NewCA(t, "clients-2")
	listener := ca1.Server(t, "coordd")
	client1, client2 := ca1.Client(t, "client-1"), ca2.Client(t, "client-2")
	dir := t.TempDir()
	mount := func(version string, caPEM []byte) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, version), 0o700); err != nil {
			t.Fatal(err)
		}
		replaceFile(t, filepath.Join(dir, version, "ca.crt"), caPEM)
		if err := os.Symlink(version, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	mount("..v1", ca1.CertPEM)
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.Symlink(filepath.Join("..data", "ca.crt"), caFile); err != nil {
		t.Fatal(err)
	}
	addr, _, _ := startTLS(t, fmt.Sprintf("tls:\n  cert_file: %s\n  key_file: %s\n  client_ca_file: %s\n",
		listener.CertFile, listener.KeyFile, caFile))
	accepted := func(client testpki.Pair) bool {
		t.Helper()
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(
			&tls.Config{RootCAs: ca1.Pool(), Certificates: []tls.Certificate{client.TLS}})))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		return err == nil
	}
	if !accepted(client1) {
		t.Fatal("CA1's client refused at start")
	}
	if accepted(client2) {
		t.Fatal("CA2's client accepted before client_ca_file holds CA2")
	}
	mount("..v2", ca2.CertPEM)
	for deadline := time.Now().Add(10 * time.Second); !accepted(client2); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("CA2's client still refused after client_ca_file was swapped to CA2")
		}
	}
	if accepted(client1) {
		t.Error("CA1's client accepted after client_ca_file was swapped to CA2")
	}
}

// startTLS runs coordd as main does, single-node, with the given tls
// section (and no drain delay), and waits until it accepts connections. It returns the address,
// the log file and run's result.
func startTLS(t *testing.T, yaml string) (addr, logs string, done <-chan error) {
	t.Helper()
	addr = freeAddr(t)
	path := filepath.Join(t.TempDir(), "coordd.yaml")
	if err := os.WriteFile(path, []byte("drain_delay: 1ms\n"+yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "coordd.log"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- run(ctx, []string{"--config", path, "--listen", addr}, f) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("run: %v", err)
		}
		f.Close()
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		conn, err := net.Dial("tcp", addr)
		if err == nil {
			conn.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("coordd never listened: %v", err)
		}
	}
	return addr, f.Name(), ran
}

// replaceFile writes b to path as an atomic swap does: a temporary file
// renamed over it.
func replaceFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// outsideValidity are matching pairs that must not be served: expired, or
// not yet valid, each with the reason coordd gives for refusing it.
func outsideValidity(t *testing.T, ca *testpki.CA) []struct {
	name string
	pair testpki.Pair
	why  string
} {
	t.Helper()
	now := time.Now()
	expired := ca.ServerValid(t, "coordd-expired", now.Add(-48*time.Hour), now.Add(-24*time.Hour))
	future := ca.ServerValid(t, "coordd-future", now.Add(24*time.Hour), now.Add(48*time.Hour))
	return []struct {
		name string
		pair testpki.Pair
		why  string
	}{
		{"expired", expired, "expired on " + expired.TLS.Leaf.NotAfter.UTC().Format(time.RFC3339)},
		{"not yet valid", future, "not yet valid until " + future.TLS.Leaf.NotBefore.UTC().Format(time.RFC3339)},
	}
}

// TestTLSStartRefusesInvalidCertificate: a matching pair that is expired or
// not yet valid fails the start, with an error naming cert_file and why.
func TestTLSStartRefusesInvalidCertificate(t *testing.T) {
	ca := testpki.NewCA(t, "start")
	for _, tt := range outsideValidity(t, ca) {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "coordd.yaml")
			yaml := fmt.Sprintf("drain_delay: 1ms\ntls:\n  cert_file: %s\n  key_file: %s\n", tt.pair.CertFile, tt.pair.KeyFile)
			if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			// Only reached if coordd starts, which is the failure: the
			// deadline ends the run.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := run(ctx, []string{"--config", path, "--listen", "127.0.0.1:0"}, os.Stderr)
			if err == nil {
				t.Fatalf("coordd started with a certificate %s; want the start to fail", tt.name)
			}
			for _, want := range []string{"tls.cert_file", tt.pair.CertFile, tt.why} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("run error %q; want one naming %q", err, want)
				}
			}
		})
	}
}

// TestTLSReloadRefusesInvalidCertificate writes a matching pair that is
// expired, or not yet valid, over a running coordd's cert_file and
// key_file: new handshakes keep getting the last good certificate (its
// serial and NotAfter), a WARN names the file and why, and nothing says
// "tls: reloaded".
func TestTLSReloadRefusesInvalidCertificate(t *testing.T) {
	ca := testpki.NewCA(t, "validity")
	for _, tt := range outsideValidity(t, ca) {
		t.Run(tt.name, func(t *testing.T) {
			good := ca.Server(t, "coordd-good")
			dir := t.TempDir()
			certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
			replaceFile(t, certFile, readFile(t, good.CertFile))
			replaceFile(t, keyFile, readFile(t, good.KeyFile))
			addr, logs, done := startTLS(t, fmt.Sprintf("tls:\n  cert_file: %s\n  key_file: %s\n", certFile, keyFile))
			if got := servedCert(t, addr); got.SerialNumber.Cmp(good.TLS.Leaf.SerialNumber) != 0 {
				t.Fatalf("served serial %v at start; want the good one, %v", got.SerialNumber, good.TLS.Leaf.SerialNumber)
			}

			// Only this test handshakes, so coordd never sees one file
			// replaced without the other.
			replaceFile(t, certFile, readFile(t, tt.pair.CertFile))
			replaceFile(t, keyFile, readFile(t, tt.pair.KeyFile))
			warned := func() bool {
				for _, l := range strings.Split(string(readFile(t, logs)), "\n") {
					if strings.Contains(l, "level=WARN") && strings.Contains(l, certFile) && strings.Contains(l, tt.why) {
						return true
					}
				}
				return false
			}
			// Files are looked at on a handshake: each try connects.
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				got := servedCert(t, addr)
				if got.SerialNumber.Cmp(tt.pair.TLS.Leaf.SerialNumber) == 0 {
					t.Fatalf("served the %s certificate (serial %v, valid %v to %v); want the last good one kept; log:\n%s",
						tt.name, got.SerialNumber, got.NotBefore, got.NotAfter, readFile(t, logs))
				}
				if warned() {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no WARN naming %s and %q; log:\n%s", certFile, tt.why, readFile(t, logs))
				}
			}
			got := servedCert(t, addr)
			if got.SerialNumber.Cmp(good.TLS.Leaf.SerialNumber) != 0 || !got.NotAfter.Equal(good.TLS.Leaf.NotAfter) {
				t.Errorf("served serial %v, NotAfter %v; want the last good, %v, %v",
					got.SerialNumber, got.NotAfter, good.TLS.Leaf.SerialNumber, good.TLS.Leaf.NotAfter)
			}
			conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool()})
			if err != nil {
				t.Errorf("a verifying client: %v; want the handshake to succeed", err)
			} else {
				conn.Close()
			}
			if strings.Contains(string(readFile(t, logs)), "tls: reloaded") {
				t.Errorf("logged tls: reloaded for a certificate %s; log:\n%s", tt.name, readFile(t, logs))
			}
			select {
			case err := <-done:
				t.Fatalf("coordd stopped: %v", err)
			default:
			}
		})
	}
}

// TestTLSCertNotAfterMetric: coordd_tls_cert_not_after_seconds is the
// served certificate's NotAfter, follows a good reload, and stays put
// when an expired pair is refused.
func TestTLSCertNotAfterMetric(t *testing.T) {
	ca := testpki.NewCA(t, "metric")
	now := time.Now()
	a := ca.ServerValid(t, "coordd-a", now.Add(-time.Minute), now.Add(time.Hour))
	b := ca.ServerValid(t, "coordd-b", now.Add(-time.Minute), now.Add(2*time.Hour))
	expired := ca.ServerValid(t, "coordd-expired", now.Add(-48*time.Hour), now.Add(-24*time.Hour))
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	install := func(p testpki.Pair) {
		t.Helper()
		replaceFile(t, certFile, readFile(t, p.CertFile))
		replaceFile(t, keyFile, readFile(t, p.KeyFile))
	}
	install(a)
	maddr := freeAddr(t)
	addr, logs, _ := startTLS(t, fmt.Sprintf("metrics_listen: %s\ntls:\n  cert_file: %s\n  key_file: %s\n", maddr, certFile, keyFile))
	notAfter := func() float64 {
		t.Helper()
		resp, err := http.Get("http://" + maddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^coordd_tls_cert_not_after_seconds (\S+)$`).FindSubmatch(body)
		if m == nil {
			t.Fatalf("/metrics has no coordd_tls_cert_not_after_seconds")
		}
		v, err := strconv.ParseFloat(string(m[1]), 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	want := func(p testpki.Pair) float64 { return float64(p.TLS.Leaf.NotAfter.Unix()) }
	if got := notAfter(); got != want(a) {
		t.Fatalf("coordd_tls_cert_not_after_seconds = %v at start; want a's NotAfter, %v", got, want(a))
	}

	install(b)
	for deadline := time.Now().Add(10 * time.Second); notAfter() != want(b); time.Sleep(50 * time.Millisecond) {
		servedCert(t, addr) // files are looked at on a handshake
		if time.Now().After(deadline) {
			t.Fatalf("coordd_tls_cert_not_after_seconds = %v after b was installed; want b's NotAfter, %v; log:\n%s", notAfter(), want(b), readFile(t, logs))
		}
	}

	install(expired)
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(string(readFile(t, logs)), "expired on"); time.Sleep(50 * time.Millisecond) {
		servedCert(t, addr)
		if time.Now().After(deadline) {
			t.Fatalf("no WARN for the expired pair; log:\n%s", readFile(t, logs))
		}
	}
	if got := notAfter(); got != want(b) {
		t.Errorf("coordd_tls_cert_not_after_seconds = %v after an expired pair was refused; want b's NotAfter still, %v", got, want(b))
	}
}

// servedCert handshakes with coordd at addr and returns the certificate it
// served, verified or not, so that a test sees what a bad reload installed.
func servedCert(t *testing.T, addr string) *x509.Certificate {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}

// TestCertReloaderClock drives a reloader by a test clock: a pair not yet
// valid is refused with one WARN, then installed once the clock reaches its
// NotBefore though the files have not changed; a pair that the wall clock
// finds valid is refused as expired once the reloader's clock is past its
// NotAfter.
func TestCertReloaderClock(t *testing.T) {
	ca := testpki.NewCA(t, "clock")
	start := time.Now()
	clock := testclock.New(start)
	good := ca.ServerValid(t, "good", start.Add(-time.Minute), start.Add(time.Hour))
	future := ca.ServerValid(t, "not-yet-valid", start.Add(10*time.Minute), start.Add(24*time.Hour))
	dir := t.TempDir()
	tc := tlsConfig{CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key")}
	install := func(p testpki.Pair) {
		t.Helper()
		replaceFile(t, tc.CertFile, readFile(t, p.CertFile))
		replaceFile(t, tc.KeyFile, readFile(t, p.KeyFile))
	}
	install(good)
	var logs strings.Builder // written only under the reloader's lock, from this goroutine
	r, err := newCertReloader(tc, slog.New(slog.NewTextHandler(&logs, nil)), clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	served := func(want testpki.Pair, when string) {
		t.Helper()
		if got := r.config().Certificates[0].Leaf.SerialNumber; got.Cmp(want.TLS.Leaf.SerialNumber) != 0 {
			t.Fatalf("%s: serving serial %v; want %v; log:\n%s", when, got, want.TLS.Leaf.SerialNumber, logs.String())
		}
	}
	count := func(s string) int { return strings.Count(logs.String(), s) }

	install(future)
	clock.Advance(certCheckEvery)
	served(good, "a pair not yet valid installed")
	why := "not yet valid until " + future.TLS.Leaf.NotBefore.UTC().Format(time.RFC3339)
	if n := count(why); n != 1 {
		t.Fatalf("%d WARNs %q; want 1; log:\n%s", n, why, logs.String())
	}
	clock.Advance(certCheckEvery)
	served(good, "the same files looked at again")
	if n := count(why); n != 1 {
		t.Fatalf("%d WARNs %q after looking at the same files again; want still 1", n, why)
	}
	clock.Set(future.TLS.Leaf.NotBefore.Add(time.Second))
	served(future, "the clock past NotBefore")
	if n := count("tls: reloaded"); n != 1 {
		t.Fatalf("%d INFO tls: reloaded; want 1; log:\n%s", n, logs.String())
	}

	clock.Set(start.Add(2 * time.Hour))
	install(good) // valid by the wall clock; expired by the reloader's
	clock.Advance(certCheckEvery)
	served(future, "a pair expired by the reloader's clock installed")
	if why := "expired on " + good.TLS.Leaf.NotAfter.UTC().Format(time.RFC3339); count(why) != 1 {
		t.Fatalf("no WARN %q; log:\n%s", why, logs.String())
	}
	if got, want := r.notAfter(), future.TLS.Leaf.NotAfter; !got.Equal(want) {
		t.Errorf("notAfter() = %v; want the served certificate's, %v", got, want)
	}
}
