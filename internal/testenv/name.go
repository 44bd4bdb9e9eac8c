package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"regexp"
	"strings"
	"testing"
)

var nameUnsafe = regexp.MustCompile(`[^a-z0-9]+`)

// Name returns a name for a bucket, queue, topic or group that is unique to
// this test run: prefix, the test's name in lower case with every run of
// other characters than letters and digits replaced by "-", and 8 random
// hex digits. Names made by concurrent or repeated runs never collide, so
// tests can share one Redis or broker.
func Name(t testing.TB, prefix string) string {
	t.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	n := strings.Trim(nameUnsafe.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	return prefix + "-" + n + "-" + hex.EncodeToString(b[:])
}
