package limiter

import (
	"math"
	"strings"
	"testing"
)

func TestParseRate(t *testing.T) {
	tests := []struct {
		in      string
		want    float64
		wantErr string // substring; "" means success
	}{
		{"100", 100, ""},
		{"0.5", 0.5, ""},
		{"1e3", 1000, ""},
		{"100/s", 100, ""},
		{" 5 / s ", 5, ""},
		{"120/min", 2, ""},
		{"5/h", 5.0 / 3600, ""},
		{"3600/h", 1, ""},
		{"86400/d", 1, ""},
		{"200000/d", 200000.0 / 86400, ""},
		{"0.5/min", 0.5 / 60, ""},
		{"", 0, "must be a number"},
		{"fast", 0, "must be a number"},
		{"5/m", 0, "unknown unit"},
		{"5/hour", 0, "unknown unit"},
		{"5/", 0, "unknown unit"},
		{"/s", 0, "must be a number"},
		{"5/s/s", 0, "unknown unit"},
		{"0", 0, "> 0"},
		{"0/h", 0, "> 0"},
		{"-3/s", 0, "> 0"},
		{"NaN", 0, "> 0"},
		{"Inf/s", 0, "> 0"},
		{"1e20", 0, "<= 1e+09"}, // bucket set --rate 1e20 once passed
		{"1e20/d", 0, "<= 1e+09"},
		{"1e400", 0, "out of range"},
		{"1e-320/d", 0, "too small"},
	}
	for _, tt := range tests {
		got, err := ParseRate(tt.in)
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("ParseRate(%q): %v", tt.in, err)
		case tt.wantErr == "" && math.Abs(got-tt.want) > 1e-12*tt.want:
			t.Errorf("ParseRate(%q) = %v, want %v", tt.in, got, tt.want)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("ParseRate(%q) = %v, %v; want an error containing %q", tt.in, got, err, tt.wantErr)
		}
	}
}
