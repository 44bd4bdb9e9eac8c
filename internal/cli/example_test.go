package cli_test

import (
	"context"
	"os"

	"github.com/throttlehq/throttle/internal/cli"
)

// Run is what cmd/throttle calls with the process's arguments; it returns
// the exit code.
func ExampleRun() {
	code := cli.Run(context.Background(), []string{"help", "version"}, os.Stdout, os.Stderr)
	if code != cli.ExitOK {
		os.Exit(code)
	}
	// Output:
	// Usage: throttle version
	//
	// Prints the version, the commit and the Go version the binary was built with.
}
