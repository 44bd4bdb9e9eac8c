package redislimiter

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDesignDocNamesEveryScript checks that docs/design.md, the map of the
// Redis scripts, names every file of lua/, so that a script added or
// renamed cannot leave the page behind.
func TestDesignDocNamesEveryScript(t *testing.T) {
	doc, err := os.ReadFile("../../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("lua/*.lua")
	if err != nil || len(files) == 0 {
		t.Fatalf("no lua/*.lua files (%v)", err)
	}
	for _, f := range files {
		if name := filepath.Base(f); !strings.Contains(string(doc), "`"+name+"`") {
			t.Errorf("docs/design.md does not name %s (Scripts)", name)
		}
	}
}
