// Package haproxytest finds the haproxy executable for tests that run or
// check HAProxy. Such tests fail when it is missing (`make deps` installs
// it), and skip only under go test -short, whatever is installed.
package haproxytest

import (
	"os/exec"
	"testing"
)

// sbinDirs are where packages install haproxy. Debian puts it in /usr/sbin,
// which a non-root user's PATH usually lacks.
var sbinDirs = []string{"/usr/sbin", "/usr/local/sbin"}

// Path returns the haproxy executable: haproxy on PATH, else one in
// /usr/sbin or /usr/local/sbin. If there is none it calls t.Fatalf, with
// how to install it, so call it from the test goroutine. Under go test
// -short it skips the test: the short loop starts no process.
func Path(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("needs haproxy: not run under -short")
	}
	return lookup(t)
}

// lookup is Path without the skip under -short.
func lookup(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("haproxy")
	if err == nil {
		return p
	}
	for _, dir := range sbinDirs {
		if p, err := exec.LookPath(dir + "/haproxy"); err == nil {
			return p
		}
	}
	t.Fatalf("haproxytest: haproxy not found on PATH nor in %v; install it with `sudo apt-get install -y haproxy` (macOS: `brew install haproxy`), or run `make deps`, which installs it", sbinDirs)
	return ""
}
