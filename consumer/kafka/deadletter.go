package kafka

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/throttlehq/throttle/consumer/internal/kit"
)

// messageWriter is what the dead-letterer needs from a kafka-go Writer.
type messageWriter interface {
	WriteMessages(ctx context.Context, msgs ...kafkago.Message) error
}

// deadLetterer writes messages that leave the topic to another topic: the
// failed ones to the dead-letter topic, or, with delay set, the ones set
// aside to the delay topic. It is safe for concurrent use when its writer
// is.
type deadLetterer struct {
	w     messageWriter
	topic string
	log   *slog.Logger
	// delay is set for the delay topic's writer; it names the topic so in
	// logs and errors.
	delay bool
}

// send writes m with its original key, value and headers plus the headers
// dlh, which replace original headers of the same name. The writer waits
// for every in-sync replica (RequireAll). It retries with backoff until
// the write succeeds or ctx ends, because a message that is neither
// delivered nor written elsewhere must not be committed.
func (d *deadLetterer) send(ctx context.Context, m kafkago.Message, dlh map[string]string) error {
	dm := kafkago.Message{Key: m.Key, Value: m.Value, Headers: deadLetterHeaders(m.Headers, dlh)}
	what := "dead-letter"
	if d.delay {
		what = "delay"
	}
	for attempt := 1; ; attempt++ {
		err := d.w.WriteMessages(ctx, dm)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("writing to %s topic %q: %w", what, d.topic, err)
		}
		delay := backoff.Delay(attempt - 1)
		d.log.Warn(kit.LogWriteRetry, "topic", m.Topic, "partition", m.Partition, "offset", m.Offset,
			kit.KeyDestination, d.topic, "attempt", attempt, "retry_in", delay.String(), "err", err)
		if err := kit.Sleep(ctx, delay); err != nil {
			return fmt.Errorf("writing to %s topic %q: %w", what, d.topic, err)
		}
	}
}

// positionAttrs are the log attributes of m's position, and of dest, the
// topic it was written to.
func positionAttrs(m kafkago.Message, dest string) []slog.Attr {
	return []slog.Attr{slog.String("topic", m.Topic), slog.Int("partition", m.Partition), slog.Int64("offset", m.Offset),
		slog.String(kit.KeyDestination, dest)}
}

// deadLetterHeaders returns orig without the names in dlh, followed by dlh
// sorted by name, less those whose value is empty: an empty value removes
// the header (kit.Outcome.SetAsideHeaders).
func deadLetterHeaders(orig []kafkago.Header, dlh map[string]string) []kafkago.Header {
	out := make([]kafkago.Header, 0, len(orig)+len(dlh))
	for _, h := range orig {
		if _, ok := dlh[h.Key]; !ok {
			out = append(out, h)
		}
	}
	names := make([]string, 0, len(dlh))
	for k, v := range dlh {
		if v != "" {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	for _, k := range names {
		out = append(out, kafkago.Header{Key: k, Value: []byte(dlh[k])})
	}
	return out
}
