package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd  string // upper case: FROM, RUN, ...
	args string
	line int
}

// stage is one FROM and the instructions under it.
type stage struct {
	image, name string
	body        []instruction
}

// parseDockerfile splits a Dockerfile into global ARGs and stages. It is a
// line reader (comments, blank lines, backslash continuations), not
// BuildKit's parser: that lives in github.com/moby/buildkit, a module far
// heavier than the check needs, and no engine is at hand to build the
// image. The tests below check what matters of each stage.
func parseDockerfile(t *testing.T, text string) (globals []instruction, stages []stage) {
	t.Helper()
	var cur *instruction
	for i, raw := range strings.Split(text, "\n") {
		line := strings.TrimSpace(raw)
		if line == "" || strings.HasPrefix(line, "#") {
			continue // a comment inside a continuation does not end it
		}
		more := strings.HasSuffix(line, "\\")
		line = strings.TrimSpace(strings.TrimSuffix(line, "\\"))
		if cur == nil {
			cmd, args, _ := strings.Cut(line, " ")
			cur = &instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args), line: i + 1}
		} else {
			cur.args += " " + line
		}
		if more {
			continue
		}
		switch {
		case cur.cmd == "FROM":
			f := strings.Fields(cur.args)
			st := stage{image: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			} else if len(f) != 1 {
				t.Fatalf("Dockerfile:%d: FROM %s: want IMAGE [AS NAME]", cur.line, cur.args)
			}
			stages = append(stages, st)
		case len(stages) == 0:
			if cur.cmd != "ARG" {
				t.Fatalf("Dockerfile:%d: %s before the first FROM", cur.line, cur.cmd)
			}
			globals = append(globals, *cur)
		default:
			stages[len(stages)-1].body = append(stages[len(stages)-1].body, *cur)
		}
		cur = nil
	}
	if cur != nil {
		t.Fatalf("Dockerfile:%d: continuation runs past the end", cur.line)
	}
	return globals, stages
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// goDirective returns go.mod's go version as major.minor.
func goDirective(t *testing.T) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(readFile(t, "../go.mod"))
	if m == nil {
		t.Fatal("go.mod: no go directive")
	}
	return m[1]
}

// TestDockerfile: a build stage makes static, trimmed binaries of coordd and
// mdn-mcp with the Go of go.mod; each runtime stage is distroless static (or
// scratch), runs as a non-root user and execs its binary, copied from the
// build stage; coordd is the default (last) stage and listens beyond
// loopback.
func TestDockerfile(t *testing.T) {
	globals, stages := parseDockerfile(t, readFile(t, "../Dockerfile"))
	if got, want := globals, 1; len(got) != want || !strings.HasPrefix(got[0].args, "GO_VERSION=") {
		t.Fatalf("global ARGs = %v; want GO_VERSION=<go.mod's go version>", got)
	}
	if got, want := strings.TrimPrefix(globals[0].args, "GO_VERSION="), goDirective(t); got != want {
		t.Errorf("ARG GO_VERSION=%s; want %s, go.mod's go directive", got, want)
	}
	byName := map[string]stage{}
	for _, st := range stages {
		byName[st.name] = st
	}
	build, ok := byName["build"]
	if !ok || !strings.HasPrefix(build.image, "golang:${GO_VERSION}") {
		t.Fatalf("build stage = %+v; want FROM golang:${GO_VERSION}... AS build", build)
	}
	var buildRun string
	for _, in := range build.body {
		if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
			buildRun = in.args
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-o /out/", "./cmd/coordd", "./cmd/mdn-mcp"} {
		if !strings.Contains(buildRun, want) {
			t.Errorf("build stage's go build %q lacks %q", buildRun, want)
		}
	}
	if got := stages[len(stages)-1].name; got != "coordd" {
		t.Errorf("last (default) stage = %q; want coordd", got)
	}
	for _, name := range []string{"coordd", "mdn-mcp"} {
		t.Run(name, func(t *testing.T) {
			st, ok := byName[name]
			if !ok {
				t.Fatalf("no stage %q", name)
			}
			if st.image != "gcr.io/distroless/static-debian12:nonroot" && st.image != "scratch" {
				t.Errorf("FROM %s; want gcr.io/distroless/static-debian12:nonroot or scratch", st.image)
			}
			var user, copied string
			var entrypoint, cmd []string
			for _, in := range st.body {
				switch in.cmd {
				case "USER":
					user = in.args
				case "COPY":
					f := strings.Fields(in.args)
					if len(f) == 3 && f[0] == "--from=build" && f[1] == "/out/"+name {
						copied = f[2]
					}
				case "ENTRYPOINT":
					entrypoint = execForm(t, in)
				case "CMD":
					cmd = execForm(t, in)
				case "RUN":
					t.Errorf("Dockerfile:%d: RUN in a runtime stage (distroless has no shell)", in.line)
				}
			}
			if u, _, _ := strings.Cut(user, ":"); u == "" || u == "root" || u == "0" {
				t.Errorf("USER %q; want a non-root user", user)
			}
			if copied == "" {
				t.Fatalf("no COPY --from=build /out/%s DEST", name)
			}
			if len(entrypoint) == 0 || entrypoint[0] != copied {
				t.Errorf("ENTRYPOINT %q; want the copied binary %s", entrypoint, copied)
			}
			if name == "coordd" && !strings.Contains(strings.Join(cmd, " "), "--listen :50051") {
				t.Errorf("coordd CMD %q; want --listen :50051 (the binary's default is loopback)", cmd)
			}
		})
	}
}

// execForm parses a JSON-array ENTRYPOINT or CMD: the shell form needs a
// shell, and it would not pass SIGTERM on to coordd.
func execForm(t *testing.T, in instruction) []string {
	t.Helper()
	var v []string
	if err := json.Unmarshal([]byte(in.args), &v); err != nil {
		t.Errorf("Dockerfile:%d: %s %s: want the exec (JSON array) form: %v", in.line, in.cmd, in.args, err)
	}
	return v
}

// TestDockerignore: the build context leaves out .git and the rest, but
// keeps go.mod, go.sum and every directory the two binaries are built from.
// The patterns are matched as plain paths (a prefix, or any path element
// for **/NAME), which is all this .dockerignore uses.
func TestDockerignore(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list: not run under -short")
	}
	var patterns []string
	for _, line := range strings.Split(readFile(t, "../.dockerignore"), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			rest := strings.TrimPrefix(strings.TrimPrefix(line, "**/"), "*.")
			if strings.ContainsAny(rest, "*?[!\\") {
				t.Fatalf(".dockerignore: %q: the test understands only plain paths, **/NAME and *.EXT", line)
			}
			patterns = append(patterns, line)
		}
	}
	ignored := func(rel string) bool {
		for _, p := range patterns {
			switch {
			case strings.HasPrefix(p, "**/"):
				for _, el := range strings.Split(rel, "/") {
					if el == p[3:] {
						return true
					}
				}
			case strings.HasPrefix(p, "*."):
				if !strings.Contains(rel, "/") && strings.HasSuffix(rel, p[1:]) {
					return true
				}
			case rel == p || strings.HasPrefix(rel, p+"/"):
				return true
			}
		}
		return false
	}
	if !ignored(".git") {
		t.Error(".dockerignore does not leave out .git")
	}
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if .Module}}{{if .Module.Main}}{{.Dir}}{{end}}{{end}}", "../cmd/coordd", "../cmd/mdn-mcp").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	need := []string{"go.mod", "go.sum"}
	for _, dir := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		need = append(need, filepath.ToSlash(rel))
	}
	if len(need) < 4 {
		t.Fatalf("go list found only %v", need)
	}
	for _, rel := range need {
		if ignored(rel) {
			t.Errorf(".dockerignore leaves out %s, which the build needs", rel)
		}
	}
}
