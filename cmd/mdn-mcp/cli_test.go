package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestCommandLine runs the built mdn-mcp: --help exits 0 with the usage,
// --version prints the build's facts and exits 0, stray arguments exit 2
// naming them.
func TestCommandLine(t *testing.T) {
	bin := mcpBinary(t)
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{"help", []string{"--help"}, 0, "--coordd-token TOKEN", ""},
		{"h", []string{"-h"}, 0, "--mdn-base URL", ""},
		{"version", []string{"--version"}, 0, " (module github.com/coordd/coordd ", ""},
		{"stray arguments", []string{"--timeout", "5s", "extra", "--http", "127.0.0.1:0"}, 2, "", `mdn-mcp: unexpected arguments ["extra" "--http" "127.0.0.1:0"]`},
		{"unknown flag", []string{"--nope"}, 2, "", "flag provided but not defined: -nope\nusage: mdn-mcp [flags]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			cmd := exec.Command(bin, tt.args...)
			cmd.Env = raceEnv()
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tt.wantCode || !strings.Contains(stdout.String(), tt.wantStdout) || !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Errorf("mdn-mcp %v: exit %d, stdout %q, stderr %q; want exit %d, stdout with %q, stderr with %q",
					tt.args, code, stdout.String(), stderr.String(), tt.wantCode, tt.wantStdout, tt.wantStderr)
			}
		})
	}
}

// usageText is a --help output in parts: each flag's block (its line and
// its wrapped text) by the flag's name, and the rest, with the command's
// name replaced by NAME.
type usageText struct {
	flags map[string]string
	rest  string
}

// parseUsage splits out, the usage of the command name, into a usageText.
func parseUsage(out, name string) usageText {
	u := usageText{flags: map[string]string{}}
	var rest strings.Builder
	flag := ""
	for line := range strings.Lines(out) {
		switch {
		case strings.HasPrefix(line, "  --"):
			flag, _, _ = strings.Cut(strings.TrimPrefix(line, "  --"), " ")
			flag = strings.TrimRight(flag, ",\n")
			u.flags[flag] = line
		case flag != "" && strings.HasPrefix(line, "        "):
			u.flags[flag] += line
		default:
			flag = ""
			rest.WriteString(strings.ReplaceAll(line, name, "NAME"))
		}
	}
	u.rest = rest.String()
	return u
}

// TestUsage: both servers' --help and -h print a real usage on stdout and
// exit 0: the name each is installed as (the TypeScript one's from its
// package.json's bin), the transports, every flag with its default and the
// environment variables, and, for the flags they share, the same words in
// the same layout; never the environment's values. The Go server alone has
// --version, and takes gRPC targets for --coordd.
func TestUsage(t *testing.T) {
	mcpBinary(t)
	raw, err := os.ReadFile(filepath.Join("..", "..", "clients", "ts", "package.json"))
	if err != nil {
		t.Fatal(err)
	}
	var pkg struct {
		Bin map[string]string `json:"bin"`
	}
	if err := json.Unmarshal(raw, &pkg); err != nil || len(pkg.Bin) != 1 {
		t.Fatalf("clients/ts/package.json: bin %v, %v; want one command", pkg.Bin, err)
	}
	names := map[string]string{"go": "mdn-mcp", "ts": slices.Collect(maps.Keys(pkg.Bin))[0]}
	secrets := []string{"COORDD_TOKEN=secret-coordd-token-4711", "MDN_MCP_ALLOWED_ORIGINS=https://secret-origin.example", "MDN_MCP_TOKEN=secret-mcp-token-4711"}

	usages := map[string]usageText{}
	for _, impl := range implementations {
		name := names[impl.name]
		for _, help := range []string{"--help", "-h"} {
			t.Run(impl.name+" "+help, func(t *testing.T) {
				argv := append(impl.argv(t), help)
				cmd := exec.Command(argv[0], argv[1:]...)
				cmd.Env = append(raceEnv(), secrets...)
				var stdout, stderr bytes.Buffer
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				if err := cmd.Run(); err != nil || stderr.Len() > 0 {
					t.Fatalf("%s %s: %v, stderr %q; want exit 0, nothing on stderr", name, help, err, stderr.Bytes())
				}
				out := stdout.String()
				if want := "usage: " + name + " [flags]\n"; !strings.HasPrefix(out, want) {
					t.Errorf("%s %s starts %.40q; want %q", name, help, out, want)
				}
				words := strings.Join(strings.Fields(out), " ") // unwrapped
				for _, want := range []string{"stdio", "Streamable HTTP", "http://ADDR/mcp", "$COORDD_TOKEN", "$MDN_MCP_ALLOWED_ORIGINS", "$MDN_MCP_TOKEN",
					"\n  COORDD_TOKEN ", "\n  MDN_MCP_ALLOWED_ORIGINS ", "\n  MDN_MCP_TOKEN ", "(default 127.0.0.1:50051)", "(default 30s)"} {
					if !strings.Contains(out, want) && !strings.Contains(words, want) {
						t.Errorf("%s %s lacks %q:\n%s", name, help, want, out)
					}
				}
				if strings.Contains(out, "secret") {
					t.Errorf("%s %s shows the environment's values:\n%s", name, help, out)
				}
				usages[impl.name] = parseUsage(out, name)
			})
		}
	}
	g, ts := usages["go"], usages["ts"]
	if len(g.flags) == 0 || len(ts.flags) == 0 {
		t.Fatal("a usage is missing")
	}
	if g.rest != ts.rest {
		t.Errorf("the usages' text around the flags differs:\ngo:\n%s\nts:\n%s", g.rest, ts.rest)
	}
	// goOnly are the flags the TypeScript server lacks; apart are the
	// shared flags whose words must differ, with why.
	goOnly := map[string]bool{"version": true}
	apart := map[string]string{"coordd": "the Go client resolves every address and takes gRPC targets (dns:///)"}
	for flag, gb := range g.flags {
		tb, ok := ts.flags[flag]
		switch {
		case !ok && !goOnly[flag]:
			t.Errorf("the TypeScript server's usage lacks --%s", flag)
		case ok && apart[flag] == "" && gb != tb:
			t.Errorf("--%s reads differently:\ngo:\n%sts:\n%s", flag, gb, tb)
		case ok && apart[flag] != "" && strings.SplitAfter(gb, "\n")[0] != strings.SplitAfter(tb, "\n")[0]:
			t.Errorf("--%s takes different arguments (its words may differ: %s):\ngo:\n%sts:\n%s", flag, apart[flag], gb, tb)
		}
	}
	for flag := range ts.flags {
		if _, ok := g.flags[flag]; !ok {
			t.Errorf("the Go server's usage lacks --%s", flag)
		}
	}
}
