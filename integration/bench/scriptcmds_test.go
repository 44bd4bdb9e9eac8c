package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestScriptCommandsCoverTheScripts: every command that the limiter's Lua
// scripts run is in scriptCommands, so that the Redis calls per message or
// per token count only what clients send. Before the list was checked, the
// take script's EXISTS and HGETALL tripled the end-to-end program's count
// with the limit in reach (0.0608 calls per message against 0.0208).
func TestScriptCommandsCoverTheScripts(t *testing.T) {
	// The scripts' Lua is in lua/*.lua; the Go files are read too, in case
	// a script is written inline again.
	lua, err := filepath.Glob("../../limiter/redislimiter/lua/*.lua")
	if err != nil || len(lua) == 0 {
		t.Fatalf("no script sources found: %v", err)
	}
	goFiles, err := filepath.Glob("../../limiter/redislimiter/*.go")
	if err != nil {
		t.Fatal(err)
	}
	files := append(lua, goFiles...)
	call := regexp.MustCompile(`redis\.(?:p?call)\('([A-Za-z]+)'`)
	seen := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range call.FindAllStringSubmatch(string(src), -1) {
			seen++
			if cmd := strings.ToLower(m[1]); !scriptCommands[cmd] {
				t.Errorf("%s: the scripts run %s, which scriptCommands does not list", filepath.Base(f), m[1])
			}
		}
	}
	if seen < 20 {
		t.Errorf("found %d redis.call in the scripts: the pattern no longer matches them", seen)
	}
}
