// Package version reports what a coordd binary was built from: a version
// stamped at build time, and the module and VCS facts the Go toolchain
// records (runtime/debug.ReadBuildInfo).
package version

import (
	_ "embed"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// release is the version the source is at, from the one file that says it
// (internal/version/VERSION): what an unstamped build reports, and what
// the TypeScript and Python packages' manifests must say (cmd/mdn-mcp's
// TestOneVersion).
//
//go:embed VERSION
var release string

// Release is "v" and the VERSION file's line: v0.1.0.
func Release() string { return "v" + strings.TrimSpace(release) }

// Version is the release version, stamped by the build:
//
//	go build -ldflags "-X github.com/coordd/coordd/internal/version.Version=v1.2.3" ./cmd/coordd
//
// Empty in an unstamped build, which then reports the module's version
// when it is a release tag (`go install …@v1.2.3`), else Release (a build
// from a checkout: its revision and modified facts say which).
var Version string

// Current is the version a binary reports, in --version and to MCP
// clients alike: the stamped one, a tagged module's, else Release.
func Current() string { return current(Version, readBuildInfo()) }

func current(stamped string, bi *debug.BuildInfo) string {
	if stamped != "" {
		return stamped
	}
	if bi != nil && isTag(bi.Main.Version) {
		return bi.Main.Version
	}
	return Release()
}

// isTag reports whether v is a release tag: not "(devel)", empty, a
// pseudo-version (v0.0.0-20260102030405-3f2c0e9d) or a +dirty build.
func isTag(v string) bool {
	return strings.HasPrefix(v, "v") && !strings.Contains(v, "+") && strings.Count(v, "-") < 2
}

// String is the line that program's --version prints:
//
//	coordd v1.2.3 (module github.com/coordd/coordd (devel), revision 3f2c…, time 2026-01-02T03:04:05Z, modified false, go1.26.8 linux/amd64)
//
// The revision, time and modified facts appear when the toolchain stamped
// them (go build in a VCS checkout; not go test, nor -buildvcs=false).
func String(program string) string {
	return format(program, Version, readBuildInfo())
}

// readBuildInfo is debug.ReadBuildInfo, nil when the binary has none.
func readBuildInfo() *debug.BuildInfo {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return nil
	}
	return bi
}

func format(program, stamped string, bi *debug.BuildInfo) string {
	module := "unknown"
	var facts []string
	if bi != nil {
		module = bi.Main.Path + " " + orDefault(bi.Main.Version, "(devel)")
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision", "vcs.time", "vcs.modified":
				facts = append(facts, strings.TrimPrefix(s.Key, "vcs.")+" "+s.Value)
			}
		}
	}
	facts = append([]string{"module " + module}, facts...)
	facts = append(facts, runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH)
	return fmt.Sprintf("%s %s (%s)", program, current(stamped, bi), strings.Join(facts, ", "))
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
