package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConformanceNode: conformanceNode finds the node the suite's launcher
// would run (its shebang's, through PATH as env does) and refuses one older
// than Node 22 with a message naming the version needed and where to get it.
func TestConformanceNode(t *testing.T) {
	if testing.Short() {
		t.Skip("runs stand-ins for node (skipped under -short)")
	}
	fakeNode := func(version string) string {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "node"), []byte("#!/bin/sh\necho "+version+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	node20, node22, node24 := fakeNode("v20.20.2"), fakeNode("v22.23.5"), fakeNode("v24.1.0")
	notExec := t.TempDir() // a node that is not executable: env passes over it
	if err := os.WriteFile(filepath.Join(notExec, "node"), []byte("#!/bin/sh\necho v99.0.0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	launcher := func(shebang string) string {
		p := filepath.Join(t.TempDir(), "conformance")
		if err := os.WriteFile(p, []byte(shebang+"\nconsole.log('suite')\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	env := launcher("#!/usr/bin/env node")
	list := func(dirs ...string) string { return strings.Join(dirs, string(os.PathListSeparator)) }
	for _, tc := range []struct {
		name     string
		launcher string
		path     string
		want     string   // the node chosen, when accepted
		wantErr  []string // what the refusal says
	}{
		{"Node 22 first", env, list(node22, node20), filepath.Join(node22, "node"), nil},
		{"newer", env, list(node24), filepath.Join(node24, "node"), nil},
		{"Node 20 first", env, list(node20, node22), "", []string{"Node.js 22 or newer", filepath.Join(node20, "node"), "v20.20.2", "make conformance-tools"}},
		{"not executable skipped", env, list(notExec, node22), filepath.Join(node22, "node"), nil},
		{"none", env, list(t.TempDir()), "", []string{"Node.js 22 or newer", "no node", "make conformance-tools"}},
		{"absolute shebang", launcher("#!" + filepath.Join(node20, "node")), list(node22), "", []string{"Node.js 22 or newer", "v20.20.2"}},
		{"env -S", launcher("#!/usr/bin/env -S node --no-warnings"), list(node22), filepath.Join(node22, "node"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := conformanceNode(context.Background(), tc.launcher, tc.path)
			if tc.wantErr == nil {
				if err != nil || got != tc.want {
					t.Errorf("conformanceNode = %q, %v; want %q", got, err, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("conformanceNode = %q; want a refusal", got)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("refusal %q lacks %q", err, w)
				}
			}
		})
	}
}
