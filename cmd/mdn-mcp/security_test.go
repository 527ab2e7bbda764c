package main

import (
	"bytes"
	"crypto/tls"
	"os/exec"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/internal/testing/fleettest"
	"github.com/coordd/coordd/internal/testing/testpki"
	"github.com/coordd/coordd/server"
)

// TestCoorddTokenAndTLS: mdn-mcp reaches a coordd that serves mutual TLS
// and requires a token, given as $COORDD_TOKEN or --coordd-token with
// --coordd-tls-ca and a client certificate; without the token every tool
// call is a tool error that says what to set, and MDN is never asked.
func TestCoorddTokenAndTLS(t *testing.T) {
	mcpBinary(t) // skips under -short
	const token = "mcp-agents-token-0123456789"
	ca := testpki.NewCA(t, "mcp")
	a, err := server.NewAuth([]server.Tenant{{Name: "agents", Tokens: []string{token}, Upstreams: []string{"mdn"}}})
	if err != nil {
		t.Fatal(err)
	}
	f := newFakeMDN(t)
	in := fleettest.Start(t, fleettest.Options{
		Config:        coordinator.Config{Upstreams: []coordinator.Upstream{{Name: "mdn", BaseURL: f.srv.URL}}},
		ServerOptions: []server.Option{server.WithAuth(a)},
		GRPC: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(&tls.Config{
			Certificates: []tls.Certificate{ca.Server(t, "coordd").TLS},
			ClientCAs:    ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert,
		}))},
	})
	client := ca.Client(t, "mdn-mcp")
	base := []string{"--coordd", in.Addr, "--mdn-base", f.srv.URL, "--timeout", "5s",
		"--coordd-tls-ca", ca.CertFile, "--coordd-tls-cert", client.CertFile, "--coordd-tls-key", client.KeyFile}
	tests := []struct {
		name    string
		env     []string
		args    []string
		wantErr string // "": success
	}{
		{name: "token from the environment", env: []string{"COORDD_TOKEN=" + token}},
		{name: "token from the flag", args: []string{"--coordd-token", token}},
		{name: "no token", env: []string{"COORDD_TOKEN="}, wantErr: "requires a valid token"},
		{name: "wrong token", env: []string{"COORDD_TOKEN=" + token + "-old"}, wantErr: "requires a valid token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs := connectEnv(t, tt.env, append(base, tt.args...)...)
			text, isErr := call(t, cs, "mdn_doc", map[string]any{"path": mapPath})
			switch {
			case tt.wantErr == "" && isErr:
				t.Fatalf("mdn_doc: tool error %q", text)
			case tt.wantErr == "" && !strings.Contains(text, "Array.prototype.map()"):
				t.Fatalf("mdn_doc = %q; want the page", text)
			case tt.wantErr != "" && (!isErr || !strings.Contains(text, tt.wantErr)):
				t.Fatalf("mdn_doc = isError %v, %q; want a tool error saying %q", isErr, text, tt.wantErr)
			}
		})
	}
	if got := f.total(); got != 1 {
		t.Errorf("MDN requests = %d; want 1", got)
	}
}

func TestSecurityFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"missing CA file", []string{"--coordd-tls-ca", "/nonexistent/ca.pem"}, "--coordd-tls-ca"},
		{"certificate without key", []string{"--coordd-tls-cert", "/x.pem"}, "--coordd-tls-key go together"},
		{"unreadable certificate", []string{"--coordd-tls-cert", "/nonexistent.pem", "--coordd-tls-key", "/nonexistent.pem"}, "--coordd-tls-cert"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			cmd := exec.Command(mcpBinary(t), tt.args...)
			cmd.Env = raceEnv()
			cmd.Stderr = &stderr
			err := cmd.Run()
			if err == nil || !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("mdn-mcp %v: err %v, stderr %q; want a failure mentioning %q", tt.args, err, stderr.String(), tt.want)
			}
		})
	}
}
