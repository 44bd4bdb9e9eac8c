package httpsink

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestRetryAfterParse(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		in     string
		want   time.Duration
		wantOK bool
	}{
		{"2", 2 * time.Second, true},
		{" 120 ", 2 * time.Minute, true},
		{"0", 0, true},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{"Sat, 01 Mar 2025 12:00:05 GMT", 5 * time.Second, true},
		{"Saturday, 01-Mar-25 12:00:05 GMT", 5 * time.Second, true}, // RFC 850
		{now.Add(-time.Minute).Format(http.TimeFormat), 0, true},
		{"99999999999999999999", 0, false},
		{"9999999999", 24 * time.Hour, true},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"soon", 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		got, ok := retryAfter(tt.in, now)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("retryAfter(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.wantOK)
		}
	}
}

func TestSnippet(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"  short\r\n", "short"},
		{"a\tb\x00c", "a b c"},
		{"bad \xff utf8", "bad \uFFFD utf8"},
		{strings.Repeat("z", snippetLen+10), strings.Repeat("z", snippetLen) + "…"},
	}
	for _, tt := range tests {
		if got := snippet([]byte(tt.in)); got != tt.want {
			t.Errorf("snippet(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
