package integration

import (
	"bufio"
	"bytes"
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/throttlehq/throttle/config"
)

// The packaging checks: docker-compose.yml, the Dockerfile and the Makefile
// hold together, without Docker. Where the docker CLI has its compose
// plugin, `docker compose config` validates the compose file as well.

// suiteRepo is the repository root, relative to this package.
const suiteRepo = ".."

// suiteCompose is the part of a compose file that the checks read.
type suiteCompose struct {
	Services map[string]suiteService `yaml:"services"`
}

type suiteService struct {
	Image       string            `yaml:"image"`
	Build       *suiteBuild       `yaml:"build"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Ports       []string          `yaml:"ports"`
	Volumes     []string          `yaml:"volumes"`
	DependsOn   map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
	Healthcheck *struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
	Restart string `yaml:"restart"`
}

type suiteBuild struct {
	Context string `yaml:"context"`
	Target  string `yaml:"target"`
}

func suiteLoadCompose(t *testing.T) suiteCompose {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(suiteRepo, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var c suiteCompose
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return c
}

// TestComposeConfig validates docker-compose.yml with `docker compose
// config` when the compose plugin is installed.
func TestComposeConfig(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "docker", "compose", "version").CombinedOutput(); err != nil {
		t.Skipf("docker compose is not installed (%v: %s); TestComposeFile checks the file without it", err, bytes.TrimSpace(out))
	}
	cmd := exec.CommandContext(ctx, "docker", "compose", "-f", "docker-compose.yml", "config", "--quiet")
	cmd.Dir = suiteRepo
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("docker compose config: %v\n%s", err, out)
	}
}

// TestComposeFile checks the services of the full stack, their start order,
// and that the three throttle replicas share one bucket.
func TestComposeFile(t *testing.T) {
	c := suiteLoadCompose(t)
	images := map[string]string{
		"redis":    "redis:7",
		"kafka":    "apache/kafka:",
		"rabbitmq": "rabbitmq:3-management",
		"postgres": "postgres:16",
	}
	for name, prefix := range images {
		s, ok := c.Services[name]
		if !ok {
			t.Errorf("service %s is missing", name)
			continue
		}
		if !strings.HasPrefix(s.Image, prefix) {
			t.Errorf("service %s runs image %q, want %s…", name, s.Image, prefix)
		}
	}
	if kafka, ok := c.Services["kafka"]; ok {
		if roles := kafka.Environment["KAFKA_PROCESS_ROLES"]; roles != "broker,controller" {
			t.Errorf("kafka: KAFKA_PROCESS_ROLES = %q, want broker,controller (a single KRaft node)", roles)
		}
		if !strings.Contains(kafka.Environment["KAFKA_ADVERTISED_LISTENERS"], "://kafka:9092") {
			t.Errorf("kafka: KAFKA_ADVERTISED_LISTENERS = %q, want a listener kafka:9092 for the other containers",
				kafka.Environment["KAFKA_ADVERTISED_LISTENERS"])
		}
	}
	for name, target := range map[string]string{"mocksink": "mocksink", "producer": "producer"} {
		s, ok := c.Services[name]
		switch {
		case !ok:
			t.Errorf("service %s is missing", name)
		case s.Build == nil || s.Build.Target != target:
			t.Errorf("service %s: want it built from the Dockerfile's target %s", name, target)
		}
	}
	if p := c.Services["producer"]; p.DependsOn["kafka"].Condition != "service_healthy" || p.Restart != "no" {
		t.Errorf("producer: want a one-shot (restart \"no\") that waits for a healthy kafka, got restart %q, depends_on %v", p.Restart, p.DependsOn)
	}

	for name, s := range c.Services {
		if name != "producer" && (s.Healthcheck == nil || len(s.Healthcheck.Test) == 0) {
			t.Errorf("service %s has no healthcheck", name)
		}
		for dep, cond := range s.DependsOn {
			d, ok := c.Services[dep]
			switch {
			case !ok:
				t.Errorf("service %s depends on %s, which does not exist", name, dep)
			case cond.Condition == "":
				t.Errorf("service %s depends on %s without a condition: it would start before %s is ready", name, dep, dep)
			case cond.Condition == "service_healthy" && d.Healthcheck == nil:
				t.Errorf("service %s waits for %s to be healthy, but %s has no healthcheck", name, dep, dep)
			}
		}
	}
	suiteCheckReplicas(t, c)
}

// suiteCheckReplicas checks the throttle replicas: three of them, on one
// bucket, each with its metrics port on the host's loopback address.
func suiteCheckReplicas(t *testing.T, c suiteCompose) {
	t.Helper()
	var names []string
	for name, s := range c.Services {
		if s.Build != nil && s.Build.Target == "throttle" {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	if len(names) != 3 {
		t.Fatalf("throttle replicas %v, want 3", names)
	}
	buckets := map[string][]string{}
	var hostPorts []string
	for _, name := range names {
		s := c.Services[name]
		if len(s.Command) != 3 || s.Command[0] != "run" || s.Command[1] != "--config" {
			t.Errorf("%s: command %q, want [run --config FILE]", name, s.Command)
			continue
		}
		cfg := suiteReplicaConfig(t, name, s)
		if cfg == nil {
			continue
		}
		buckets[cfg.Limit.Bucket] = append(buckets[cfg.Limit.Bucket], name)
		host, port, err := net.SplitHostPort(cfg.Metrics.Listen)
		if err != nil || host != "0.0.0.0" {
			t.Errorf("%s: metrics.listen %q, want 0.0.0.0:PORT so the mapped port reaches it", name, cfg.Metrics.Listen)
		}
		if k := cfg.Source.Kafka; k == nil || !slices.Contains(k.Brokers, "kafka:9092") {
			t.Errorf("%s: want a Kafka source on kafka:9092", name)
		}
		if h := cfg.Sink.HTTP; h == nil || !strings.Contains(h.URL, "//mocksink:") {
			t.Errorf("%s: want an HTTP sink at the mocksink service", name)
		}
		if len(s.Ports) != 1 || !strings.HasPrefix(s.Ports[0], "127.0.0.1:") || !strings.HasSuffix(s.Ports[0], ":"+port) {
			t.Errorf("%s: ports %q, want one 127.0.0.1:HOSTPORT:%s", name, s.Ports, port)
		} else {
			hostPorts = append(hostPorts, strings.Split(s.Ports[0], ":")[1])
		}
		if s.Healthcheck == nil || !slices.Contains(s.Healthcheck.Test, "healthcheck") {
			t.Errorf("%s: want the healthcheck `/throttle healthcheck`", name)
		}
		for dep, cond := range map[string]string{"redis": "service_healthy", "kafka": "service_healthy", "mocksink": "service_healthy", "producer": "service_completed_successfully"} {
			if got := s.DependsOn[dep].Condition; got != cond {
				t.Errorf("%s: depends on %s with condition %q, want %s", name, dep, got, cond)
			}
		}
	}
	if len(buckets) != 1 {
		t.Errorf("the replicas use buckets %v, want one shared bucket", buckets)
	}
	slices.Sort(hostPorts)
	if want := []string{"9464", "9465", "9466"}; !slices.Equal(hostPorts, want) {
		t.Errorf("metrics host ports %v, want %v", hostPorts, want)
	}
}

// suiteComposeDefault expands ${NAME:-default} as compose does with NAME
// unset.
var suiteComposeDefault = regexp.MustCompile(`\$\{[A-Z_]+:-([^}]*)\}`)

// suiteReplicaConfig loads the config file that a replica's command names,
// through the replica's volume mounts, as config.Load would in the
// container.
func suiteReplicaConfig(t *testing.T, name string, s suiteService) *config.Config {
	t.Helper()
	inContainer := suiteComposeDefault.ReplaceAllString(s.Command[2], "$1")
	var hostPath string
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 {
			continue
		}
		if rel, err := filepath.Rel(parts[1], inContainer); err == nil && !strings.HasPrefix(rel, "..") {
			hostPath = filepath.Join(suiteRepo, parts[0], rel)
		}
	}
	if hostPath == "" {
		t.Errorf("%s: no volume mounts its config file %s", name, inContainer)
		return nil
	}
	data, err := os.ReadFile(hostPath)
	if err != nil {
		t.Errorf("%s: %v", name, err)
		return nil
	}
	cfg, err := config.Parse(data, suiteLookup(s.Environment))
	if err != nil {
		t.Errorf("%s: config %s: %v", name, hostPath, err)
		return nil
	}
	return cfg
}

func suiteLookup(env map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	}
}

// TestExampleConfigs checks that every config file of examples/configs,
// which THROTTLE_CONFIG selects for the compose replicas, is valid with the
// replicas' environment.
func TestExampleConfigs(t *testing.T) {
	c := suiteLoadCompose(t)
	env := c.Services["throttle-1"].Environment
	files, err := filepath.Glob(filepath.Join(suiteRepo, "examples", "configs", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no config files in examples/configs (%v)", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := config.Parse(data, suiteLookup(env))
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Metrics.Listen != "0.0.0.0:9464" {
				t.Errorf("metrics.listen %q, want 0.0.0.0:9464 (the published port and the health check)", cfg.Metrics.Listen)
			}
		})
	}
}

// suiteStage is one stage of a Dockerfile, its instructions with their
// continuation lines joined.
type suiteStage struct {
	from, name string
	lines      []string
}

func suiteDockerfile(t *testing.T) []suiteStage {
	t.Helper()
	f, err := os.Open(filepath.Join(suiteRepo, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var stages []suiteStage
	var cur string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasSuffix(line, `\`) {
			cur += strings.TrimSuffix(line, `\`) + " "
			continue
		}
		line, cur = cur+line, ""
		fields := strings.Fields(line)
		if strings.EqualFold(fields[0], "FROM") {
			st := suiteStage{from: fields[1]}
			if len(fields) == 4 && strings.EqualFold(fields[2], "AS") {
				st.name = fields[3]
			}
			stages = append(stages, st)
			continue
		}
		if len(stages) > 0 {
			stages[len(stages)-1].lines = append(stages[len(stages)-1].lines, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return stages
}

// TestDockerfile checks the image recipe: a static binary stamped with the
// version, minimal non-root final images, a health check, and the targets
// that docker-compose.yml builds.
func TestDockerfile(t *testing.T) {
	stages := suiteDockerfile(t)
	byName := map[string]suiteStage{}
	for _, s := range stages {
		byName[s.name] = s
	}
	if len(stages) == 0 || stages[len(stages)-1].name != "throttle" {
		t.Fatalf("the last stage (what `docker build .` produces) must be throttle")
	}
	for name, s := range suiteLoadCompose(t).Services {
		if s.Build != nil {
			if _, ok := byName[s.Build.Target]; !ok {
				t.Errorf("service %s builds target %q, which the Dockerfile lacks", name, s.Build.Target)
			}
		}
	}
	has := func(s suiteStage, re string) bool {
		return slices.ContainsFunc(s.lines, regexp.MustCompile(re).MatchString)
	}
	for _, name := range []string{"throttle", "mocksink", "producer"} {
		s, ok := byName[name]
		if !ok {
			t.Errorf("stage %s is missing", name)
			continue
		}
		if !strings.HasPrefix(s.from, "gcr.io/distroless/static") || !strings.HasSuffix(s.from, ":nonroot") {
			t.Errorf("stage %s is FROM %s, want a distroless static nonroot image", name, s.from)
		}
		if !has(s, `^USER (nonroot|65532)`) {
			t.Errorf("stage %s does not run as the nonroot user", name)
		}
	}
	th := byName["throttle"]
	for _, re := range []string{`^EXPOSE 9464$`, `^HEALTHCHECK .*CMD \["/throttle", "healthcheck"\]`, `^ENTRYPOINT \["/throttle"\]`} {
		if !has(th, re) {
			t.Errorf("stage throttle has no instruction matching %s", re)
		}
	}
	build := byName["build-throttle"]
	if !has(byName["build"], `CGO_ENABLED=0`) {
		t.Error("the build stage does not set CGO_ENABLED=0: the binary would not be static")
	}
	for _, re := range []string{`-trimpath`, `-X github.com/throttlehq/throttle/internal/cli\.version=\$\{VERSION\}`, `-X github.com/throttlehq/throttle/internal/cli\.commit=\$\{COMMIT\}`, `\./cmd/throttle`} {
		if !has(build, re) {
			t.Errorf("the throttle build does not match %s", re)
		}
	}
}

// TestLdflagsTargets checks that the variables that the Dockerfile and the
// Makefile set with -ldflags -X exist as package-level strings: the linker
// ignores -X for a variable that does not exist.
func TestLdflagsTargets(t *testing.T) {
	fset := token.NewFileSet()
	dir := filepath.Join(suiteRepo, "internal", "cli")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.VAR {
				continue
			}
			for _, spec := range g.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if i < len(vs.Values) {
						if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
							found[n.Name] = true
						}
					}
				}
			}
		}
	}
	for _, name := range []string{"version", "commit"} {
		if !found[name] {
			t.Errorf("internal/cli has no package-level string variable %s initialised with a literal for -X to set", name)
		}
	}
	mk, err := os.ReadFile(filepath.Join(suiteRepo, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"PKG         := github.com/throttlehq/throttle", "-X $(PKG)/internal/cli.version=$(VERSION)", "-X $(PKG)/internal/cli.commit=$(COMMIT)"} {
		if !bytes.Contains(mk, []byte(want)) {
			t.Errorf("Makefile lacks %q", want)
		}
	}
	for _, target := range []string{"build", "test", "test-race", "bench", "lint", "up", "down"} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(target) + `:`).Match(mk) {
			t.Errorf("Makefile has no target %s", target)
		}
	}
}
