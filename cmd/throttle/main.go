// Command throttle consumes a Kafka topic or a RabbitMQ queue and delivers
// each message to a sink no faster than a token bucket that every replica
// shares in Redis allows. Run "throttle help" for the commands, or
// "throttle demo" to see it work with nothing to set up.
//
// The first SIGINT, SIGTERM or SIGHUP stops intake and drains in-flight
// messages; the process then exits 0. A second one exits at once with
// status 130. (SIGHUP drains too: a closed terminal or a supervisor's
// hang-up must not drop in-flight messages. The configuration is not
// reloaded; restart the replica to change it.) Commands that drain nothing
// (bucket watch, the other bucket commands) end on the first signal and
// ignore a second one.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/throttlehq/throttle/internal/cli"
)

// shutdownSignals start the drain; a second one ends the process at once.
var shutdownSignals = []os.Signal{os.Interrupt, syscall.SIGTERM, syscall.SIGHUP}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), shutdownSignals...)
	defer stop()
	// Both channels see every signal: the context ends at the first, and
	// the second ends the process without waiting for the drain.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, shutdownSignals...)
	go func() {
		<-sigs
		sig := <-sigs
		if !cli.Drains(os.Args[1:]) {
			return // it is ending already, with nothing to cut short
		}
		fmt.Fprintf(os.Stderr, "throttle: second %v, exiting without finishing the drain; unacked messages will be redelivered.\n", sig)
		os.Exit(cli.ExitInterrupted)
	}()
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
