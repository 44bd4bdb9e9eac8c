package redislimiter

import (
	"embed"
	"strconv"
	"strings"

	"github.com/throttlehq/throttle/internal/backend"
)

// luaFiles holds the Lua of the scripts: one file per script body or shared
// fragment. Each file opens with a header of lines that begin with "--"
// (what it is, how it is composed, its KEYS, ARGV and reply), which is not
// sent to Redis; the rest of the file is, byte for byte. The Go code
// composes the scripts by concatenation (a prelude, then a body), as
// written next to each *redis.Script.
//
//go:embed lua/*.lua
var luaFiles embed.FS

// luaValues fill the {{NAME}} placeholders of the .lua files: numbers that
// package limiter defines.
var luaValues = map[string]string{
	"MAXRATE":    strconv.FormatFloat(backend.MaxRate, 'g', -1, 64),
	"MAXBURST":   strconv.Itoa(backend.MaxBurst),
	"MIN_QUEUED": minQueuedLua,
	"FAIRGRAIN":  strconv.Itoa(backend.FairGrain),
}

// luaUsed records the .lua files that luaSource has read, for the test that
// every embedded file is used.
var luaUsed = map[string]bool{}

// luaSource returns the Lua of the file lua/name as it is sent to Redis:
// without its header, each line that holds only {{other.lua}} replaced by
// that file's source, and each {{NAME}} by its luaValues entry. It panics,
// when the package is initialised, on a missing file or a placeholder it
// cannot fill. Not safe for concurrent use: it runs while the package's
// variables are initialised.
func luaSource(name string) string {
	b, err := luaFiles.ReadFile("lua/" + name)
	if err != nil {
		panic("redislimiter: " + err.Error())
	}
	luaUsed[name] = true
	body := string(b)
	for strings.HasPrefix(body, "--") { // the header
		_, body, _ = strings.Cut(body, "\n")
	}
	var out strings.Builder
	for line := range strings.SplitAfterSeq(body, "\n") {
		inc := strings.TrimSuffix(line, "\n")
		if strings.HasPrefix(inc, "{{") && strings.HasSuffix(inc, ".lua}}") {
			out.WriteString(luaSource(inc[2 : len(inc)-2]))
			continue
		}
		out.WriteString(line)
	}
	src := out.String()
	for k, v := range luaValues {
		src = strings.ReplaceAll(src, "{{"+k+"}}", v)
	}
	if i := strings.Index(src, "{{"); i >= 0 {
		panic("redislimiter: lua/" + name + ": unknown placeholder at " + src[i:min(len(src), i+40)])
	}
	return src
}
