// Package version reports what a coordd binary was built from: a version
// stamped at build time, and the module and VCS facts the Go toolchain
// records (runtime/debug.ReadBuildInfo).
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Version is the release version, stamped by the build:
//
//	go build -ldflags "-X github.com/coordd/coordd/internal/version.Version=v1.2.3" ./cmd/coordd
//
// Empty in an unstamped build, which then reports the module's version
// ("(devel)" for a build from a checkout; the tag for `go install …@v1.2.3`).
var Version string

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
	v, module := stamped, "unknown"
	var facts []string
	if bi != nil {
		module = bi.Main.Path + " " + orDefault(bi.Main.Version, "(devel)")
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision", "vcs.time", "vcs.modified":
				facts = append(facts, strings.TrimPrefix(s.Key, "vcs.")+" "+s.Value)
			}
		}
		if v == "" {
			v = orDefault(bi.Main.Version, "(devel)")
		}
	}
	v = orDefault(v, "(devel)")
	facts = append([]string{"module " + module}, facts...)
	facts = append(facts, runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH)
	return fmt.Sprintf("%s %s (%s)", program, v, strings.Join(facts, ", "))
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
