package config

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// readmeEnv holds a value for every variable the README's examples name
// without a default.
var readmeEnv = map[string]string{
	"SMS_TOKEN":     "t0ken",
	"PUSH_TOKEN":    "push-t0ken",
	"AMQP_PASSWORD": "guest",
	"PGPASSWORD":    "pg",
	"API_TOKEN":     "t0ken",
}

// readmeYAML returns every ```yaml block of README.md with the line it
// starts on.
func readmeYAML(t *testing.T) (blocks []string, lines []int) {
	t.Helper()
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?ms)^```yaml\n(.*?)^```")
	for _, m := range re.FindAllSubmatchIndex(data, -1) {
		blocks = append(blocks, string(data[m[2]:m[3]]))
		lines = append(lines, bytes.Count(data[:m[0]], []byte("\n"))+1)
	}
	return blocks, lines
}

// TestREADMEExamples runs every YAML example of README.md through Parse,
// which is the whole validation `throttle run` does before connecting
// anywhere (each library's own checks included), so that no documented
// example can be rejected by the binary (issue 11 item 1: the push-webhook
// template was). A block is a whole configuration, or a fragment marked by
// a first line "# fragment", which is merged into a minimal configuration
// (its source and sink, when given, replace the minimal ones).
func TestREADMEExamples(t *testing.T) {
	blocks, lines := readmeYAML(t)
	if len(blocks) < 5 {
		t.Fatalf("README.md has %d yaml blocks; the configuration reference alone has 5", len(blocks))
	}
	lookup := func(k string) (string, bool) { v, ok := readmeEnv[k]; return v, ok }
	for i, block := range blocks {
		doc := block
		if strings.HasPrefix(block, "# fragment") {
			doc = mergeFragment(t, minimal, block)
		}
		if _, err := Parse([]byte(doc), lookup); err != nil {
			t.Errorf("README.md line %d: the yaml example is rejected:\n%v", lines[i], err)
		}
	}
}

// TestREADMEConfigReference checks the reference block's values, so that
// the documented keys and values cannot drift from what they mean.
func TestREADMEConfigReference(t *testing.T) {
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), "### Configuration reference")
	if !ok {
		t.Fatal("README.md has no configuration reference section")
	}
	_, rest, ok = strings.Cut(rest, "```yaml\n")
	if !ok {
		t.Fatal("the configuration reference has no yaml block")
	}
	block, _, _ := strings.Cut(rest, "```")
	cfg, err := Parse([]byte(block), func(k string) (string, bool) { v, ok := readmeEnv[k]; return v, ok })
	if err != nil {
		t.Fatalf("the README's configuration does not parse:\n%v", err)
	}
	if cfg.Limit.Bucket != "sms-outbound" || cfg.Limit.Rate != 100 || cfg.Limit.Burst != 200 ||
		cfg.Source.Kafka == nil || cfg.Sink.HTTP == nil || cfg.Sink.HTTP.Headers["Authorization"] != "Bearer t0ken" {
		t.Fatalf("parsed %+v", cfg)
	}
}

// TestREADMESaysWhatBreaks checks the README's claims about what is
// rejected: an unquoted ${VAR} in a flow mapping, and burst: 0.
func TestREADMESaysWhatBreaks(t *testing.T) {
	unquoted := strings.Replace(minimal, "stdout: {}", "http: {url: 'http://h/', headers: {Authorization: Bearer ${TOKEN}}}", 1)
	cfg, err := Parse([]byte(unquoted), func(string) (string, bool) { return "secret", true })
	if err == nil && cfg.Sink.HTTP.Headers["Authorization"] == "Bearer secret" {
		t.Error("an unquoted ${VAR} in a flow mapping works; the README says to quote it")
	}
	if _, err := Parse([]byte(strings.Replace(minimal, "rate: 10", "rate: 10\n  burst: 0", 1)), nil); err == nil {
		t.Error("burst: 0 is accepted; the README says it is an error")
	}
}

// mergeFragment merges the YAML fragment into base: mappings are merged
// key by key, anything else (and the source and sink choices) replaced.
func mergeFragment(t *testing.T, base, fragment string) string {
	t.Helper()
	var b, f yaml.Node
	if err := yaml.Unmarshal([]byte(base), &b); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(fragment), &f); err != nil {
		t.Fatalf("fragment: %v\n%s", err, fragment)
	}
	mergeNode(b.Content[0], f.Content[0], true)
	out, err := yaml.Marshal(&b)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func mergeNode(dst, src *yaml.Node, top bool) {
	for i := 0; i+1 < len(src.Content); i += 2 {
		k, v := src.Content[i], src.Content[i+1]
		found := false
		for j := 0; j+1 < len(dst.Content); j += 2 {
			if dst.Content[j].Value != k.Value {
				continue
			}
			found = true
			choice := top && (k.Value == "source" || k.Value == "sink")
			if !choice && dst.Content[j+1].Kind == yaml.MappingNode && v.Kind == yaml.MappingNode {
				mergeNode(dst.Content[j+1], v, false)
			} else {
				dst.Content[j+1] = v
			}
		}
		if !found {
			dst.Content = append(dst.Content, k, v)
		}
	}
}

func TestMergeFragment(t *testing.T) {
	got := mergeFragment(t, minimal, "# fragment\nlimit: {rate: 5/h, burst: 5}\nsink: {http: {url: 'http://h/'}}\n")
	cfg := mustParse(t, got, nil)
	if cfg.Limit.Bucket != "sms" || cfg.Limit.Burst != 5 || cfg.Sink.HTTP == nil || cfg.Sink.Stdout != nil {
		t.Errorf("merged:\n%s", got)
	}
}
