package deploy

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
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
// archive per command holding the binary, LICENSE and README.md; a
// SHA256SUMS that sha256sum -c accepts; binaries that are static (no
// dynamic loader, no shared libraries), built with -trimpath and
// CGO_ENABLED=0 as go version -m shows, and stamped with the version that
// --version prints; and
// archives that a second run reproduces byte for byte.
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
	want := []string{"SHA256SUMS"}
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
	if n := strings.Count(string(sums), "\n"); n != 2 {
		t.Errorf("SHA256SUMS has %d lines, want one per archive:\n%s", n, sums)
	}

	license, err := os.ReadFile(filepath.Join(root, "LICENSE"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"coordd", "mdn-mcp"} {
		t.Run(c, func(t *testing.T) {
			name := c + "_" + distVersion + "_linux_amd64"
			files := readTarGz(t, filepath.Join(dir, name+".tar.gz"))
			var names []string
			for n := range files {
				names = append(names, n)
			}
			slices.Sort(names)
			wantNames := []string{name + "/LICENSE", name + "/README.md", name + "/" + c}
			if !slices.Equal(names, wantNames) {
				t.Fatalf("archive holds %q, want %q", names, wantNames)
			}
			if !bytes.Equal(files[name+"/LICENSE"].data, license) {
				t.Error("the archive's LICENSE differs from the repository's")
			}
			bin := files[name+"/"+c]
			if bin.mode&0o111 == 0 {
				t.Errorf("%s is not executable: mode %v", c, bin.mode)
			}
			checkStatic(t, bin.data)

			path := filepath.Join(t.TempDir(), c)
			if err := os.WriteFile(path, bin.data, 0o755); err != nil {
				t.Fatal(err)
			}
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
