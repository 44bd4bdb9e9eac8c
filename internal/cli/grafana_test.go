package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/kafka"
	"github.com/throttlehq/throttle/limiter"
)

// grafanaDir is the example Grafana setup, relative to this package.
const grafanaDir = "../../examples/grafana"

// grafanaPanel is the part of a dashboard panel the test reads; rows nest
// panels.
type grafanaPanel struct {
	Title      string `json:"title"`
	Type       string `json:"type"`
	Datasource struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"`
}

// TestGrafanaDashboardNamesRealMetrics keeps the example dashboard in step
// with the metrics a replica serves, and with the datasource that the
// compose stack provisions.
func TestGrafanaDashboardNamesRealMetrics(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(grafanaDir, "dashboards", "throttle.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID    string         `json:"uid"`
		Panels []grafanaPanel `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("throttle.json: %v", err)
	}
	uid := provisionedDatasourceUID(t)
	served := servedMetrics(t)
	name := regexp.MustCompile(`throttle_[a-z_]+`)
	var titles []string
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			titles = append(titles, p.Title)
			if p.Datasource.UID != uid {
				t.Errorf("panel %q uses datasource %q, want the provisioned %q", p.Title, p.Datasource.UID, uid)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, q := range p.Targets {
				names := name.FindAllString(q.Expr, -1)
				if len(names) == 0 {
					t.Errorf("panel %q: query %q names no throttle metric", p.Title, q.Expr)
				}
				for _, m := range names {
					if !served.has(m) {
						t.Errorf("panel %q uses %s, which no replica serves", p.Title, m)
					}
				}
			}
		}
	}
	walk(dash.Panels)
	// What the dashboard must show.
	for _, want := range []string{"Delivered rate against the limit", "Wait for tokens", "Tokens in the bucket",
		"Limiter mode per replica", "Backlog", "Time to drain the backlog at the limit", "Dead letters", "Redis errors"} {
		if !slices.Contains(titles, want) {
			t.Errorf("the dashboard has no panel %q; panels: %q", want, titles)
		}
	}
}

// provisionedDatasourceUID returns the uid of the Prometheus datasource
// that Grafana's provisioning defines.
func provisionedDatasourceUID(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(grafanaDir, "provisioning", "datasources", "prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Datasources []struct {
			UID  string `yaml:"uid"`
			Type string `yaml:"type"`
			URL  string `yaml:"url"`
		} `yaml:"datasources"`
	}
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatalf("datasources: %v", err)
	}
	if len(f.Datasources) != 1 || f.Datasources[0].Type != "prometheus" || f.Datasources[0].UID == "" {
		t.Fatalf("datasources %+v: want one prometheus datasource with a uid", f.Datasources)
	}
	return f.Datasources[0].UID
}

// TestGrafanaComposeWiring checks that the compose stack mounts the
// provisioning and the dashboards where Grafana reads them, and that its
// Prometheus scrapes every throttle replica.
func TestGrafanaComposeWiring(t *testing.T) {
	raw, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Services map[string]struct {
			Build *struct {
				Target string `yaml:"target"`
			} `yaml:"build"`
			Volumes []string `yaml:"volumes"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	mounts := func(service string) map[string]string {
		m := map[string]string{}
		for _, v := range c.Services[service].Volumes {
			parts := strings.Split(v, ":")
			if len(parts) >= 2 {
				m[parts[1]] = parts[0]
			}
		}
		return m
	}
	g := mounts("grafana")
	var prov struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	provRaw, err := os.ReadFile(filepath.Join(grafanaDir, "provisioning", "dashboards", "throttle.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(provRaw, &prov); err != nil || len(prov.Providers) != 1 {
		t.Fatalf("dashboard provider: %v, %+v", err, prov)
	}
	for inside, want := range map[string]string{
		"/etc/grafana/provisioning":    "./examples/grafana/provisioning",
		prov.Providers[0].Options.Path: "./examples/grafana/dashboards",
	} {
		if g[inside] != want {
			t.Errorf("grafana mounts %q at %s, want %q", g[inside], inside, want)
		}
	}
	p := mounts("prometheus")
	if p["/etc/prometheus/prometheus.yml"] != "./examples/grafana/prometheus.yml" {
		t.Errorf("prometheus mounts %q as its config, want ./examples/grafana/prometheus.yml", p["/etc/prometheus/prometheus.yml"])
	}
	var prom struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	promRaw, err := os.ReadFile(filepath.Join(grafanaDir, "prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(promRaw, &prom); err != nil {
		t.Fatal(err)
	}
	var targets []string
	for _, sc := range prom.ScrapeConfigs {
		if sc.JobName == "throttle" { // the job the alerts name
			for _, s := range sc.StaticConfigs {
				targets = append(targets, s.Targets...)
			}
		}
	}
	for name, s := range c.Services {
		if s.Build != nil && s.Build.Target == "throttle" && !slices.Contains(targets, name+":9464") {
			t.Errorf("prometheus does not scrape replica %s (job throttle targets %q)", name, targets)
		}
	}
}

// metricSet is the metric families a replica serves, each with the names
// of its labels.
type metricSet map[string]map[string]bool

// has reports whether name is served, a histogram's _bucket, _sum and
// _count series included.
func (s metricSet) has(name string) bool {
	_, ok := s.labels(name)
	return ok
}

// labels returns the label names of the family that serves name (le not
// included), and whether one does.
func (s metricSet) labels(name string) (map[string]bool, bool) {
	for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if l, ok := s[base]; ok {
				return l, true
			}
		}
	}
	return nil, false
}

// servedMetrics returns every metric family a Kafka replica with an extra
// layer serves, with a series in each.
func servedMetrics(t *testing.T) metricSet {
	t.Helper()
	m := newMetrics("kafka")
	m.setBacklog(consumer.Backlog{}) // a series appears with the first reading
	m.registerKafkaReader(func() kafka.ReaderStats { return kafka.ReaderStats{} })
	// The layers' metrics exist with limit.extra, their series with the
	// first event.
	o := layerObserver(m, m.limiterObserver(), []limiter.Layer{{Name: "per-recipient"}}, false, false)
	o.LimitExceeded("per-recipient", limiter.ActionDelay)
	o.LayerWaited("", 0)
	newBudgetGauges(m.reg, []limiter.Layer{{Name: "daily-spend", Budget: 1}}).spent.WithLabelValues("daily-spend").Set(0)
	families, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	served := metricSet{}
	for _, f := range families {
		labels := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = true
			}
		}
		served[f.GetName()] = labels
	}
	return served
}
