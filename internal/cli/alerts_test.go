package cli

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/throttlehq/throttle/limiter"
)

// alertRule is the part of an alerting rule the tests read.
type alertRule struct {
	Alert       string
	Expr        string
	For         string
	Labels      map[string]string
	Annotations map[string]string
}

// exampleAlerts returns the rules of examples/prometheus/alerts.yml.
func exampleAlerts(t *testing.T) []alertRule {
	t.Helper()
	raw, err := os.ReadFile("../../examples/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Name  string
			Rules []alertRule
		}
	}
	if err := yaml.Unmarshal(raw, &file); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	var rules []alertRule
	for _, g := range file.Groups {
		rules = append(rules, g.Rules...)
	}
	if len(rules) == 0 {
		t.Fatal("alerts.yml holds no rules")
	}
	return rules
}

// TestExampleAlertsNameRealMetrics keeps examples/prometheus/alerts.yml in
// step with the metrics a replica serves.
func TestExampleAlertsNameRealMetrics(t *testing.T) {
	served := servedMetrics(t)
	name := regexp.MustCompile(`throttle_[a-z_]+`)
	for _, r := range exampleAlerts(t) {
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

// TestExampleAlertsQuantilesKeepLabels checks that every histogram_quantile
// in examples/prometheus/alerts.yml groups by le and by every label of the
// histogram, such as the priority class of throttle_limiter_wait_seconds:
// a quantile over the classes together would page for a low class that
// waits by design. A rule that compares its classes with thresholds by
// priority names one for every class, since a class without one would
// never alert, and says the class in its summary.
func TestExampleAlertsQuantilesKeepLabels(t *testing.T) {
	served := servedMetrics(t)
	quantile := regexp.MustCompile(`histogram_quantile\(`)
	grouped := regexp.MustCompile(`histogram_quantile\(\s*[0-9.]+\s*,\s*sum\s+by\s*\(([^)]*)\)\s*\(\s*rate\(\s*(throttle_[a-z_]+)_bucket\b`)
	for _, r := range exampleAlerts(t) {
		found := grouped.FindAllStringSubmatch(r.Expr, -1)
		if n := len(quantile.FindAllString(r.Expr, -1)); n != len(found) {
			t.Errorf("alert %s: %d histogram_quantile calls, %d of the form histogram_quantile(q, sum by (...) (rate(..._bucket[...]))) that this test reads",
				r.Alert, n, len(found))
		}
		for _, m := range found {
			by := map[string]bool{}
			for _, l := range strings.Split(m[1], ",") {
				by[strings.TrimSpace(l)] = true
			}
			labels, ok := served.labels(m[2])
			if !ok {
				t.Errorf("alert %s: no replica serves the histogram %s", r.Alert, m[2])
				continue
			}
			if !by["le"] {
				t.Errorf("alert %s: the quantile of %s groups by (%s), without le", r.Alert, m[2], m[1])
			}
			for l := range labels {
				if !by[l] {
					t.Errorf("alert %s: the quantile of %s groups by (%s), dropping its label %s", r.Alert, m[2], m[1], l)
				}
			}
		}
		if !strings.Contains(r.Expr, "on (priority)") {
			continue
		}
		for p := range limiter.NumPriorities {
			class := limiter.Priority(p).String()
			if !strings.Contains(r.Expr, `"priority", "`+class+`"`) {
				t.Errorf("alert %s compares by priority but sets no threshold for the class %s", r.Alert, class)
			}
		}
		if !strings.Contains(r.Annotations["summary"], "$labels.priority") {
			t.Errorf("alert %s compares by priority, but its summary %q does not name the class", r.Alert, r.Annotations["summary"])
		}
	}
}
