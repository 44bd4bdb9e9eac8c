package cli

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/throttlehq/throttle/config"
	"github.com/throttlehq/throttle/consumer/kafka"
	"github.com/throttlehq/throttle/limiter"
)

// logReplaceAttr writes durations as text ("1.5s"), in JSON as in the text
// format, instead of integer nanoseconds. Every logger of the binary uses
// it (newLogger).
func logReplaceAttr(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// drainTimeout is how long the consumer drains: delivery.drain_timeout, or
// the consumer's default when it is not set (the same for both backends).
func drainTimeout(cfg *config.Config) time.Duration {
	if d := time.Duration(cfg.Delivery.DrainTimeout); d > 0 {
		return d
	}
	return kafka.DefaultDrainTimeout
}

// pauseLogEvery is the most often a replica logs a push-back pause.
var pauseLogEvery = 5 * time.Second // a variable for tests

// pauseReporter logs push-back pauses of the shared bucket at info, at most
// once per every, counting the ones it leaves out: "bucket paused 3s by
// push-back from replica r2", on every replica (the limiter reports its
// own pauses and those it hears of, with the pausing replica's id). It is
// safe for concurrent use.
type pauseReporter struct {
	log   *slog.Logger
	every time.Duration

	mu      sync.Mutex
	last    time.Time // when a line was last logged
	skipped int       // pauses not logged since
}

func newPauseReporter(log *slog.Logger, every time.Duration) *pauseReporter {
	return &pauseReporter{log: log, every: every}
}

// observe returns obs with a Paused hook that reports to r.
func (r *pauseReporter) observe(obs *limiter.Observer) *limiter.Observer {
	o := *obs
	paused := o.Paused
	o.Paused = func(d time.Duration, by string) {
		if paused != nil {
			paused(d, by)
		}
		who := "another replica" // a store that does not record who paused
		if by != "" {
			who = "replica " + by
		}
		r.report(d, who)
	}
	return &o
}

// report logs a pause of d, unless one was logged less than every ago.
func (r *pauseReporter) report(d time.Duration, by string) {
	r.mu.Lock()
	now := time.Now()
	if !r.last.IsZero() && now.Sub(r.last) < r.every {
		r.skipped++
		r.mu.Unlock()
		return
	}
	skipped := r.skipped
	r.last, r.skipped = now, 0
	r.mu.Unlock()
	attrs := []any{"pause", d}
	if skipped > 0 {
		attrs = append(attrs, "pauses_not_logged", skipped)
	}
	r.log.Info(fmt.Sprintf("bucket paused %v by push-back from %s", roundDuration(d.Seconds()), by), attrs...)
}
