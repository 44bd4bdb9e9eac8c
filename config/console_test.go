package config

import (
	"strings"
	"testing"
)

// TestConsole: the console is off in a replica unless console.listen is
// set, listens on loopback unless console.allow_remote says otherwise,
// takes its token from the environment, refuses a short one, and never
// shows it in the redacted configuration.
func TestConsole(t *testing.T) {
	cfg := mustParse(t, minimal, nil)
	if cfg.Console.Enabled() || cfg.Console.Token != "" {
		t.Fatalf("default console = %+v; want off, no token", cfg.Console)
	}
	const token = "s3cret-console-token"
	doc := minimal + "console: {listen: \"127.0.0.1:0\", token: \"${THROTTLE_CONSOLE_TOKEN}\"}\n"
	cfg = mustParse(t, doc, map[string]string{"THROTTLE_CONSOLE_TOKEN": token})
	if !cfg.Console.Enabled() || cfg.Console.Token != token {
		t.Fatalf("console = %+v", cfg.Console)
	}
	if s := cfg.String(); strings.Contains(s, token) {
		t.Errorf("the redacted configuration shows the console token:\n%s", s)
	}
	for _, ok := range []string{"localhost:8090", "[::1]:8090", "127.0.0.2:1", "off"} {
		mustParse(t, minimal+"console: {listen: \""+ok+"\"}\n", nil)
	}
	mustParse(t, minimal+"console: {listen: \"0.0.0.0:8090\", allow_remote: true}\n", nil)
	for doc, want := range map[string]string{
		"console: {listen: \"0.0.0.0:8090\"}":          "console.listen: must be a loopback address",
		"console: {listen: \":8090\"}":                 "console.listen: must be a loopback address",
		"console: {listen: \"10.1.2.3:8090\"}":         "console.listen: must be a loopback address",
		"console: {listen: \"127.0.0.1\"}":             "console.listen: must be host:port",
		"console: {listen: \"127.0.0.1:99999\"}":       "console.listen: port must be a number",
		"console: {listen: \"127.0.0.1:1\", token: x}": "console.token: must be at least 16 characters, got 1",
	} {
		_, err := Parse([]byte(minimal+doc+"\n"), nil)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want %q", doc, err, want)
		}
	}
}
