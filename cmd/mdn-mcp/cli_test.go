package main

import (
	"bytes"
	"errors"
	"os/exec"
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
		{"help", []string{"--help"}, 0, "", "-coordd-token"},
		{"h", []string{"-h"}, 0, "", "-mdn-base"},
		{"version", []string{"--version"}, 0, " (module github.com/coordd/coordd ", ""},
		{"stray arguments", []string{"--timeout", "5s", "extra", "--http", "127.0.0.1:0"}, 2, "", `mdn-mcp: unexpected arguments ["extra" "--http" "127.0.0.1:0"]`},
		{"unknown flag", []string{"--nope"}, 2, "", "flag provided but not defined: -nope"},
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
