package deploy

import (
	"os/exec"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// promtool returns the path of Prometheus's promtool, failing the test
// with how to install it if it is missing.
func promtool(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("runs promtool: not run under -short")
	}
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found on PATH: the alert rules are checked with it; install it with `sudo apt-get install -y --no-install-recommends prometheus` (Debian/Ubuntu), or run `make deps`, which installs it")
	}
	return p
}

// TestAlertRules runs `promtool check rules` on prometheus/alerts.yml
// (syntax, PromQL, templates) and `promtool test rules` on its unit tests,
// prometheus/alerts_test.yml: each alert fires on the series that should
// fire it, and not on the others (a burst of callers that cancel does not
// fire CoorddErrorRatio).
func TestAlertRules(t *testing.T) {
	p := promtool(t)
	for _, args := range [][]string{
		{"check", "rules", "alerts.yml"},
		{"test", "rules", "alerts_test.yml"},
	} {
		cmd := exec.Command(p, args...)
		cmd.Dir = "prometheus"
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
			continue
		}
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
	}
}

// TestAlertRulesTested: each of the alerts below is tested in
// alerts_test.yml both firing and not firing.
func TestAlertRulesTested(t *testing.T) {
	var f struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, "prometheus/alerts_test.yml")), &f); err != nil {
		t.Fatalf("alerts_test.yml: %v", err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range f.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	for _, alert := range []string{"CoorddInstanceDown", "CoorddErrorRatio", "CoorddHighLatency", "CoorddTLSCertExpiringSoon"} {
		if !fires[alert] || !quiet[alert] {
			t.Errorf("alerts_test.yml: %s: tested firing %v, not firing %v; want both", alert, fires[alert], quiet[alert])
		}
	}
}
