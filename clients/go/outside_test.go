package coordd_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// serverOnly are import path prefixes of the server's dependencies and of
// its own packages: none may be in the build of a program that imports
// only the client, except the packages of otelAPI's modules.
var serverOnly = []string{
	"github.com/redis/go-redis/",
	"github.com/allegro/bigcache/",
	"github.com/prometheus/",
	"github.com/grpc-ecosystem/go-grpc-middleware/",
	"github.com/modelcontextprotocol/",
	"go.opentelemetry.io/",
	"gonum.org/",
	"go.yaml.in/yaml/",
	"gopkg.in/yaml",
	"sigs.k8s.io/yaml",
	"github.com/coordd/coordd/coordinator",
	"github.com/coordd/coordd/server",
	"github.com/coordd/coordd/internal/",
	"github.com/coordd/coordd/cmd/",
}

// sharedWithServer are the module's own packages the client shares with
// the server: the one HTTP rendering of an answer, a leaf whose imports
// (gRPC's status, the generated messages) the client has anyway; anything
// it pulled in beyond them would be caught by the prefixes above.
var sharedWithServer = []string{"github.com/coordd/coordd/internal/httprender"}

// otelAPI are the OpenTelemetry modules whose packages the client may
// build: the API (go.opentelemetry.io/otel, with its propagation package,
// and the trace API), which the client imports to send the traceparent of
// the caller's span (trace.go). Never the SDK, the exporters or contrib:
// a program that configures no tracing gets no span and sends nothing.
var otelAPI = []string{"go.opentelemetry.io/otel", "go.opentelemetry.io/otel/trace"}

const outsideMain = `package main

import (
	"context"
	"fmt"
	"net/http"
	"os"

	coordd "github.com/coordd/coordd/clients/go"
)

func main() {
	c, err := coordd.Dial("127.0.0.1:1")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer c.Close()
	_, err = c.Get(context.Background(), "http://127.0.0.1:1/")
	fmt.Println(err != nil)
	hc := &http.Client{Transport: coordd.NewTransport(c)}
	_, err = hc.Get("http://127.0.0.1:1/")
	fmt.Println(err != nil)
}
`

// TestOutsideModule builds a program in a module of its own that imports
// the client, as a user's project would (the repository stands in for the
// published module through a replace directive), and checks that its build
// holds none of the server's dependencies: the client shares the
// repository's go.mod, so what keeps Redis, Prometheus, the MCP SDK and
// the rest out of a user's binary is the client's import graph (module
// graph pruning keeps their code out of the download too).
func TestOutsideModule(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command to build an outside module (skipped under -short)")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is not on PATH: %v", err)
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	rootMod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goLine := regexp.MustCompile(`(?m)^go \S+$`).Find(rootMod)
	if goLine == nil {
		t.Fatal("no go line in the repository's go.mod")
	}

	dir := t.TempDir()
	gomod := "module example.com/outside\n\n" + string(goLine) + "\n\n" +
		"require github.com/coordd/coordd v0.0.0-00010101000000-000000000000\n\n" +
		"replace github.com/coordd/coordd => " + root + "\n"
	// The repository's go.sum has every checksum the client's dependencies
	// need, so the build asks no checksum database: it works offline from
	// the module cache.
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"go.mod": []byte(gomod), "go.sum": sum, "main.go": []byte(outsideMain)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	goCmd := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), goBin, args...)
		cmd.Dir = dir
		// GOFLAGS replaces the machine's: -mod=mod lets the go command
		// complete the outside go.mod; GOWORK=off ignores any go.work above.
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, stderr.Bytes())
		}
		return string(out)
	}

	goCmd("build", "-o", filepath.Join(dir, "outside"), ".")
	var deps, modules []string
	moduleOf := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(goCmd("list", "-deps", "-f",
		"{{if not .Standard}}{{.ImportPath}} {{with .Module}}{{.Path}}{{end}}{{end}}", ".")), "\n") {
		pkg, mod, _ := strings.Cut(line, " ")
		deps = append(deps, pkg)
		moduleOf[pkg] = mod
		if mod != "" && !slices.Contains(modules, mod) {
			modules = append(modules, mod)
		}
	}
	for _, want := range []string{"github.com/coordd/coordd/clients/go", "go.opentelemetry.io/otel/propagation"} {
		if !slices.Contains(deps, want) {
			t.Fatalf("go list -deps does not list %s: %q", want, deps)
		}
	}
	bad := slices.DeleteFunc(matching(deps, serverOnly), func(pkg string) bool {
		return slices.Contains(otelAPI, moduleOf[pkg]) || slices.Contains(sharedWithServer, pkg)
	})
	if len(bad) > 0 {
		t.Errorf("a program importing only the client builds server packages:\n%s", strings.Join(bad, "\n"))
	}
	slices.Sort(modules)
	t.Logf("%d packages outside the standard library, from %d modules: %s", len(deps), len(modules), strings.Join(modules, " "))

	// The control: the same listing of the server, from the same module,
	// shows what the check looks for, so the check above can fail.
	server := strings.Fields(goCmd("list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "github.com/coordd/coordd/server"))
	if got := matching(server, serverOnly); !slices.Contains(got, "github.com/redis/go-redis/v9") {
		t.Fatalf("the control found no go-redis in the server's graph: %q", got)
	}
}

func matching(pkgs, prefixes []string) []string {
	var out []string
	for _, p := range pkgs {
		for _, pre := range prefixes {
			if strings.HasPrefix(p, pre) {
				out = append(out, p)
				break
			}
		}
	}
	return out
}
