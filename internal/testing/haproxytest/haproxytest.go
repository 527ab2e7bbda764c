// Package haproxytest finds the haproxy executable for tests that run or
// check HAProxy. Such tests fail when it is missing (`make deps` installs
// it), and skip only under go test -short, whatever is installed.
package haproxytest

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"io"
	"net"
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

// Server is one server's state in HAProxy's `show stat`.
type Server struct {
	Status   string // UP, DOWN, MAINT…
	Check    string // the last check's status: L7OK, L4CON…
	Requests int    // stot: requests sent to it
}

// Stats returns the state of backend's servers, by name, from HAProxy's
// stats socket sock (a `stats socket` in the configuration).
func Stats(sock, backend string) (map[string]Server, error) {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if _, err := io.WriteString(c, "show stat\n"); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(c)
	if err != nil {
		return nil, err
	}
	r := csv.NewReader(bytes.NewReader(bytes.TrimPrefix(b, []byte("# "))))
	r.FieldsPerRecord = -1
	rows, err := r.ReadAll()
	if err != nil || len(rows) == 0 {
		return nil, fmt.Errorf("show stat: %q: %v", b, err)
	}
	col := map[string]int{}
	for i, name := range rows[0] {
		col[name] = i
	}
	st := map[string]Server{}
	for _, row := range rows[1:] {
		if len(row) > col["check_status"] && row[col["pxname"]] == backend && row[col["svname"]] != "BACKEND" {
			s := Server{Status: row[col["status"]], Check: row[col["check_status"]]}
			fmt.Sscan(row[col["stot"]], &s.Requests)
			st[row[col["svname"]]] = s
		}
	}
	return st, nil
}
