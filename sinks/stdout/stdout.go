package stdout

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/sinks/internal/msgjson"
	"github.com/throttlehq/throttle/sinks/internal/sinktrace"
)

// Sink writes messages as JSON lines. It is safe for concurrent use: each
// line is written with a single Write call under a mutex, so lines never
// interleave.
type Sink struct {
	mu sync.Mutex
	w  io.Writer
}

// New returns a Sink that writes to w, or to os.Stdout when w is nil.
func New(w io.Writer) *Sink {
	if w == nil {
		w = os.Stdout
	}
	return &Sink{w: w}
}

type line struct {
	Key     string            `json:"key"`
	Body    any               `json:"body"`
	Headers map[string]string `json:"headers"`
	Source  msgjson.Source    `json:"source"`
	Attempt int               `json:"attempt"`
}

// Send writes msg as one line. A failed write is retryable; a message that
// cannot be encoded is permanent. Send does not block on ctx other than
// checking it first, since a write cannot be interrupted.
//
// When ctx carries a span that records (a consumer's), the write is a
// client span, "write stdout".
func (s *Sink) Send(ctx context.Context, msg consumer.Message) (err error) {
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, span := sinktrace.Start(ctx, "write stdout", nil); span != nil {
		defer func() { sinktrace.End(span, err) }()
	}
	l := line{
		Key:     string(msg.Key),
		Body:    string(msg.Body),
		Headers: msg.Headers,
		Source:  msgjson.FromSource(msg.Source),
		Attempt: msg.Attempt,
	}
	if msgjson.IsJSON(msg.Body) {
		l.Body = json.RawMessage(msg.Body)
	}
	if l.Headers == nil {
		l.Headers = map[string]string{}
	}
	b, err := json.Marshal(l)
	if err != nil {
		return consumer.Permanent(fmt.Errorf("encoding message: %w", err))
	}
	b = append(b, '\n')

	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.w.Write(b); err != nil {
		return fmt.Errorf("writing message: %w", err)
	}
	return nil
}
