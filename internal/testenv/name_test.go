package testenv

import (
	"regexp"
	"testing"
)

func TestName(t *testing.T) {
	t.Run("Sub Test/{x}", func(t *testing.T) {
		a, b := Name(t, "q"), Name(t, "q")
		if a == b {
			t.Errorf("two calls gave the same name %q", a)
		}
		if !regexp.MustCompile(`^q-testname-sub-test-x-[0-9a-f]{8}$`).MatchString(a) {
			t.Errorf("Name = %q, want q-testname-sub-test-x- and 8 hex digits", a)
		}
	})
}
