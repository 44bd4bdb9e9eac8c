package config

import (
	"fmt"
	"time"

	"go.yaml.in/yaml/v3"
)

// Duration is a time.Duration written in YAML with Go syntax, such as
// "250ms", "5s" or "1m30s"; a bare 0 is also accepted. Convert it with
// time.Duration(d). A Duration is a plain value and safe for concurrent use.
type Duration time.Duration

// String formats d like time.Duration does, such as "1m30s".
func (d Duration) String() string {
	return time.Duration(d).String()
}

// UnmarshalYAML parses a scalar node with time.ParseDuration.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("expected a duration such as 5s, got %s", describeNode(n))
	}
	return d.UnmarshalText([]byte(n.Value))
}

// MarshalYAML writes d as a string such as "5s".
func (d Duration) MarshalYAML() (any, error) {
	return d.String(), nil
}

// UnmarshalText parses text with time.ParseDuration.
func (d *Duration) UnmarshalText(text []byte) error {
	v, err := time.ParseDuration(string(text))
	if err != nil {
		return fmt.Errorf("invalid duration %q: use Go syntax such as 250ms, 5s or 1m30s", text)
	}
	*d = Duration(v)
	return nil
}

// MarshalText writes d as text such as "5s".
func (d Duration) MarshalText() ([]byte, error) {
	return []byte(d.String()), nil
}
