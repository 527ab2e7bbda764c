package version

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestFormat(t *testing.T) {
	checkout := &debug.BuildInfo{
		Main: debug.Module{Path: "github.com/coordd/coordd", Version: "(devel)"},
		Settings: []debug.BuildSetting{
			{Key: "-trimpath", Value: "true"},
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "3f2c0e9d"},
			{Key: "vcs.time", Value: "2026-01-02T03:04:05Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	installed := &debug.BuildInfo{Main: debug.Module{Path: "github.com/coordd/coordd", Version: "v1.4.0"}}
	for _, tc := range []struct {
		name, stamped string
		bi            *debug.BuildInfo
		want          []string
		not           []string
	}{
		{"stamped checkout", "v1.2.3", checkout,
			[]string{"coordd v1.2.3 (", "module github.com/coordd/coordd (devel)", "revision 3f2c0e9d", "time 2026-01-02T03:04:05Z", "modified true"},
			[]string{"trimpath"}},
		{"unstamped checkout", "", checkout, []string{"coordd " + Release() + " (", "module github.com/coordd/coordd (devel)", "revision 3f2c0e9d"}, nil},
		{"unstamped pseudo-version", "", &debug.BuildInfo{Main: debug.Module{Path: "github.com/coordd/coordd", Version: "v0.0.0-20260102030405-3f2c0e9d0000+dirty"}},
			[]string{"coordd " + Release() + " (module github.com/coordd/coordd v0.0.0-"}, nil},
		{"go install @tag", "", installed, []string{"coordd v1.4.0 (module github.com/coordd/coordd v1.4.0, go"}, []string{"revision"}},
		{"no build info", "", nil, []string{"coordd " + Release() + " (module unknown, go"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := format("coordd", tc.stamped, tc.bi)
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("got %q; want it to contain %q", got, w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(got, n) {
					t.Errorf("got %q; want no %q", got, n)
				}
			}
		})
	}
}

func TestString(t *testing.T) {
	if got := String("coordd"); !strings.HasPrefix(got, "coordd ") || !strings.Contains(got, "module github.com/coordd/coordd") {
		t.Errorf("String = %q; want the program and this module", got)
	}
}

func TestRelease(t *testing.T) {
	if r := Release(); len(r) < len("v0.0.0") || strings.ContainsAny(r, " \n") || !isTag(r) {
		t.Errorf("Release() = %q; want v and the VERSION file's one line, a release tag such as v0.1.0", r)
	}
}
