package python_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// installSection is the README's section whose sh example TestWheelInstall
// runs.
const installSection = "\n## Install\n"

// TestWheelInstall builds the wheel as make dist does (make dist-python,
// with Debian's setuptools, wheel and build, no network) and runs the
// README's install example as written, the apt-get line aside: a fresh
// virtual environment that sees Debian's grpcio and protobuf, pip install
// --no-index of the wheel, then the installed CLI against a real coordd.
// Proxies pointing nowhere make any network access but to 127.0.0.1 fail. It then checks
// that the package was imported from the virtual environment with its
// py.typed marker, and that its exceptions answer to both names.
func TestWheelInstall(t *testing.T) {
	py := python(t)
	makePath, err := exec.LookPath("make")
	if err != nil {
		t.Fatalf("make not found on PATH: %v", err)
	}
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	section, ok := between(string(b), installSection, "\n## ")
	if !ok {
		t.Fatalf("README.md has no %q section", strings.TrimSpace(installSection))
	}
	var script string
	for _, m := range fence.FindAllStringSubmatch(section, -1) {
		if m[1] == "sh" && strings.Contains(m[2], ".whl") {
			script = m[2]
			break
		}
	}
	for _, want := range []string{"-m venv --system-site-packages .venv", "pip install --no-index dist/coordd-", ".whl", "-m coordd get"} {
		if !strings.Contains(script, want) {
			t.Fatalf("the README's install example (a sh block of %q with a .whl) lacks %q:\n%s", strings.TrimSpace(installSection), want, script)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e := env(t)
	offline := append(e, "PIP_DISABLE_PIP_VERSION_CHECK=1",
		"http_proxy=http://127.0.0.1:9", "https_proxy=http://127.0.0.1:9",
		"HTTP_PROXY=http://127.0.0.1:9", "HTTPS_PROXY=http://127.0.0.1:9",
		"no_proxy=127.0.0.1", "NO_PROXY=127.0.0.1") // gRPC follows them too: coordd is on 127.0.0.1

	// The wheel, as make dist builds it, into dist/ of a working directory.
	work := t.TempDir()
	dist := filepath.Join(work, "dist")
	cmd := exec.CommandContext(ctx, makePath, "--no-print-directory", "dist-python", "DIST_DIR="+dist, "DIST_PYTHON="+py)
	cmd.Dir, cmd.Env = mustAbs(t, "../.."), offline
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make dist-python: %v\n%s", err, out)
	}
	wheels, _ := filepath.Glob(filepath.Join(dist, "coordd-*-py3-none-any.whl"))
	if len(wheels) != 1 {
		t.Fatalf("make dist-python made wheels %q; want one", wheels)
	}

	// The README's commands, as written but for the addresses and the
	// interpreter under test; not apt-get.
	var lines []string
	for _, line := range strings.Split(script, "\n") {
		if strings.HasPrefix(line, "sudo apt-get ") || strings.HasPrefix(line, "make dist-python") { // the wheel is built above
			continue
		}
		lines = append(lines, line)
	}
	u := lookup(e, "COORDD_UPSTREAM")
	replacer := strings.NewReplacer(readmeTarget, lookup(e, "COORDD_TARGET"),
		readmeMDN+readmeDoc, u+"/docs/hello", "/usr/bin/python3 ", py+" ")
	cmd = exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", replacer.Replace(strings.Join(lines, "\n")))
	cmd.Dir, cmd.Env = work, offline
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("the README's install example: %v\n%s%s", err, out, stderr)
	}
	if !strings.HasSuffix(string(out), "hello from the upstream\n") {
		t.Errorf("the README's install example printed %q; want the document's body last", out)
	}

	venv := filepath.Join(work, ".venv")
	check := `import pathlib, coordd
pkg = pathlib.Path(coordd.__file__).parent
assert (pkg / "py.typed").is_file(), "no py.typed in %s" % pkg
assert coordd.PermissionDenied is coordd.PermissionDeniedError
print(pkg)
`
	cmd = exec.CommandContext(ctx, filepath.Join(venv, "bin", "python"), "-c", check)
	cmd.Dir, cmd.Env = t.TempDir(), offline
	where, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the installed package: %v\n%s", err, where)
	}
	if !regexp.MustCompile(`^` + regexp.QuoteMeta(venv) + `/lib/python3[.0-9]*/site-packages/coordd\n$`).Match(where) {
		t.Errorf("coordd imported from %s; want the virtual environment's site-packages", where)
	}
}
