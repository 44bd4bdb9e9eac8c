// Package cli is the throttle command: it parses the command line, wires the
// configured source, shared bucket and sink into one replica, serves metrics
// and health checks, administers buckets in Redis, and runs the
// self-contained demo.
//
// The binary in cmd/throttle only installs the signal handling and calls
// [Run]; the end-to-end tests call Run too, or the built binary.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/config"
)

// Exit codes returned by Run.
const (
	// ExitOK means success, including a graceful drain after SIGINT,
	// SIGTERM or SIGHUP.
	ExitOK = 0
	// ExitFailure means a runtime failure: a broker refused the consumer, a
	// listener could not be opened, Redis refused an admin command.
	ExitFailure = 1
	// ExitUsage means a usage or configuration error: an unknown command or
	// flag, a missing argument, or a config file that does not validate.
	ExitUsage = 2
	// ExitInterrupted is what cmd/throttle exits with when a second SIGINT,
	// SIGTERM or SIGHUP arrives during the drain of a command that drains
	// (see Drains; 128 + SIGINT, the shell convention).
	ExitInterrupted = 130
)

// Drains reports whether the command of args (without the program name)
// drains in-flight messages when ctx ends: run and demo. For them a second
// signal should cut the drain short (ExitInterrupted). The other commands
// consume nothing: they end promptly on the first signal, with their own
// exit code (bucket watch with ExitOK), and a second one has nothing to
// cut short, as when timeout(1) signals the process and then its group.
func Drains(args []string) bool {
	return len(args) > 0 && (args[0] == "run" || args[0] == "demo")
}

// version and commit are set at build time with
//
//	-ldflags "-X github.com/throttlehq/throttle/internal/cli.version=v1.2.3 -X github.com/throttlehq/throttle/internal/cli.commit=abc1234"
var (
	version = "dev"
	commit  = "none"
)

const usageText = `throttle consumes a Kafka topic or a RabbitMQ queue and delivers each message
to an HTTP endpoint, a PostgreSQL table or stdout, no faster than a token
bucket that every replica shares in Redis allows.

Usage:
  throttle demo [flags]                    3 replicas sharing one bucket, no setup needed
  throttle run --config FILE               run one replica
  throttle bucket status [NAME] [flags]    show a bucket: tokens, rate, override, replicas
  throttle bucket set [NAME] --rate R [--burst B] [--for D]
                                           override the rate of every running replica
  throttle bucket set [NAME] --clear       go back to each replica's configured rate
  throttle bucket fill [NAME] [flags]      fill the bucket before a known peak
  throttle bucket reset [NAME] [flags]     forget the bucket's state and override
  throttle bucket list [flags]             every bucket in Redis, with its status
  throttle bucket pause [NAME] --for D     stop every replica for D
  throttle bucket resume [NAME] [flags]    end a pause now
  throttle bucket watch [NAME] [flags]     a live view of a bucket, redrawn every second
  throttle console --config FILE           a web console: the buckets live, and the actions
  throttle healthcheck [--url URL]         exit 0 if a replica's /healthz answers (for containers)
  throttle version                         print the version
  throttle help [COMMAND]                  show help for a command

Exit codes:
  0    success, also after a graceful drain on SIGINT, SIGTERM or SIGHUP
  1    runtime failure
  2    usage or configuration error
  130  a second SIGINT, SIGTERM or SIGHUP stopped the drain
`

// Run runs the throttle command with args (without the program name),
// writing normal output to stdout and logs, progress and errors to stderr,
// and returns the process exit code: ExitOK, ExitFailure or ExitUsage.
// Cancelling ctx stops a running command gracefully, as SIGINT does. Run is
// safe for concurrent use; each call is independent.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	quietRedis.Do(func() { redis.SetLogger(discardRedisLog{}) })
	err := dispatch(ctx, args, stdout, stderr)
	if err == nil {
		return ExitOK
	}
	var ve *config.ValidationError
	var ue *usageError
	switch {
	case errors.Is(err, flag.ErrHelp):
		return ExitOK
	case errors.As(err, &ve):
		fmt.Fprintf(stderr, "throttle: %s has %s:\n", configName(err), plural(len(ve.Problems), "problem"))
		for _, p := range ve.Problems {
			fmt.Fprintf(stderr, "  %s\n", p)
		}
		return ExitUsage
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "throttle: %s.\nRun '%s' for usage.\n", sentence(ue.msg), strings.TrimSpace("throttle help "+ue.help))
		return ExitUsage
	case errors.As(err, new(*configError)):
		fmt.Fprintf(stderr, "throttle: %s.\n", sentence(err.Error()))
		return ExitUsage
	default:
		fmt.Fprintf(stderr, "throttle: %s.\n", sentence(err.Error()))
		return ExitFailure
	}
}

// sentence returns msg without the full stop that a server's message may
// end in, so that the one Run adds is not doubled ("disabled..").
func sentence(msg string) string { return strings.TrimRight(msg, ". ") }

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return &usageError{msg: "no command given"}
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "run":
		return cmdRun(ctx, rest, stdout, stderr)
	case "bucket":
		if len(rest) > 0 && rest[0] == "watch" { // watch.go
			return cmdBucketWatch(ctx, rest[1:], stdout)
		}
		return cmdBucket(ctx, rest, stdout, stderr)
	case "demo":
		return cmdDemo(ctx, rest, stdout, stderr)
	case "console":
		return cmdConsole(ctx, rest, stdout, stderr)
	case "healthcheck":
		return cmdHealthcheck(ctx, rest, stdout)
	case "version", "--version", "-version":
		fmt.Fprintf(stdout, "throttle %s (commit %s, %s, %s/%s)\n", version, commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return nil
	case "help", "-h", "-help", "--help":
		return cmdHelp(rest, stdout)
	default:
		return &usageError{msg: fmt.Sprintf("unknown command %q", cmd)}
	}
}

const versionHelp = `Usage: throttle version

Prints the version, the commit and the Go version the binary was built with.
`

func cmdHelp(args []string, stdout io.Writer) error {
	topic := strings.Join(args, " ")
	if strings.HasPrefix(topic, "bucket ") && topic != "bucket watch" {
		topic = "bucket"
	}
	text, ok := map[string]string{
		"":             usageText,
		"run":          runHelp,
		"bucket":       bucketHelp,
		"bucket watch": watchHelp,
		"demo":         demoHelp,
		"console":      consoleHelp,
		"healthcheck":  healthcheckHelp,
		"version":      versionHelp,
	}[topic]
	if !ok {
		return &usageError{msg: fmt.Sprintf("no help for %q", strings.Join(args, " "))}
	}
	fmt.Fprint(stdout, text)
	return nil
}

// quietRedis silences go-redis's own logger, which writes to the process's
// stderr behind the configured log: every failed Redis call already reaches
// the limiter, its metrics and its log, or the admin command's error.
var quietRedis sync.Once

type discardRedisLog struct{}

func (discardRedisLog) Printf(context.Context, string, ...any) {}

// usageError is a command line that cannot be run. help names the command
// whose help to point at, or is empty for the overview.
type usageError struct {
	msg  string
	help string
}

func (e *usageError) Error() string { return e.msg }

func usagef(help, format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...), help: help}
}

// configError is a configuration that cannot be used: a file that cannot be
// read, or a setting this build cannot honour. It maps to ExitUsage.
type configError struct{ err error }

func (e *configError) Error() string { return e.err.Error() }
func (e *configError) Unwrap() error { return e.err }

// configPathError remembers which file a *config.ValidationError came from.
type configPathError struct {
	path string
	err  error
}

func (e *configPathError) Error() string { return "config " + e.path + ": " + e.err.Error() }
func (e *configPathError) Unwrap() error { return e.err }

func configName(err error) string {
	var pe *configPathError
	if errors.As(err, &pe) {
		return "config " + pe.path
	}
	return "the config"
}

// loadConfig reads and validates the config file at path. A validation
// failure keeps its *config.ValidationError, so that every problem is
// printed; any other failure is a *configError.
func loadConfig(path string) (*config.Config, error) {
	cfg, err := config.Load(path)
	if err == nil {
		return cfg, nil
	}
	var ve *config.ValidationError
	if errors.As(err, &ve) {
		return nil, &configPathError{path: path, err: ve}
	}
	return nil, &configError{err: err}
}

// newFlagSet returns a flag set that reports errors through its return
// values only: Run prints them.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parseArgs parses flags that may come before, between or after the
// positional arguments, which it returns. Everything after "--" is
// positional. -h and --help print help to stdout and return flag.ErrHelp.
func parseArgs(fs *flag.FlagSet, args []string, help string, stdout io.Writer) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprint(stdout, help)
				return nil, err
			}
			return nil, &usageError{msg: err.Error(), help: fs.Name()}
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}
