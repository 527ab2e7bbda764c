package coordd_test

import (
	"context"
	"crypto/tls"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	coordd "github.com/coordd/coordd/clients/go"
	"github.com/coordd/coordd/internal/testing/fakeupstream"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/testpki"
	"github.com/coordd/coordd/server"
)

const testToken = "docs-team-token-0123456789"

// startSecure runs a coordd over TLS, with mutual TLS if clientCA is set,
// that requires testToken.
func startSecure(t *testing.T, up *fakeupstream.Upstream, ca *testpki.CA, clientCA *testpki.CA) *fleettest.Instance {
	t.Helper()
	a, err := server.NewAuth([]server.Tenant{{Name: "docs", Tokens: []string{testToken}, Admin: true}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{ca.Server(t, "coordd").TLS}, MinVersion: tls.VersionTLS12}
	if clientCA != nil {
		cfg.ClientCAs, cfg.ClientAuth = clientCA.Pool(), tls.RequireAndVerifyClientCert
	}
	return fleettest.Start(t, fleettest.Options{
		Config:        upstreamConfig(up),
		ServerOptions: []server.Option{server.WithAuth(a)},
		GRPC:          []grpc.ServerOption{grpc.Creds(credentials.NewTLS(cfg))},
	})
}

// TestTLSAndToken: WithTLS and WithToken reach a coordd that serves TLS
// and requires a token; without either the call is refused.
func TestTLSAndToken(t *testing.T) {
	up := fakeupstream.New(t)
	ca := testpki.NewCA(t, "coordd-test")
	in := startSecure(t, up, ca, nil)
	trust := &tls.Config{RootCAs: ca.Pool()}
	once := coordd.WithRetryPolicy(coordd.RetryPolicy{MaxAttempts: 1})
	tests := []struct {
		name string
		opts []coordd.Option
		want codes.Code
	}{
		{"tls and token", []coordd.Option{coordd.WithTLS(trust), coordd.WithToken(testToken)}, codes.OK},
		{"tls, no token", []coordd.Option{coordd.WithTLS(trust)}, codes.Unauthenticated},
		{"tls, wrong token", []coordd.Option{coordd.WithTLS(trust), coordd.WithToken(testToken + "x")}, codes.Unauthenticated},
		{"plaintext to a tls listener", []coordd.Option{coordd.WithToken(testToken), coordd.WithTimeout(2 * time.Second)}, codes.Unavailable},
		{"untrusted server certificate", []coordd.Option{coordd.WithTLS(nil), coordd.WithToken(testToken), coordd.WithTimeout(2 * time.Second)}, codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := dial(t, in.Addr, append(tt.opts, once)...)
			doc, err := c.Get(context.Background(), up.URL()+"/doc")
			if got := status.Code(err); got != tt.want {
				t.Fatalf("Get: code %v (%v); want %v", got, err, tt.want)
			}
			if err == nil && doc.Metadata.GetStatusCode() != 200 {
				t.Errorf("status %d; want 200", doc.Metadata.GetStatusCode())
			}
			if tt.want == codes.Unauthenticated && errors.Is(err, coordd.ErrUnreachable) {
				t.Errorf("a refused token is reported as unreachable: %v", err)
			}
		})
	}
	if got := up.Count("/doc"); got != 1 {
		t.Errorf("upstream requests = %d; want 1 (refused calls reach no upstream)", got)
	}
}

// TestMutualTLS: a coordd that requires client certificates serves a
// client with one signed by its client CA, and refuses a client without
// one or with one from another CA.
func TestMutualTLS(t *testing.T) {
	up := fakeupstream.New(t)
	serverCA, clientCA, otherCA := testpki.NewCA(t, "server-ca"), testpki.NewCA(t, "client-ca"), testpki.NewCA(t, "other-ca")
	in := startSecure(t, up, serverCA, clientCA)
	tests := []struct {
		name string
		cert []tls.Certificate
		ok   bool
	}{
		{"client certificate", []tls.Certificate{clientCA.Client(t, "agent").TLS}, true},
		{"no client certificate", nil, false},
		{"certificate of another CA", []tls.Certificate{otherCA.Client(t, "intruder").TLS}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := dial(t, in.Addr, coordd.WithTLS(&tls.Config{RootCAs: serverCA.Pool(), Certificates: tt.cert}),
				coordd.WithToken(testToken), coordd.WithRetryPolicy(coordd.RetryPolicy{MaxAttempts: 1}), coordd.WithTimeout(2*time.Second))
			_, err := c.Get(context.Background(), up.URL()+"/doc")
			if tt.ok && err != nil {
				t.Fatalf("Get: %v", err)
			}
			if !tt.ok && status.Code(err) != codes.Unavailable {
				t.Fatalf("Get: %v; want UNAVAILABLE (handshake refused)", err)
			}
		})
	}
	if got := up.Count("/doc"); got != 1 {
		t.Errorf("upstream requests = %d; want 1", got)
	}
}
