package deploy

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// distVersion is stamped by the test's make dist: a string found nowhere
// else in a binary.
const distVersion = "0.0.0-disttest.7"

// TestDist runs make dist, as a release is built, for one platform
// (linux/amd64: the machine's own, so the binaries can be inspected here)
// into a temporary directory, and checks what a user downloads: one
// archive per command holding the binary, LICENSE, the README and the
// documentation it links to (docs/ with its images), the example
// configuration and the deploy files (checkDistFiles: every relative link
// of every Markdown file resolves inside the archive); the example
// configuration accepted by the archive's own coordd, alone and on the
// systemd unit's command lines (checkDistConfig); the Python client's
// wheel and sdist beside them (checkWheel, checkSdist); a SHA256SUMS that
// sha256sum -c accepts; binaries that are static (no dynamic loader, no
// shared libraries), built with -trimpath and CGO_ENABLED=0 as go version
// -m shows, and stamped with the version that --version prints; and
// archives, wheel and sdist that a second run reproduces byte for byte.
func TestDist(t *testing.T) {
	if testing.Short() {
		t.Skip("builds coordd and mdn-mcp with make dist (skipped under -short)")
	}
	tools := map[string]string{}
	for _, tool := range []string{"make", "go", "tar", "gzip", "sha256sum"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Fatalf("make dist needs %s on PATH: %v", tool, err)
		}
		tools[tool] = p
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	run := func(dir string, name string, args ...string) (string, error) {
		cmd := exec.CommandContext(t.Context(), tools[name], args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	dist := func(dir, version string) (string, error) {
		return run(root, "make", "--no-print-directory", "dist", "GO="+tools["go"],
			"DIST_DIR="+dir, "DIST_PLATFORMS=linux/amd64", "VERSION="+version)
	}

	// A VERSION that cannot name a file is refused before anything is built.
	bad := t.TempDir()
	if out, err := dist(bad, "1.0 beta"); err == nil || !strings.Contains(out, "VERSION '1.0 beta' must be") {
		t.Errorf("make dist VERSION='1.0 beta': err %v, want a refusal naming VERSION; output:\n%s", err, out)
	}
	if entries, _ := os.ReadDir(bad); len(entries) > 0 {
		t.Errorf("a refused make dist left files in DIST_DIR: %v", entries)
	}

	dir := t.TempDir()
	if out, err := dist(dir, distVersion); err != nil {
		t.Fatalf("make dist: %v\n%s", err, out)
	}
	// The Python client's wheel and sdist, named for its own version.
	pyproject, err := os.ReadFile(filepath.Join(root, "clients", "python", "pyproject.toml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^version = "([^"]+)"$`).FindSubmatch(pyproject)
	if m == nil {
		t.Fatal("clients/python/pyproject.toml: no version")
	}
	pyVersion := string(m[1])
	wheel, sdist := "coordd-"+pyVersion+"-py3-none-any.whl", "coordd-"+pyVersion+".tar.gz"
	want := []string{"SHA256SUMS", wheel, sdist}
	for _, c := range []string{"coordd", "mdn-mcp"} {
		want = append(want, c+"_"+distVersion+"_linux_amd64.tar.gz")
	}
	slices.Sort(want)
	var got []string
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if !slices.Equal(got, want) {
		t.Fatalf("DIST_DIR holds %q, want %q", got, want)
	}
	if out, err := run(dir, "sha256sum", "-c", "--strict", "SHA256SUMS"); err != nil {
		t.Errorf("sha256sum -c SHA256SUMS: %v\n%s", err, out)
	}
	sums, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(sums), "\n"); n != len(want)-1 {
		t.Errorf("SHA256SUMS has %d lines, want one per archive, wheel and sdist:\n%s", n, sums)
	}
	t.Run("python", func(t *testing.T) {
		checkWheel(t, filepath.Join(dir, wheel), pyVersion)
		checkSdist(t, filepath.Join(dir, sdist), pyVersion)
	})

	var docs []string // what every archive holds beside its binary
	for _, c := range []string{"coordd", "mdn-mcp"} {
		t.Run(c, func(t *testing.T) {
			name := c + "_" + distVersion + "_linux_amd64"
			files := readTarGz(t, filepath.Join(dir, name+".tar.gz"))
			var names []string
			for n := range files {
				rel, ok := strings.CutPrefix(n, name+"/")
				if !ok {
					t.Errorf("%s is outside the archive's directory %s/", n, name)
					continue
				}
				if rel != c {
					names = append(names, rel)
				}
			}
			slices.Sort(names)
			checkDistFiles(t, root, names, func(rel string) []byte { return files[name+"/"+rel].data })
			if docs == nil {
				docs = names
			} else if !slices.Equal(names, docs) {
				t.Errorf("the %s archive holds %q beside its binary; the other %q: want the same", c, names, docs)
			}

			bin := files[name+"/"+c]
			if bin.data == nil {
				t.Fatalf("archive holds no %s/%s", name, c)
			}
			if bin.mode&0o111 == 0 {
				t.Errorf("%s is not executable: mode %v", c, bin.mode)
			}
			checkStatic(t, bin.data)

			// The archive as a user unpacks it.
			unpacked := t.TempDir()
			for n, f := range files {
				p := filepath.Join(unpacked, filepath.FromSlash(strings.TrimPrefix(n, name+"/")))
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, f.data, f.mode.Perm()|0o200); err != nil {
					t.Fatal(err)
				}
			}
			path := filepath.Join(unpacked, c)
			info, err := run(root, "go", "version", "-m", path)
			if err != nil {
				t.Fatalf("go version -m: %v\n%s", err, info)
			}
			for _, setting := range []string{
				"\tpath\tgithub.com/coordd/coordd/cmd/" + c + "\n",
				"\tbuild\t-trimpath=true\n",
				"\tbuild\tCGO_ENABLED=0\n",
				"\tbuild\tGOOS=linux\n",
				"\tbuild\tGOARCH=amd64\n",
			} {
				if !strings.Contains(info, setting) {
					t.Errorf("go version -m %s lacks %q:\n%s", c, strings.TrimSpace(setting), info)
				}
			}
			// The stamp: internal/version.Version, set with -ldflags -X,
			// which --version prints.
			out, err := exec.CommandContext(t.Context(), path, "--version").CombinedOutput()
			if err != nil || !strings.Contains(string(out), distVersion) {
				t.Errorf("%s --version: %v; want the stamped %q in:\n%s", c, err, distVersion, out)
			}
			if c == "coordd" {
				checkDistConfig(t, unpacked)
			}
		})
	}

	// The same sources and VERSION make the same archives: sorted entries,
	// owner 0, the last commit's time, gzip without a name or time.
	again := t.TempDir()
	if out, err := dist(again, distVersion); err != nil {
		t.Fatalf("make dist, second run: %v\n%s", err, out)
	}
	sums2, err := os.ReadFile(filepath.Join(again, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(sums, sums2) {
		t.Errorf("a second make dist made different archives:\n%s\nvs\n%s", sums, sums2)
	}
}

// checkDistFiles checks what an archive holds beside its binary (names,
// relative to the archive's directory; data reads one): the README with
// every file its links and theirs reach, docs/ whole, the example
// configuration at the root and in deploy/, and the deploy files an
// operator needs (the systemd unit, the Kubernetes manifests); each the
// repository's file of the same path, byte for byte; no Go file; and every
// relative link of every Markdown file resolving inside the archive.
func checkDistFiles(t *testing.T, root string, names []string, data func(string) []byte) {
	t.Helper()
	have := map[string]bool{}
	for _, n := range names {
		have[n] = true
	}
	want := []string{"LICENSE", "README.md", "CHANGELOG.md", "coordd.example.yaml",
		"deploy/coordd.example.yaml", "deploy/systemd/coordd.service"}
	for _, tree := range []string{"docs", "deploy/kubernetes"} {
		err := filepath.WalkDir(filepath.Join(root, tree), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, err := filepath.Rel(root, p)
			want = append(want, filepath.ToSlash(rel))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range want {
		if !have[w] {
			t.Errorf("the archive lacks %s", w)
		}
	}
	if !slices.Contains(want, "docs/img/status.png") {
		t.Errorf("docs/img/status.png is not among the repository's docs: %q", want)
	}
	for _, n := range names {
		if strings.HasSuffix(n, ".go") {
			t.Errorf("the archive holds Go source %s", n)
		}
		src := n
		if n == "coordd.example.yaml" {
			src = "deploy/coordd.example.yaml" // the same file, where an operator looks first
		}
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(src)))
		if err != nil {
			t.Errorf("the archive's %s: not a file of the repository: %v", n, err)
			continue
		}
		if !bytes.Equal(data(n), b) {
			t.Errorf("the archive's %s differs from the repository's %s", n, src)
		}
	}

	// Links: every relative link of every .md resolves to a file of the
	// archive, or to a directory holding some (deploy/kubernetes); an
	// anchor to a heading of that file.
	isDir := func(p string) bool {
		for _, n := range names {
			if strings.HasPrefix(n, p+"/") {
				return true
			}
		}
		return false
	}
	links := 0
	for _, n := range names {
		if !strings.HasSuffix(n, ".md") {
			continue
		}
		for _, link := range markdownLinks(string(data(n))) {
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			links++
			target, anchor, _ := strings.Cut(link, "#")
			p := n
			if target != "" {
				p = path.Join(path.Dir(n), target)
			}
			switch {
			case p == ".." || strings.HasPrefix(p, "../"):
				t.Errorf("%s: link %q leaves the archive", n, link)
			case have[p]:
				if anchor != "" && !markdownAnchors(string(data(p)))[anchor] {
					t.Errorf("%s: link %q: %s has no heading with anchor #%s", n, link, p, anchor)
				}
			case isDir(strings.TrimSuffix(p, "/")) && anchor == "":
			default:
				t.Errorf("%s: link %q: %s is not in the archive", n, link, p)
			}
		}
	}
	if links < 50 {
		t.Errorf("found %d relative links in the archive's Markdown; want the docs' cross-links", links)
	}
}

// checkDistConfig runs the unpacked coordd archive's own binary on its
// example configuration, alone and as the systemd unit's command lines run
// it (ExecStartPre, ExecStart: the unit's paths /usr/local/bin/coordd and
// /etc/coordd/coordd.yaml taken as the archive's binary and example), each
// with --check-config.
func checkDistConfig(t *testing.T, dir string) {
	t.Helper()
	bin, example := filepath.Join(dir, "coordd"), filepath.Join(dir, "coordd.example.yaml")
	var env []string // none of the test's COORDD_* settings
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "COORDD_") {
			env = append(env, kv)
		}
	}
	check := func(args ...string) {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), bin, args...)
		cmd.Dir, cmd.Env = t.TempDir(), env
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "configuration ok") {
			t.Errorf("coordd %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	check("--check-config", "--config", example)

	unit, err := os.ReadFile(filepath.Join(dir, "deploy", "systemd", "coordd.service"))
	if err != nil {
		t.Fatal(err)
	}
	cmds := 0
	for _, key := range []string{"ExecStartPre", "ExecStart"} {
		for _, line := range unitValues(string(unit), "Service", key) {
			args := strings.Fields(line)
			if len(args) == 0 || args[0] != "/usr/local/bin/coordd" {
				t.Errorf("%s=%s: want /usr/local/bin/coordd and its flags", key, line)
				continue
			}
			args = args[1:]
			for i, a := range args {
				args[i] = strings.ReplaceAll(a, "/etc/coordd/coordd.yaml", example)
			}
			if !slices.Contains(args, "--check-config") {
				args = append(args, "--check-config")
			}
			check(args...)
			cmds++
		}
	}
	if cmds == 0 {
		t.Error("the systemd unit has no ExecStart")
	}
}

// checkWheel checks the Python client's wheel: pure Python, the package
// with its generated stubs and the py.typed marker (PEP 561), listed in
// RECORD, the dependencies declared, no tests.
func checkWheel(t *testing.T, path, version string) {
	t.Helper()
	zr, err := zip.OpenReader(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	defer zr.Close()
	read := func(name string) string {
		f, err := zr.Open(name)
		if err != nil {
			t.Errorf("the wheel lacks %s: %v", name, err)
			return ""
		}
		defer f.Close()
		b, err := io.ReadAll(f)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	info := "coordd-" + version + ".dist-info/"
	for _, name := range []string{"coordd/__init__.py", "coordd/_aio.py", "coordd/py.typed",
		"coordd/v1/coordd_pb2.py", "coordd/v1/coordd_pb2.pyi", "coordd/_vendor/google/rpc/status_pb2.py"} {
		read(name)
	}
	for _, f := range zr.File {
		if strings.HasPrefix(f.Name, "tests/") || strings.Contains(f.Name, "__pycache__") || strings.HasSuffix(f.Name, ".go") {
			t.Errorf("the wheel holds %s", f.Name)
		}
	}
	if !strings.Contains(read(info+"RECORD"), "coordd/py.typed,") {
		t.Errorf("the wheel's RECORD does not list coordd/py.typed")
	}
	if w := read(info + "WHEEL"); !strings.Contains(w, "Root-Is-Purelib: true") || !strings.Contains(w, "Tag: py3-none-any") {
		t.Errorf("the wheel is not pure Python (py3-none-any):\n%s", w)
	}
	md := read(info + "METADATA")
	for _, want := range []string{"Name: coordd\n", "Version: " + version + "\n", "Requires-Dist: grpcio", "Requires-Dist: protobuf"} {
		if !strings.Contains(md, want) {
			t.Errorf("the wheel's METADATA lacks %q:\n%s", want, md)
		}
	}
}

// checkSdist checks the Python client's source distribution: the package
// with py.typed, pyproject.toml, the README and PKG-INFO under
// coordd-VERSION/, owned by 0:0 (readTarGz).
func checkSdist(t *testing.T, path, version string) {
	t.Helper()
	files := readTarGz(t, path)
	top := "coordd-" + version + "/"
	for _, name := range []string{"PKG-INFO", "pyproject.toml", "README.md", "coordd/__init__.py", "coordd/py.typed", "coordd/v1/coordd_pb2.pyi"} {
		if _, ok := files[top+name]; !ok {
			t.Errorf("the sdist lacks %s%s", top, name)
		}
	}
	for name := range files {
		if !strings.HasPrefix(name, top) || strings.Contains(name, "__pycache__") || strings.HasSuffix(name, ".go") {
			t.Errorf("the sdist holds %s", name)
		}
	}
}

type tarFile struct {
	mode os.FileMode
	data []byte
}

// readTarGz returns the regular files of a .tar.gz by name.
func readTarGz(t *testing.T, path string) map[string]tarFile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	tr := tar.NewReader(zr)
	files := map[string]tarFile{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: %s is owned by %d:%d, want 0:0", path, h.Name, h.Uid, h.Gid)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("%s: %s: %v", path, h.Name, err)
		}
		files[h.Name] = tarFile{mode: h.FileInfo().Mode(), data: data}
	}
}

// checkStatic fails unless bin is an x86-64 ELF executable that needs no
// dynamic loader (no PT_INTERP program header) and no shared library: it
// runs on any Linux, distroless or scratch included.
func checkStatic(t *testing.T, bin []byte) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Fatalf("not an ELF file: %v", err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 || f.Type != elf.ET_EXEC {
		t.Errorf("ELF machine %v type %v, want EM_X86_64 ET_EXEC", f.Machine, f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary has a PT_INTERP program header: it needs a dynamic loader (built with cgo?)")
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
		t.Errorf("the binary needs shared libraries %q (err %v)", libs, err)
	}
}
