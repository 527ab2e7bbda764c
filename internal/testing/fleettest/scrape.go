package fleettest

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Scrape is one scrape of an instance's metrics, by family name.
type Scrape map[string]*dto.MetricFamily

// Scrape fetches the instance's /metrics; it needs Options.Metrics.
func (in *Instance) Scrape(t testing.TB) Scrape {
	t.Helper()
	if in.MetricsURL == "" {
		t.Fatalf("fleettest: scrape: the instance was started without Options.Metrics")
	}
	resp, err := http.Get(in.MetricsURL)
	if err != nil {
		t.Fatalf("fleettest: scrape: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("fleettest: scrape: status %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("fleettest: scrape: %v", err)
	}
	return fams
}

// Value sums the samples of metric name whose labels include labels
// (name, value pairs): a counter's or gauge's value, a histogram's count.
// A metric absent from the scrape is 0.
func (s Scrape) Value(name string, labels ...string) float64 {
	f := s[name]
	if f == nil {
		return 0
	}
	var sum float64
	for _, m := range f.GetMetric() {
		if !hasLabels(m, labels) {
			continue
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		case m.Untyped != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum
}

// Count is the number of series of metric name whose labels include
// labels.
func (s Scrape) Count(name string, labels ...string) int {
	n := 0
	for _, m := range s[name].GetMetric() {
		if hasLabels(m, labels) {
			n++
		}
	}
	return n
}

func hasLabels(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool {
			return l.GetName() == labels[i] && l.GetValue() == labels[i+1]
		}) {
			return false
		}
	}
	return true
}

// Has reports whether the scrape exposes a series named name: a family,
// or a histogram's or summary's _bucket, _sum or _count.
func (s Scrape) Has(name string) bool {
	if s[name] != nil {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && base != "" {
			if f := s[base]; f != nil && (f.GetType() == dto.MetricType_HISTOGRAM || f.GetType() == dto.MetricType_SUMMARY) {
				return suffix != "_bucket" || f.GetType() == dto.MetricType_HISTOGRAM
			}
		}
	}
	return false
}
