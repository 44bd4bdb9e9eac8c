package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/throttlehq/throttle/integration/campaign"
)

// campaignConfig is the command line of the -campaign mode.
type campaignConfig struct {
	logDir   string        // where each replica's log is written at the end ("": nowhere)
	duration time.Duration // how long the nemesis acts
	seed     int64         // 0: a random seed, printed
	root     string        // the throttle module, to build the binary from
	amqpURL  string
}

// runCampaign runs the seeded fault campaign of integration/campaign (the
// one TestCampaign runs for 40 s) for cfg.duration of faults, printing the
// schedule as it runs and the checker's report, and fails when a promise
// was broken. The same seed and duration rerun the same schedule.
func runCampaign(ctx context.Context, cfg campaignConfig) error {
	if cfg.seed == 0 {
		cfg.seed = rand.Int64N(1 << 40)
	}
	dir, err := os.MkdirTemp("", "throttle-campaign-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintf(os.Stderr, "building the throttle binary from %s\n", cfg.root)
	bin, err := campaign.Build(ctx, cfg.root, dir)
	if err != nil {
		return err
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
	}
	out, err := campaign.Run(ctx, campaign.Config{
		Seed: cfg.seed, Duration: cfg.duration, Bin: bin, AMQPURL: cfg.amqpURL, Dir: dir, Logf: logf, LogDir: cfg.logDir,
	})
	if err != nil {
		return fmt.Errorf("seed %d: the campaign could not run: %w", cfg.seed, err)
	}
	fmt.Printf("campaign seed %d: %v of faults scheduled (%d steps), %v with a fault in force, %d messages, %v in all: ",
		out.Seed, cfg.duration, len(out.Schedule), out.FaultTime.Round(time.Second), out.Published, out.Took.Round(time.Second))
	if out.OK() {
		fmt.Println("every promise kept")
		return nil
	}
	fmt.Printf("%d promises broken\n  %s\nrerun: go run . -campaign %v -seed %d\n", len(out.Violations), strings.Join(out.Violations, "\n  "), cfg.duration, out.Seed)
	return fmt.Errorf("seed %d broke %d promises", out.Seed, len(out.Violations))
}
