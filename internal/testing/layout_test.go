// Package testing_test holds the test of the fixtures' room: the shared
// test fixtures live under internal/testing/, and nothing that ships
// imports them.
package testing_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestFixturesStayOutOfBuilds: the commands coordd ships (coordd and
// mdn-mcp) and the client library build no package of internal/testing/;
// the control (server's tests, which start fleets) does.
func TestFixturesStayOutOfBuilds(t *testing.T) {
	deps := func(pkg string, test bool) []string {
		args := []string{"list", "-deps", "-f", "{{.ImportPath}}"}
		if test {
			args = append(args, "-test")
		}
		out, err := exec.Command("go", append(args, pkg)...).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		return strings.Fields(string(out))
	}
	const room = "github.com/coordd/coordd/internal/testing/"
	fixtures := func(pkg string, test bool) []string {
		var got []string
		for _, d := range deps(pkg, test) {
			if strings.HasPrefix(d, room) {
				got = append(got, d)
			}
		}
		return got
	}
	for _, pkg := range []string{"github.com/coordd/coordd/cmd/coordd", "github.com/coordd/coordd/cmd/mdn-mcp", "github.com/coordd/coordd/clients/go"} {
		if got := fixtures(pkg, false); len(got) > 0 {
			t.Errorf("%s builds test fixtures: %s", pkg, strings.Join(got, " "))
		}
	}
	if got := fixtures("github.com/coordd/coordd/server", true); len(got) == 0 {
		t.Fatal("the control: server's tests build no fixture, so the check above cannot fail")
	}
}

// TestArrowsRunDown: no package of internal/ outside internal/testing/
// imports the engine (coordinator) or the doors (server): internal/ holds
// the engine's leaves and the operational pieces beneath it, so every
// arrow runs down the house. The control: server/metrics, which reads the
// engine, does import coordinator.
func TestArrowsRunDown(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "github.com/coordd/coordd/internal/...", "github.com/coordd/coordd/server/metrics").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	up := map[string]bool{"github.com/coordd/coordd/coordinator": true, "github.com/coordd/coordd/server": true}
	control := false
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg, imports := f[0], f[1:]
		for _, imp := range imports {
			if !up[imp] {
				continue
			}
			switch {
			case pkg == "github.com/coordd/coordd/server/metrics":
				control = true
			case !strings.HasPrefix(pkg, "github.com/coordd/coordd/internal/testing/"):
				t.Errorf("%s imports %s: an arrow back up the house", pkg, imp)
			}
		}
	}
	if !control {
		t.Fatal("the control: server/metrics imports no coordinator, so the check above cannot fail")
	}
}
