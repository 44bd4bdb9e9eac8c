package redislimiter

import (
	"os"
	"strings"
	"testing"
)

// TestLuaFilesUsed: every file in lua/ is a .lua file that is embedded,
// opens with its header ("-- NAME.lua..."), and is read by the package's
// scripts (luaSource, directly or through a {{NAME.lua}} line), so that no
// dead fragment lingers there. The sources sent hold no header and no
// placeholder.
func TestLuaFilesUsed(t *testing.T) {
	used := make(map[string]bool, len(luaUsed)) // as left by the package's initialisation
	for n := range luaUsed {
		used[n] = true
	}
	entries, err := os.ReadDir("lua")
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) == 0 {
		t.Fatal("lua/ holds no file")
	}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".lua") {
			t.Errorf("lua/%s: only .lua files belong in lua/ (embedded as lua/*.lua)", name)
			continue
		}
		b, err := luaFiles.ReadFile("lua/" + name)
		if err != nil {
			t.Errorf("lua/%s is not embedded: %v", name, err)
			continue
		}
		if !used[name] {
			t.Errorf("lua/%s is embedded but no script uses it: compose it into one or delete it", name)
		}
		header, _, _ := strings.Cut(string(b), "\n")
		if !strings.HasPrefix(header, "-- "+name) {
			t.Errorf("lua/%s does not open with its header \"-- %s...\": %q", name, name, header)
		}
		src := luaSource(name)
		if strings.Contains(src, header) {
			t.Errorf("lua/%s: the source sent holds the header line %q", name, header)
		}
		if strings.Contains(src, "{{") {
			t.Errorf("lua/%s: the source sent holds a placeholder", name)
		}
	}
	for n := range used {
		if _, err := os.Stat("lua/" + n); err != nil {
			t.Errorf("lua/%s is used but not in lua/: %v", n, err)
		}
	}
}
