package config

import (
	"os"
	"strings"
	"testing"
)

// TestREADMEConfigReference parses the commented configuration in README.md,
// so that the documented keys and defaults cannot drift from the code.
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
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("the yaml block is not closed")
	}
	env := map[string]string{"SMS_TOKEN": "t0ken"}
	cfg, err := Parse([]byte(block), func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatalf("the README's configuration does not parse:\n%v", err)
	}
	if cfg.Limit.Bucket != "sms-outbound" || cfg.Limit.Rate != 100 || cfg.Limit.Burst != 200 ||
		cfg.Source.Kafka == nil || cfg.Sink.HTTP == nil || cfg.Sink.HTTP.Headers["Authorization"] != "Bearer t0ken" {
		t.Fatalf("parsed %+v", cfg)
	}
}
