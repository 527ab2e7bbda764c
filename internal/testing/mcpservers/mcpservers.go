// Package mcpservers finds the MCP servers from npm that the gateway's
// tests run behind coordd, installed by `make mcp-servers` under
// .tools/mcp-servers. A test that needs one fails, naming the target,
// when it is missing; it skips only under -short, as every test that
// starts a child process does.
package mcpservers

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"github.com/coordd/coordd/internal/testing/redistest"
)

// root is the project's root directory.
func root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// TypeScriptSDK returns the directory of the official TypeScript MCP SDK
// (@modelcontextprotocol/sdk) that make mcp-servers installs.
func TypeScriptSDK(t redistest.TB) string {
	redistest.SkipShort(t)
	p := filepath.Join(root(), ".tools", "mcp-servers", "node_modules", "@modelcontextprotocol", "sdk")
	if _, err := os.Stat(filepath.Join(p, "package.json")); err != nil {
		t.Fatalf("the TypeScript MCP SDK is not installed at %s: run `make mcp-servers` (make test does)", p)
	}
	return p
}

// Command returns the command that starts the server installed as bin
// (such as mcp-server-gitlab), with node first.
func Command(t redistest.TB, bin string) []string {
	redistest.SkipShort(t)
	p := filepath.Join(root(), ".tools", "mcp-servers", "node_modules", ".bin", bin)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("the MCP server %s is not installed at %s: run `make mcp-servers` (make test does)", bin, p)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is not on PATH; the MCP servers from npm need it (Debian: apt-get install nodejs)")
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return []string{node, real}
}
