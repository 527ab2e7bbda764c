package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	buildinfo "github.com/coordd/coordd/internal/version"
)

// TestOneVersion: the MCP servers report one version, from one place
// (internal/version/VERSION): the Go server's and the TypeScript one's
// --version and their serverInfo to an MCP client all say it, and the
// TypeScript and Python packages' manifests hold the same number (#39).
func TestOneVersion(t *testing.T) {
	want := buildinfo.Release()
	pkg, err := os.ReadFile("../../clients/ts/package.json")
	if err != nil {
		t.Fatal(err)
	}
	var manifest struct{ Version string }
	if err := json.Unmarshal(pkg, &manifest); err != nil {
		t.Fatal(err)
	}
	if "v"+manifest.Version != want {
		t.Errorf("clients/ts/package.json's version is %q; internal/version/VERSION says %q", manifest.Version, want)
	}
	py, err := os.ReadFile("../../clients/python/pyproject.toml")
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`(?m)^version = "([^"]+)"`).FindSubmatch(py); m == nil || "v"+string(m[1]) != want {
		t.Errorf("clients/python/pyproject.toml's version is %q; internal/version/VERSION says %q", m, want)
	}

	node := nodeBinary(t)
	ts := tsServer(t)
	for _, srv := range []struct {
		name string
		argv []string
	}{
		{"mdn-mcp", []string{mcpBinary(t)}},
		{"coordd-mdn-mcp", []string{node, ts}},
	} {
		t.Run(srv.name, func(t *testing.T) {
			out, err := exec.Command(srv.argv[0], append(srv.argv[1:], "--version")...).Output()
			if err != nil {
				t.Fatalf("%s --version: %v", srv.name, err)
			}
			if prefix := srv.name + " " + want + " ("; !strings.HasPrefix(string(out), prefix) {
				t.Errorf("%s --version printed %q; want it to start %q", srv.name, out, prefix)
			}
			// An unreachable coordd: initialize needs none.
			cmd := exec.Command(srv.argv[0], append(srv.argv[1:], "--coordd", "127.0.0.1:1")...)
			cmd.Env = raceEnv()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "version-test", Version: "v0"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
			if err != nil {
				t.Fatalf("connect to %s: %v", srv.name, err)
			}
			defer cs.Close()
			if got := cs.InitializeResult().ServerInfo.Version; got != want {
				t.Errorf("%s tells MCP clients version %q; want %q", srv.name, got, want)
			}
		})
	}
}
