package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// unitPath is the systemd unit that make dist ships.
const unitPath = "systemd/coordd.service"

// unitValues returns the values of key in section of a systemd unit file,
// in order (a key may repeat), with continuation lines joined.
func unitValues(unit, section, key string) []string {
	var out []string
	cur := ""
	lines := strings.Split(strings.ReplaceAll(unit, "\\\n", " "), "\n")
	for _, line := range lines {
		line = strings.TrimSpace(line)
		switch {
		case line == "", strings.HasPrefix(line, "#"), strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			cur = line[1 : len(line)-1]
		case cur == section:
			k, v, ok := strings.Cut(line, "=")
			if ok && strings.TrimSpace(k) == key {
				out = append(out, strings.TrimSpace(v))
			}
		}
	}
	return out
}

// TestSystemdUnit checks deploy/systemd/coordd.service: systemd's own
// parser accepts every line of it (systemd-analyze verify, which only warns
// about an unknown or misspelt directive, so any output fails the test);
// its sandbox rates "OK" in systemd-analyze security (exposure at most 1.5
// of 10); it starts /usr/local/bin/coordd on /etc/coordd/coordd.yaml after
// checking that file; and its stop timeout exceeds the drain the example
// configuration asks for. TestDist runs the unit's command lines with the
// release's binary on the example configuration.
func TestSystemdUnit(t *testing.T) {
	if testing.Short() {
		t.Skip("runs systemd-analyze (skipped under -short)")
	}
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatalf("systemd-analyze not found (Debian: apt-get install systemd, or run 'make deps'): %v", err)
	}
	b, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	unit := string(b)

	const bin, conf = "/usr/local/bin/coordd", "/etc/coordd/coordd.yaml"
	for key, want := range map[string]string{
		"ExecStartPre": bin + " --config " + conf + " --check-config",
		"ExecStart":    bin + " --config " + conf,
	} {
		if got := unitValues(unit, "Service", key); len(got) != 1 || got[0] != want {
			t.Errorf("%s = %q; want %q", key, got, want)
		}
	}
	for key, want := range map[string]string{
		"DynamicUser":             "yes",
		"NoNewPrivileges":         "yes",
		"ProtectSystem":           "strict",
		"ProtectHome":             "yes",
		"PrivateTmp":              "yes",
		"PrivateDevices":          "yes",
		"CapabilityBoundingSet":   "",
		"MemoryDenyWriteExecute":  "yes",
		"SystemCallArchitectures": "native",
		"KillSignal":              "SIGTERM",
		"Restart":                 "on-failure",
	} {
		if got := unitValues(unit, "Service", key); len(got) != 1 || got[0] != want {
			t.Errorf("%s = %q; want %q", key, got, want)
		}
	}

	// The stop timeout covers the drain: drain_delay and shutdown_grace
	// of the example configuration (their defaults where it sets none).
	var cfg struct {
		DrainDelay    string `json:"drain_delay"`
		ShutdownGrace string `json:"shutdown_grace"`
	}
	ex, err := os.ReadFile("coordd.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(ex, &cfg); err != nil {
		t.Fatalf("coordd.example.yaml: %v", err)
	}
	duration := func(what, s, def string) time.Duration {
		if s == "" {
			s = def
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("%s %q: %v", what, s, err)
		}
		return d
	}
	drain := duration("drain_delay", cfg.DrainDelay, "5s") + duration("shutdown_grace", cfg.ShutdownGrace, "10s")
	stops := unitValues(unit, "Service", "TimeoutStopSec")
	if len(stops) != 1 {
		t.Fatalf("TimeoutStopSec = %q; want one", stops)
	}
	if stop := duration("TimeoutStopSec", stops[0], ""); stop <= drain+time.Second {
		t.Errorf("TimeoutStopSec=%s; want above drain_delay + shutdown_grace (%v) with a margin: systemd kills at once after it", stops[0], drain)
	}

	// systemd-analyze verify wants the command to exist: a copy of the
	// unit runs this test's own binary instead.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	copyPath := filepath.Join(t.TempDir(), "coordd.service")
	if err := os.WriteFile(copyPath, []byte(strings.ReplaceAll(unit, bin, self)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), analyze, "verify", copyPath).CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Errorf("systemd-analyze verify: %v; want no complaint:\n%s", err, out)
	}
	out, err = exec.CommandContext(t.Context(), analyze, "security", "--offline=yes", "--threshold=15", copyPath).CombinedOutput()
	if err != nil {
		t.Errorf("systemd-analyze security --offline=yes --threshold=15 (exposure 1.5): %v\n%s", err, out)
	}
}
