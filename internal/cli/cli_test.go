package cli

import (
	"strings"
	"testing"
)

func TestUsageErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string // in stderr
	}{
		{"no command", nil, "no command given"},
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"run without config", []string{"run"}, "run needs --config FILE"},
		{"run unknown flag", []string{"run", "--confg", "x.yaml"}, "flag provided but not defined: -confg"},
		{"run extra argument", []string{"run", "--config", "x.yaml", "extra"}, `unexpected argument "extra"`},
		{"bucket without subcommand", []string{"bucket"}, "bucket needs a subcommand"},
		{"bucket unknown subcommand", []string{"bucket", "drain", "x"}, `unknown bucket subcommand "drain"`},
		{"bucket without target", []string{"bucket", "status", "x"}, "needs --config FILE or --redis ADDR"},
		{"bucket with both targets", []string{"bucket", "status", "x", "--redis", "127.0.0.1:6379", "--config", "c.yaml"}, "either --config or --redis"},
		{"bucket redis without name", []string{"bucket", "fill", "--redis", "127.0.0.1:6379"}, "needs the bucket NAME with --redis"},
		{"bucket redis not host:port", []string{"bucket", "status", "x", "--redis", "redis://u:hunter2@h:6379"}, "--redis must be host:port"},
		{"bucket bad name", []string{"bucket", "status", "a{b}", "--redis", "127.0.0.1:6379"}, "bucket NAME"},
		{"bucket two names", []string{"bucket", "reset", "a", "b", "--redis", "127.0.0.1:6379"}, `unexpected argument "b"`},
		{"set without rate", []string{"bucket", "set", "x", "--redis", "127.0.0.1:6379"}, "needs --rate R, or --clear"},
		{"set zero rate", []string{"bucket", "set", "x", "--rate", "0", "--redis", "127.0.0.1:6379"}, "--rate must be a number > 0 and <= 1e+09, got 0"},
		{"set rate too high", []string{"bucket", "set", "x", "--rate", "1e20", "--redis", "127.0.0.1:6379"}, "--rate must be a number > 0 and <= 1e+09, got 1e20"},
		{"set rate bad unit", []string{"bucket", "set", "x", "--rate", "5/week", "--redis", "127.0.0.1:6379"}, "--rate: unknown unit: use N/s, N/min, N/h or N/d, got 5/week"},
		{"set bad burst", []string{"bucket", "set", "x", "--rate", "5", "--burst", "0", "--redis", "127.0.0.1:6379"}, "--burst must be >= 1 and <= 2147483647, got 0"},
		{"set bad for", []string{"bucket", "set", "x", "--rate", "5", "--for", "0s", "--redis", "127.0.0.1:6379"}, "--for must be > 0"},
		{"set clear and rate", []string{"bucket", "set", "x", "--clear", "--rate", "5", "--redis", "127.0.0.1:6379"}, "--clear cannot be combined"},
		{"set rate not a number", []string{"bucket", "set", "x", "--rate", "fast"}, "--rate must be a number per second or N/s, N/min, N/h, N/d, got fast"},
		{"demo bad rate", []string{"demo", "--rate", "-1"}, "--rate must be a number > 0, got -1"},
		{"demo bad replicas", []string{"demo", "--replicas", "0"}, "--replicas must be between 1 and 16"},
		{"help for unknown topic", []string{"help", "frobnicate"}, `no help for "frobnicate"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, stderr := runCLI(t, tt.args...)
			if code != ExitUsage {
				t.Errorf("exit code %d, want %d; stderr:\n%s", code, ExitUsage, stderr)
			}
			if !strings.Contains(stderr, tt.want) {
				t.Errorf("stderr does not contain %q:\n%s", tt.want, stderr)
			}
			if !strings.Contains(stderr, "Run 'throttle help") {
				t.Errorf("stderr does not point at the help:\n%s", stderr)
			}
			if strings.Contains(stderr, "hunter2") {
				t.Errorf("stderr leaks a password:\n%s", stderr)
			}
		})
	}
}

func TestBadConfig(t *testing.T) {
	const valid = `
limit: {bucket: b, rate: 10}
source:
  rabbitmq: {url: "amqp://guest:hunter2@127.0.0.1:5672/", queue: q}
sink:
  stdout: {}
`
	tests := []struct {
		name string
		yaml string
		want []string // each in stderr
	}{
		{"rate zero", strings.Replace(valid, "rate: 10", "rate: 0", 1), []string{"limit.rate: must be a number > 0 and <= 1e+09, got 0"}},
		{"negative burst", strings.Replace(valid, "rate: 10", "rate: 10, burst: -3", 1), []string{"limit.burst: must be >= 1 and <= 2147483647, got -3"}},
		{"unknown key", valid + "metrics: {listn: 1.2.3.4:5}\n", []string{"metrics.listn", "unknown key"}},
		{"missing source", strings.Replace(valid, "  rabbitmq:", "  # rabbitmq:", 1), []string{"source"}},
		{"two sinks", valid + "  http: {url: \"http://127.0.0.1:1/x\"}\n", []string{"sink: exactly one of http, postgres, stdout"}},
		{"bad duration", valid + "delivery: {backoff: 5 seconds}\n", []string{"delivery.backoff", "invalid duration"}},
		{"unset variable", strings.Replace(valid, "bucket: b", `bucket: "${CLI_TEST_SURELY_UNSET}"`, 1), []string{"limit.bucket", "CLI_TEST_SURELY_UNSET"}},
		{"every problem listed", strings.Replace(valid, "rate: 10", "rate: -5, burst: -1, colour: red", 1), []string{"3 problems", "limit.rate", "limit.burst", "limit.colour"}},
		{"invalid yaml", "limit: [unclosed\n", []string{"invalid YAML"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeConfig(t, tt.yaml)
			for _, args := range [][]string{
				{"run", "--config", path},
				{"bucket", "status", "--config", path},
			} {
				code, _, stderr := runCLI(t, args...)
				if code != ExitUsage {
					t.Errorf("%s: exit code %d, want %d; stderr:\n%s", args[0], code, ExitUsage, stderr)
				}
				for _, w := range tt.want {
					if !strings.Contains(stderr, w) {
						t.Errorf("%s: stderr does not contain %q:\n%s", args[0], w, stderr)
					}
				}
				if strings.Contains(stderr, "hunter2") {
					t.Errorf("%s: stderr leaks a password:\n%s", args[0], stderr)
				}
			}
		})
	}
}

func TestMissingConfigFile(t *testing.T) {
	code, _, stderr := runCLI(t, "run", "--config", "/nonexistent/throttle.yaml")
	if code != ExitUsage || !strings.Contains(stderr, "/nonexistent/throttle.yaml") {
		t.Errorf("exit code %d, stderr %q; want %d and the path", code, stderr, ExitUsage)
	}
}

func TestUnsupportedSASL(t *testing.T) {
	path := writeConfig(t, `
limit: {bucket: b, rate: 10}
source:
  kafka: {brokers: ["127.0.0.1:9"], topic: t, group: g, sasl: {mechanism: gssapi, username: u, password: hunter2}}
sink: {stdout: {}}
metrics: {listen: "off"}
`)
	code, _, stderr := runCLI(t, "run", "--config", path)
	if code != ExitUsage || !strings.Contains(stderr, "source.kafka.sasl.mechanism") {
		t.Errorf("exit code %d, stderr %q; want %d naming source.kafka.sasl.mechanism", code, stderr, ExitUsage)
	}
	if strings.Contains(stderr, "hunter2") {
		t.Errorf("stderr leaks a password:\n%s", stderr)
	}
}

func TestVersion(t *testing.T) {
	oldVersion, oldCommit := version, commit
	version, commit = "v1.2.3", "abc1234"
	t.Cleanup(func() { version, commit = oldVersion, oldCommit })
	code, stdout, _ := runCLI(t, "version")
	if code != ExitOK {
		t.Fatalf("exit code %d", code)
	}
	if !strings.HasPrefix(stdout, "throttle v1.2.3 (commit abc1234, go") {
		t.Errorf("version output %q", stdout)
	}
}

func TestHelp(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"help"}, "throttle bucket set [NAME] --rate R"},
		{[]string{"--help"}, "Exit codes:"},
		{[]string{"help", "run"}, "Usage: throttle run --config FILE"},
		{[]string{"run", "--help"}, "Usage: throttle run --config FILE"},
		{[]string{"help", "bucket", "set"}, "The runtime override and each replica's configured rate"},
		{[]string{"bucket", "status", "-h"}, "rolling deploy"},
		{[]string{"help", "demo"}, "Usage: throttle demo"},
		{[]string{"help", "version"}, "Usage: throttle version"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, stdout, stderr := runCLI(t, tt.args...)
			if code != ExitOK {
				t.Errorf("exit code %d; stderr %s", code, stderr)
			}
			if !strings.Contains(stdout, tt.want) {
				t.Errorf("stdout does not contain %q:\n%s", tt.want, stdout)
			}
		})
	}
}

func TestParseArgsInterspersed(t *testing.T) {
	tests := []struct {
		args    []string
		wantPos []string
		wantOn  bool
	}{
		{[]string{"a", "--on"}, []string{"a"}, true},
		{[]string{"--on", "a", "b"}, []string{"a", "b"}, true},
		{[]string{"a", "--", "--on"}, []string{"a", "--on"}, false},
		{nil, nil, false},
	}
	for _, tt := range tests {
		fs := newFlagSet("x")
		on := fs.Bool("on", false, "")
		pos, err := parseArgs(fs, tt.args, "", nil)
		if err != nil {
			t.Fatalf("%q: %v", tt.args, err)
		}
		if strings.Join(pos, ",") != strings.Join(tt.wantPos, ",") || *on != tt.wantOn {
			t.Errorf("%q: positional %q, --on %v; want %q, %v", tt.args, pos, *on, tt.wantPos, tt.wantOn)
		}
	}
}

func TestSentence(t *testing.T) {
	for in, want := range map[string]string{
		"redis: ERR scripts disabled.": "redis: ERR scripts disabled",
		"no answer":                    "no answer",
		"trailing. ":                   "trailing",
	} {
		if got := sentence(in); got != want {
			t.Errorf("sentence(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestDrains: only the commands that consume drain, so that a second
// signal cuts short only their drain; bucket watch ends on the first.
func TestDrains(t *testing.T) {
	for args, want := range map[string]bool{
		"run --config x.yaml": true, "demo": true,
		"bucket watch sms --redis 127.0.0.1:6379": false, "bucket status": false, "version": false, "": false,
	} {
		if got := Drains(strings.Fields(args)); got != want {
			t.Errorf("Drains(%q) = %v, want %v", args, got, want)
		}
	}
}
