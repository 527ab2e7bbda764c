package haproxytest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestPathFound: the haproxy this machine has runs and reports its version.
func TestPathFound(t *testing.T) {
	out, err := exec.Command(Path(t), "-v").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "HAProxy version") {
		t.Fatalf("haproxy -v: %v, %q; want HAProxy version ...", err, out)
	}
}

// fatalRecorder records Fatalf instead of failing the test.
type fatalRecorder struct {
	*testing.T
	msg string
}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestPathLookup: PATH first, then the sbin directories; a failure that
// says how to install haproxy when neither has it.
func TestPathLookup(t *testing.T) {
	onPath, sbin, empty := t.TempDir(), t.TempDir(), t.TempDir()
	for _, dir := range []string{onPath, sbin} {
		if err := os.WriteFile(filepath.Join(dir, "haproxy"), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name, path, sbin string
		want             string // "" for a fatal failure
	}{
		{"on PATH", onPath, sbin, filepath.Join(onPath, "haproxy")},
		{"only in sbin", empty, sbin, filepath.Join(sbin, "haproxy")},
		{"missing", empty, empty, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("PATH", tt.path)
			old := sbinDirs
			sbinDirs = []string{tt.sbin}
			defer func() { sbinDirs = old }()
			r := &fatalRecorder{T: t}
			var got string
			done := make(chan struct{})
			go func() {
				defer close(done)
				got = lookup(r)
			}()
			<-done
			if got != tt.want {
				t.Errorf("Path = %q; want %q", got, tt.want)
			}
			if hint := "apt-get install -y haproxy"; (tt.want == "") != strings.Contains(r.msg, hint) {
				t.Errorf("failure %q; want one naming %q exactly when haproxy is missing", r.msg, hint)
			}
		})
	}
}
