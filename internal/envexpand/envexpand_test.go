package envexpand

import (
	"strings"
	"testing"
)

func TestExpand(t *testing.T) {
	env := map[string]string{"TOKEN": "abc", "EMPTY": ""}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	tests := []struct {
		in, want, wantErr string
	}{
		{in: "Bearer ${TOKEN}", want: "Bearer abc"},
		{in: "no refs", want: "no refs"},
		{in: "${EMPTY}", want: ""},
		{in: "${EMPTY:-def}", want: "def"},
		{in: "${UNSET:-def}", want: "def"},
		{in: "$$5 $x $", want: "$5 $x $"},
		{in: "$${TOKEN}", want: "${TOKEN}"},
		{in: "${UNSET}", wantErr: "environment variable UNSET is not set"},
		{in: "${A} ${B}", wantErr: "environment variables A, B are not set"},
		{in: "${TOKEN", wantErr: "unterminated"},
		{in: "${s3cret-value}", wantErr: "invalid variable reference"},
	}
	for _, tt := range tests {
		got, _, err := Expand(tt.in, lookup)
		switch {
		case tt.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Expand(%q) error = %v, want %q", tt.in, err, tt.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), "s3cret") {
				t.Errorf("Expand(%q) error quotes the value: %v", tt.in, err)
			}
		case err != nil:
			t.Errorf("Expand(%q): %v", tt.in, err)
		case got != tt.want:
			t.Errorf("Expand(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
