// Package charttest renders the Helm chart of deploy/helm/throttle with
// the Helm Go module and checks every manifest against the Kubernetes API
// types by strict decoding, offline. It is a module of its own so that the
// main module's go.mod stays free of Helm and Kubernetes.
package charttest

import (
	"bytes"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

const chartDir = "../throttle"

// full turns every optional part on.
var full = map[string]any{
	"serviceMonitor": map[string]any{"enabled": true},
	"prometheusRule": map[string]any{"enabled": true},
	"keda":           map[string]any{"enabled": true},
	"secretEnv":      map[string]any{"REDIS_PASSWORD": "r3dis", "AMQP_PASSWORD": "amqp"},
}

func render(t *testing.T, vals map[string]any) map[string]string {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: "sms", Namespace: "sms", IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	out, err := engine.Render(ch, rv)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// docs splits the rendered files into their YAML documents, by kind.
func docs(t *testing.T, files map[string]string) map[string][]byte {
	t.Helper()
	byKind := map[string][]byte{}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if !strings.HasSuffix(n, ".yaml") {
			continue
		}
		for _, d := range strings.Split(files[n], "\n---") {
			if strings.TrimSpace(d) == "" {
				continue
			}
			var meta struct{ Kind string }
			if err := yaml.Unmarshal([]byte(d), &meta); err != nil {
				t.Fatalf("%s: %v\n%s", n, err, d)
			}
			if meta.Kind == "" {
				continue
			}
			if _, dup := byKind[meta.Kind]; dup {
				t.Fatalf("two %s", meta.Kind)
			}
			byKind[meta.Kind] = []byte(d)
		}
	}
	return byKind
}

// strict decodes a manifest into v, failing on unknown fields.
func strict(t *testing.T, kind string, d []byte, v any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(d, v); err != nil {
		t.Fatalf("%s does not match the Kubernetes API: %v\n%s", kind, err, d)
	}
}

func check(t *testing.T, vals map[string]any, want []string) map[string][]byte {
	byKind := docs(t, render(t, vals))
	var kinds []string
	for k := range byKind {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	if strings.Join(kinds, " ") != strings.Join(want, " ") {
		t.Fatalf("kinds %v, want %v", kinds, want)
	}
	var dep appsv1.Deployment
	strict(t, "Deployment", byKind["Deployment"], &dep)
	c := dep.Spec.Template.Spec.Containers[0]
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/livez" || c.StartupProbe == nil || c.StartupProbe.HTTPGet.Path != "/livez" ||
		c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("probes: %+v %+v %+v", c.LivenessProbe, c.StartupProbe, c.ReadinessProbe)
	}
	var cm corev1.ConfigMap
	strict(t, "ConfigMap", byKind["ConfigMap"], &cm)
	if cfg := cm.Data["throttle.yaml"]; !strings.Contains(cfg, "${REDIS_PASSWORD}") || strings.Contains(cfg, "r3dis") {
		t.Errorf("the ConfigMap must name secrets as ${VAR}, never hold them:\n%s", cfg)
	}
	var svc corev1.Service
	strict(t, "Service", byKind["Service"], &svc)
	var pdb policyv1.PodDisruptionBudget
	strict(t, "PodDisruptionBudget", byKind["PodDisruptionBudget"], &pdb)
	var sec corev1.Secret
	strict(t, "Secret", byKind["Secret"], &sec)
	return byKind
}

func TestChartDefaults(t *testing.T) {
	check(t, nil, []string{"ConfigMap", "Deployment", "PodDisruptionBudget", "Secret", "Service"})
}

func TestChartFull(t *testing.T) {
	byKind := check(t, full, []string{"ConfigMap", "Deployment", "PodDisruptionBudget", "PrometheusRule", "ScaledObject", "Secret", "Service", "ServiceMonitor"})
	// The CRDs' objects, checked by shape: no Kubernetes Go type holds them.
	var rule struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   map[string]any
		Spec       struct {
			Groups []struct {
				Name  string
				Rules []struct {
					Alert, Expr, For string
					Labels           map[string]string
					Annotations      map[string]string
				}
			}
		}
	}
	strict(t, "PrometheusRule", byKind["PrometheusRule"], &rule)
	alerts, err := os.ReadFile(filepath.Join("..", "..", "..", "examples", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	copied, err := os.ReadFile(filepath.Join(chartDir, "files", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(alerts, copied) {
		t.Errorf("deploy/helm/throttle/files/alerts.yml differs from examples/prometheus/alerts.yml: copy it again")
	}
	if len(rule.Spec.Groups) == 0 || len(rule.Spec.Groups[0].Rules) < 5 {
		t.Errorf("PrometheusRule: %d groups", len(rule.Spec.Groups))
	}
	var so struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   map[string]any
		Spec       struct {
			ScaleTargetRef  struct{ Name string } `json:"scaleTargetRef"`
			MinReplicaCount int                   `json:"minReplicaCount"`
			MaxReplicaCount int                   `json:"maxReplicaCount"`
			Triggers        []struct {
				Type       string
				MetricType string `json:"metricType"`
				Metadata   map[string]string
			}
		}
	}
	strict(t, "ScaledObject", byKind["ScaledObject"], &so)
	if q := so.Spec.Triggers[0].Metadata["query"]; !strings.Contains(q, "throttle_useful_replicas") || !strings.Contains(q, "throttle_source_backlog") {
		t.Errorf("ScaledObject query: %s", q)
	}
	var dep appsv1.Deployment
	strict(t, "Deployment", byKind["Deployment"], &dep)
	if dep.Spec.Replicas != nil || so.Spec.ScaleTargetRef.Name != dep.Name {
		t.Errorf("with KEDA the Deployment leaves replicas to it: replicas %v, target %q", dep.Spec.Replicas, so.Spec.ScaleTargetRef.Name)
	}
}
