package cli

import (
	"os"
	"regexp"
	"testing"

	"go.yaml.in/yaml/v3"
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
	served := servedMetrics(t)
	name := regexp.MustCompile(`throttle_[a-z_]+`)
	rules := 0
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			rules++
			if r.Alert == "" || r.Expr == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("rule %+v: want alert, expr, labels.severity and annotations.summary", r)
			}
			for _, m := range name.FindAllString(r.Expr, -1) {
				if !served.has(m) {
					t.Errorf("alert %s uses %s, which no replica serves", r.Alert, m)
				}
			}
		}
	}
	if rules == 0 {
		t.Fatal("alerts.yml holds no rules")
	}
}
