package cli

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/testenv"
)

// runCLI runs the command line and returns its exit code and output.
func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errOut testenv.Buffer
	code = Run(ctx, args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// writeConfig writes a config file into a temporary directory.
func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "throttle.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
