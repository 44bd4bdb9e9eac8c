package cli

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/throttlehq/throttle/consumer/kafka"
)

// TestExampleAlertsNameRealMetrics keeps examples/prometheus/alerts.yml in
// step with the metrics a replica serves.
func TestExampleAlertsNameRealMetrics(t *testing.T) {
	raw, err := os.ReadFile("../../examples/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert       string
				Expr        string
				For         string
				Labels      map[string]string
				Annotations map[string]string
			}
		}
	}
	if err := yaml.Unmarshal(raw, &file); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	served := map[string]bool{}
	m := newMetrics("kafka")
	m.setBacklog(0) // a series appears with the first reading
	m.registerKafkaReader(func() kafka.ReaderStats { return kafka.ReaderStats{} })
	families, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		served[f.GetName()] = true
	}
	name := regexp.MustCompile(`throttle_[a-z_]+`)
	rules := 0
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			rules++
			if r.Alert == "" || r.Expr == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("rule %+v: want alert, expr, labels.severity and annotations.summary", r)
			}
			for _, m := range name.FindAllString(r.Expr, -1) {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")
				if !served[m] && !served[base] {
					t.Errorf("alert %s uses %s, which no replica serves", r.Alert, m)
				}
			}
		}
	}
	if rules == 0 {
		t.Fatal("alerts.yml holds no rules")
	}
}
