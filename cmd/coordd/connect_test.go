package main

import (
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/coordd/coordd/coordinator"
	"github.com/coordd/coordd/gateway"
	"github.com/coordd/coordd/internal/testing/mcpservers"
)

// TestMCPConnect: `coordd mcp connect URL` carries an agent that speaks
// MCP over stdio (here the Go SDK's client on pipes) to the gateway: it
// initializes, lists the everything server's tools through coordd, and
// calls one, with the bearer token from COORDD_MCP_TOKEN.
func TestMCPConnect(t *testing.T) {
	cmd := mcpservers.Command(t, "mcp-server-everything")
	const token = "connect-tenant-token-0123456789"
	gw, err := gateway.New([]gateway.Server{{Name: "everything", Command: cmd, Processes: 1, TrustReadOnly: true}}, gateway.Options{
		Tenants:      []gateway.Tenant{{Name: "team-a", Servers: []string{"everything"}}},
		Authenticate: func(tok string) (string, bool) { return "team-a", tok == token },
	})
	if err != nil {
		t.Fatal(err)
	}
	co, err := coordinator.New(coordinator.Config{Upstreams: gw.Upstreams()}, coordinator.Options{Transport: gw.Wrap(nil)})
	if err != nil {
		t.Fatal(err)
	}
	gw.Bind(co)
	srv := httptest.NewServer(gw.Handler())
	t.Cleanup(func() { srv.Close(); gw.Close(); co.Close() })

	t.Setenv("COORDD_MCP_TOKEN", token)
	inR, inW := io.Pipe()   // the agent writes, connect reads
	outR, outW := io.Pipe() // connect writes, the agent reads
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- runMCP(ctx, []string{"connect", srv.URL + "/mcp/everything"}, inR, outW, io.Discard) }()
	c := mcp.NewClient(&mcp.Implementation{Name: "desktop", Version: "1"}, nil)
	s, err := c.Connect(ctx, &mcp.IOTransport{Reader: outR, Writer: inW}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tools, err := s.ListTools(ctx, nil)
	if err != nil || len(tools.Tools) == 0 {
		t.Fatalf("tools/list through connect: %v", err)
	}
	r, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"message": "through the bridge"}})
	if err != nil || r.IsError {
		t.Fatalf("echo: %v %v", err, r)
	}
	if tc, ok := r.Content[0].(*mcp.TextContent); !ok || !strings.Contains(tc.Text, "through the bridge") {
		t.Fatalf("echo answered %+v", r.Content)
	}
	s.Close()
	inW.Close()
	if err := <-done; err != nil {
		t.Fatalf("connect: %v", err)
	}

	// A bad URL is a usage error, before any connection.
	if err := runMCP(ctx, []string{"connect", "ftp://x"}, strings.NewReader(""), io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "not an http(s) URL") {
		t.Fatalf("connect ftp://x: %v", err)
	}
}
