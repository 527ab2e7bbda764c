package clientconformance

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadCorpus(t *testing.T) {
	c, err := Load("../../../testdata/client-conformance")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Cases) == 0 {
		t.Fatal("no cases")
	}
}

// TestLoadRefuses checks that what a runner could not play fails the load
// instead of being skipped.
func TestLoadRefuses(t *testing.T) {
	const head = `{"client": {"max_attempts": 4, "initial_backoff_ms": 1, "max_backoff_ms": 2, "timeout_ms": 1000}, "cases": [`
	const ok = `{"name": "a", "about": "x", "attempts": [[{"metadata": {"status_code": 200, "size": 0}}]], "want": {"document": {"body": ""}, "attempts": 1}}`
	tests := []struct {
		name, cases, want string
	}{
		{"unknown case field", strings.Replace(ok, `"about"`, `"skip": true, "about"`, 1), "unknown field"},
		{"unknown step", strings.Replace(ok, `"metadata"`, `"trailer"`, 1), "unknown field"},
		{"two actions in a step", strings.Replace(ok, `{"metadata"`, `{"cut": true, "metadata"`, 1), "exactly one"},
		{"step after status", strings.Replace(ok, `[[`, `[[{"status": {"code": "UNAVAILABLE"}}, `, 1), "nothing may follow"},
		{"unknown code", strings.Replace(ok, `{"document": {"body": ""}`, `{"error": "NOPE"`, 1), "not a gRPC code"},
		{"duplicate name", ok + "," + ok, "twice"},
		{"unknown call field", strings.Replace(ok, `"about"`, `"call": {"deadline": 1}, "about"`, 1), "unknown field"},
		{"unknown call priority", strings.Replace(ok, `"about"`, `"call": {"priority": "urgent"}, "about"`, 1), "call.priority"},
		{"unknown want priority", strings.Replace(ok, `"attempts": 1}`, `"attempts": 1, "priority": "PRIORITY_URGENT"}`, 1), "want.priority"},
		{"no cases", "", "no cases"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, CorpusFile), []byte(head+tt.cases+"]}"), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Load(dir)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Load: %v; want an error saying %q", err, tt.want)
			}
		})
	}
}
