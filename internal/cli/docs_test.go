package cli

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// TestDocsNameRealMetrics checks the metrics the documentation names
// against what a replica serves: docs/operations.md lists every metric
// family, and no page of docs/ nor the README names one that does not
// exist (a renamed metric leaves no stale name behind).
func TestDocsNameRealMetrics(t *testing.T) {
	served := servedMetrics(t)
	// Some families exist only with a feature on (adaptive rate, delay
	// layers, presets): take every name this package registers too.
	sources, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	registered := regexp.MustCompile(`"(throttle_[a-z_]+)"`)
	for _, src := range sources {
		if strings.HasSuffix(src, "_test.go") {
			continue
		}
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range registered.FindAllStringSubmatch(string(data), -1) {
			if !served.has(m[1]) {
				served[m[1]] = map[string]bool{}
			}
		}
	}
	pages, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, "../../README.md")
	name := regexp.MustCompile(`\bthrottle_[a-z_]+[a-z]\b`)
	var operations string
	for _, p := range pages {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(p) == "operations.md" {
			operations = string(data)
		}
		for _, m := range name.FindAllString(string(data), -1) {
			if !served.has(m) {
				t.Errorf("%s names %s, which no replica serves", filepath.Base(p), m)
			}
		}
	}
	if operations == "" {
		t.Fatal("docs/operations.md is missing or empty")
	}
	var families []string
	for f := range served {
		if strings.HasPrefix(f, "throttle_") { // not the Go runtime's and process's
			families = append(families, f)
		}
	}
	sort.Strings(families)
	for _, f := range families {
		if !strings.Contains(operations, "`"+f+"`") && !strings.Contains(operations, "`"+f+"{") {
			t.Errorf("docs/operations.md does not list the metric %s", f)
		}
	}
}
