package config

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// configurationDoc is the page that documents every key.
const configurationDoc = "../docs/configuration.md"

// docsEnv holds a value for every variable the documentation's examples
// name without a default.
var docsEnv = map[string]string{
	"SMS_TOKEN":              "t0ken",
	"PUSH_TOKEN":             "push-t0ken",
	"AMQP_PASSWORD":          "guest",
	"PGPASSWORD":             "pg",
	"API_TOKEN":              "t0ken",
	"TWILIO_ACCOUNT_SID":     "AC0000",
	"TWILIO_AUTH_TOKEN":      "tw-t0ken",
	"THROTTLE_CONSOLE_TOKEN": "console-t0ken-0123456789",
}

func docsLookup(k string) (string, bool) { v, ok := docsEnv[k]; return v, ok }

// docFiles returns README.md and every page of docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(pages, configurationDoc) {
		t.Fatalf("%s is missing (found %v)", configurationDoc, pages)
	}
	return append([]string{"../README.md"}, pages...)
}

// yamlBlocks returns every ```yaml block of the file with the line it
// starts on.
func yamlBlocks(t *testing.T, path string) (blocks []string, lines []int) {
	t.Helper()
	data, err := os.ReadFile(path)
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

// wholeDoc returns block as a whole configuration: a fragment, marked by a
// first line "# fragment", is merged into a minimal configuration (its
// source and sink, when given, replace the minimal ones).
func wholeDoc(t *testing.T, block string) string {
	if strings.HasPrefix(block, "# fragment") {
		return mergeFragment(t, minimal, block)
	}
	return block
}

// TestDocsExamples runs every YAML example of README.md and docs/*.md
// through Parse, which is the whole validation `throttle run` does before
// connecting anywhere (each library's own checks included), so that no
// documented example can be rejected by the binary (the push-webhook
// template once was).
func TestDocsExamples(t *testing.T) {
	for _, path := range docFiles(t) {
		blocks, lines := yamlBlocks(t, path)
		if path == configurationDoc && len(blocks) < 5 {
			t.Fatalf("%s has %d yaml blocks; the reference and the other sources and sinks alone are 5", path, len(blocks))
		}
		for i, block := range blocks {
			if _, err := Parse([]byte(wholeDoc(t, block)), docsLookup); err != nil {
				t.Errorf("%s line %d: the yaml example is rejected:\n%v", filepath.Base(path), lines[i], err)
			}
		}
	}
}

// TestDocsConfigReference checks the reference block's values, so that the
// documented keys and values cannot drift from what they mean.
func TestDocsConfigReference(t *testing.T) {
	data, err := os.ReadFile(configurationDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), "\n## Every key\n")
	if !ok {
		t.Fatalf("%s has no section \"Every key\"", configurationDoc)
	}
	_, rest, ok = strings.Cut(rest, "```yaml\n")
	if !ok {
		t.Fatal("the configuration reference has no yaml block")
	}
	block, _, _ := strings.Cut(rest, "```")
	cfg, err := Parse([]byte(block), docsLookup)
	if err != nil {
		t.Fatalf("the reference configuration does not parse:\n%v", err)
	}
	if cfg.Limit.Bucket != "sms-outbound" || cfg.Limit.Rate != 100 || cfg.Limit.Burst != 200 ||
		cfg.Source.Kafka == nil || cfg.Sink.HTTP == nil || cfg.Sink.HTTP.Headers["Authorization"] != "Bearer t0ken" {
		t.Fatalf("parsed %+v", cfg)
	}
}

// configKey is a key of the configuration: its dotted path ("[]" for a
// list item), and the struct type and YAML name of its field.
type configKey struct {
	path  string
	owner reflect.Type
	name  string
}

// configKeys lists every key of the struct type t (after pointers and
// slices) under path, by the YAML names the decoder uses (yamlFields). The
// keys of a map are data, not configuration keys, so a map is not entered.
func configKeys(t reflect.Type, path string, out []configKey) []configKey {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Slice:
		return configKeys(t.Elem(), path+"[]", out)
	case reflect.Struct:
		fields := yamlFields(t)
		names := make([]string, 0, len(fields))
		for name := range fields {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			p := join(path, name)
			out = append(out, configKey{path: p, owner: t, name: name})
			out = configKeys(fields[name].Type, p, out)
		}
	}
	return out
}

// documentedPaths returns the key paths that the YAML blocks of the page
// set (as the walker that checks a file meets them, list indexes written
// "[]"), and those the page names in backquotes, such as
// `source.kafka.max_in_flight`.
func documentedPaths(t *testing.T, path string) map[string]bool {
	t.Helper()
	seen := make(map[string]bool)
	blocks, lines := yamlBlocks(t, path)
	index := regexp.MustCompile(`\[\d+\]`)
	for i, block := range blocks {
		root, err := parseYAML([]byte(wholeDoc(t, block)))
		if err != nil || root == nil {
			t.Fatalf("%s line %d: %v", path, lines[i], err)
		}
		w := newWalker(docsLookup)
		w.walk(root, reflect.TypeFor[Config](), "")
		for p := range w.lines {
			seen[index.ReplaceAllString(p, "[]")] = true
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile("`([a-z_]+(?:\\.[a-z_]+|\\[\\])+)`").FindAllStringSubmatch(string(data), -1) {
		seen[m[1]] = true
	}
	return seen
}

// TestDocsEveryConfigKey checks that docs/configuration.md documents every
// key of the configuration: each appears in one of its YAML blocks, or is
// named there in backquotes by its dotted path. A key of a type used at
// several places (the tls keys of redis and of each source) counts once it
// is documented at one of them.
func TestDocsEveryConfigKey(t *testing.T) {
	keys := configKeys(reflect.TypeFor[Config](), "", nil)
	if len(keys) < 100 {
		t.Fatalf("found %d configuration keys; the walk of the structs is broken", len(keys))
	}
	seen := documentedPaths(t, configurationDoc)
	byField := make(map[configKey]bool) // owner and name, path left empty
	for _, k := range keys {
		if seen[k.path] {
			byField[configKey{owner: k.owner, name: k.name}] = true
		}
	}
	for _, k := range keys {
		if !byField[configKey{owner: k.owner, name: k.name}] {
			t.Errorf("%s is not documented in %s", k.path, filepath.Base(configurationDoc))
		}
	}
}

// TestDocsSayWhatBreaks checks the documentation's claims about what is
// rejected: an unquoted ${VAR} in a flow mapping, and burst: 0.
func TestDocsSayWhatBreaks(t *testing.T) {
	unquoted := strings.Replace(minimal, "stdout: {}", "http: {url: 'http://h/', headers: {Authorization: Bearer ${TOKEN}}}", 1)
	cfg, err := Parse([]byte(unquoted), func(string) (string, bool) { return "secret", true })
	if err == nil && cfg.Sink.HTTP.Headers["Authorization"] == "Bearer secret" {
		t.Error("an unquoted ${VAR} in a flow mapping works; docs/configuration.md says to quote it")
	}
	if _, err := Parse([]byte(strings.Replace(minimal, "rate: 10", "rate: 10\n  burst: 0", 1)), nil); err == nil {
		t.Error("burst: 0 is accepted; docs/configuration.md says it is an error")
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
