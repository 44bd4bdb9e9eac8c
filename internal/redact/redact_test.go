package redact

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"testing"
)

func TestURL(t *testing.T) {
	tests := []struct {
		in, want string
		secrets  []string
	}{
		{"", "", nil},
		{"amqp://guest:guest@127.0.0.1:5672/", "amqp://guest:xxxxx@127.0.0.1:5672/", []string{"guest"}},
		{"amqp://guest@h/", "amqp://guest@h/", nil},
		{"postgres://u:p%40ss@h:5432/db?sslmode=require", "postgres://u:xxxxx@h:5432/db?sslmode=require", []string{"p%40ss", "p@ss"}},
		{"postgres://h/db?user=u&password=p&sslpassword=q#f", "postgres://h/db?user=u&password=xxxxx&sslpassword=xxxxx#f", []string{"p", "q"}},
		{"redis://:pw@h:6379/0", "redis://:xxxxx@h:6379/0", []string{"pw"}},
		{"amqp://u:p/a?b#c@h/v", "amqp://u:xxxxx@h/v", []string{"p/a?b#c"}},
		{"amqp://u:1234/x@h/", "amqp://u:xxxxx@h/", []string{"1234/x"}},
		{"http://h/path?api_key=k1&x=1", "http://h/path?api_key=xxxxx&x=1", []string{"k1"}},
		{"http://h/path", "http://h/path", nil},
		{"host=h user=u password=secret dbname=d", "host=h user=u password=xxxxx dbname=d", []string{"secret"}},
		{"password = 'a \\' b' host=h", "password = xxxxx host=h", []string{`'a \' b'`, `a \' b`}},
		{"host=h password='unterminated", "xxxxx", []string{"host=h password='unterminated"}},
		{"127.0.0.1:6379", "127.0.0.1:6379", nil},
	}
	for _, tt := range tests {
		if got := URL(tt.in); got != tt.want {
			t.Errorf("URL(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if got := Secrets(tt.in); !slices.Equal(got, tt.secrets) {
			t.Errorf("Secrets(%q) = %q, want %q", tt.in, got, tt.secrets)
		}
	}
}

// TestURLMatchesNetURL checks that a URL redacted here looks like one
// redacted by net/url, which other packages (the RabbitMQ consumer) use.
func TestURLMatchesNetURL(t *testing.T) {
	for _, raw := range []string{"amqp://guest:guest@127.0.0.1:5672/", "https://u:p@h/x", "redis://:pw@h:6379/0"} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := URL(raw), u.Redacted(); got != want {
			t.Errorf("URL(%q) = %q, net/url says %q", raw, got, want)
		}
	}
}

func TestIsSecretName(t *testing.T) {
	for _, h := range []string{"Authorization", "proxy-authorization", "X-Auth-Token", "X-Api-Key", "Client-Secret", "X-Password", "Cookie", "sslpassword"} {
		if !IsSecretName(h) {
			t.Errorf("IsSecretName(%q) = false", h)
		}
	}
	for _, h := range []string{"Content-Type", "X-Request-Id", "Accept", "sslmode"} {
		if IsSecretName(h) {
			t.Errorf("IsSecretName(%q) = true", h)
		}
	}
}

func TestValueAndText(t *testing.T) {
	if Value("") != "" || Value("s") != Mask {
		t.Errorf("Value: %q %q", Value(""), Value("s"))
	}
	if got := Text("pw s3cret and s3cret, not x", "", "s3cret"); got != "pw xxxxx and xxxxx, not x" {
		t.Errorf("Text = %q", got)
	}
}

func TestErrorKeepsChain(t *testing.T) {
	err := Error(fmt.Errorf("connecting: pw s3cret: %w", context.DeadlineExceeded), "s3cret")
	if err.Error() != "connecting: pw xxxxx: context deadline exceeded" {
		t.Errorf("text = %q", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Error("redacted error lost its chain")
	}
	plain := errors.New("nothing secret")
	if Error(plain, "s3cret") != plain {
		t.Error("an error without secrets was wrapped")
	}
	if Error(nil, "x") != nil {
		t.Error("Error(nil) != nil")
	}
}

func TestEndpoint(t *testing.T) {
	for in, want := range map[string]string{
		"https://u:p@api.example/v1/send?api_key=k#f": "https://api.example/v1/send",
		"http://h:8080/a%2Fb":                         "http://h:8080/a%2Fb",
		"not a url":                                   "",
		"http://[::1":                                 "",
	} {
		if got := Endpoint(in); got != want {
			t.Errorf("Endpoint(%q) = %q, want %q", in, got, want)
		}
	}
}
