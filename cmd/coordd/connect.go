package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// connectUsage is `coordd mcp connect`'s help.
const connectUsage = `usage: coordd mcp connect [--token-env VAR] URL

Speaks MCP over stdin and stdout and forwards every message to the MCP
gateway at URL (http://HOST:PORT/mcp/NAME): the entry for an agent that
only starts local commands, such as Claude Desktop. With tenants, the
bearer token is read from the environment variable VAR (default
COORDD_MCP_TOKEN). See docs/gateway.md.
`

// runMCP runs `coordd mcp SUBCOMMAND`.
func runMCP(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "connect" {
		fmt.Fprint(stderr, connectUsage)
		return &usageError{err: errors.New("coordd mcp: want the subcommand connect")}
	}
	fs := flag.NewFlagSet("coordd mcp connect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, connectUsage) }
	tokenEnv := fs.String("token-env", "COORDD_MCP_TOKEN", "the environment variable holding the bearer token")
	if err := fs.Parse(args[1:]); err != nil {
		return &usageError{err: err, reported: true}
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return &usageError{err: errors.New("coordd mcp connect: want one URL")}
	}
	u, err := url.Parse(fs.Arg(0))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return &usageError{err: fmt.Errorf("coordd mcp connect: %q is not an http(s) URL such as http://127.0.0.1:8090/mcp/NAME", fs.Arg(0))}
	}
	client := &http.Client{}
	if tok := os.Getenv(*tokenEnv); tok != "" {
		client.Transport = bearerTransport{token: tok, next: http.DefaultTransport}
	}
	return connect(ctx, u.String(), client, stdin, stdout)
}

type bearerTransport struct {
	token string
	next  http.RoundTripper
}

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// connect pumps JSON-RPC messages between stdin/stdout and the gateway
// at endpoint, both ways, until either side ends. Both ends are the Go
// SDK's transports, used as connections: every message passes as it is,
// so the agent's session is the gateway's.
func connect(ctx context.Context, endpoint string, client *http.Client, stdin io.Reader, stdout io.Writer) error {
	local, err := (&mcp.IOTransport{Reader: io.NopCloser(stdin), Writer: nopWriteCloser{stdout}}).Connect(ctx)
	if err != nil {
		return err
	}
	defer local.Close()
	remote, err := (&mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: client, DisableStandaloneSSE: true}).Connect(ctx)
	if err != nil {
		return err
	}
	defer remote.Close()
	errc := make(chan error, 2)
	pump := func(from, to mcp.Connection) {
		for {
			m, err := from.Read(ctx)
			if err != nil {
				errc <- err
				return
			}
			if err := to.Write(ctx, m); err != nil {
				errc <- err
				return
			}
		}
	}
	// Towards the gateway, a request whose POST fails is answered to the
	// agent with a JSON-RPC error, and the bridge goes on: a refused
	// request (a 4xx, the gateway restarting) is not the end of the
	// agent's session.
	go func() {
		for {
			m, err := local.Read(ctx)
			if err != nil {
				errc <- err
				return
			}
			if err := remote.Write(ctx, m); err != nil {
				req, ok := m.(*jsonrpc.Request)
				if !ok || !req.IsCall() {
					continue
				}
				resp := &jsonrpc.Response{ID: req.ID, Error: &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "coordd mcp connect: " + err.Error()}}
				if err := local.Write(ctx, resp); err != nil {
					errc <- err
					return
				}
			}
		}
	}()
	go pump(remote, local)
	select {
	case err = <-errc:
	case <-ctx.Done():
		return nil
	}
	if errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) {
		return nil // the agent closed stdin
	}
	return fmt.Errorf("coordd mcp connect: %w", err)
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
