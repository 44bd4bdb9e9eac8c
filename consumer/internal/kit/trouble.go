package kit

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// troubleInterval is the least time between two "sink failing" lines.
const troubleInterval = 10 * time.Second

// troubleLog turns a stream of failed handler attempts into info lines at a
// bounded rate: while the sink fails, at most one "sink failing" line per
// troubleInterval, counting the failures since the previous line; when a
// message is delivered again after such a line, one "sink recovered" line.
// So an outage of any length costs at most one line per interval plus one,
// and a sink that flaps between success and failure costs at most two lines
// per interval. Permanent errors are not counted: they are the message's
// fault, and the dead-letter log names each of them.
//
// It is safe for concurrent use.
type troubleLog struct {
	log *slog.Logger
	now func() time.Time

	// reported mirrors failing for delivered, which reads it without
	// the lock: every delivered message comes by, while failing is set
	// only after a failure. Written under mu.
	reported atomic.Bool

	mu       sync.Mutex
	failing  bool      // a "sink failing" line was logged and no delivery followed
	since    time.Time // first failure of the episode
	lastLine time.Time // last "sink failing" line
	first    time.Time // first failure not yet reported; zero if none
	n        int       // failures not yet reported
	total    int       // failures in the episode
	lastErr  string
}

func newTroubleLog(log *slog.Logger) *troubleLog {
	return &troubleLog{log: log, now: time.Now}
}

// failed records a failed attempt of a message that will be retried or has
// run out of attempts.
func (l *troubleLog) failed(err error) {
	l.mu.Lock()
	now := l.now()
	if l.n == 0 {
		l.first = now
	}
	if !l.failing && l.total == 0 {
		l.since = now
	}
	l.n++
	l.total++
	l.lastErr = err.Error()
	if !l.lastLine.IsZero() && now.Sub(l.lastLine) < troubleInterval {
		l.mu.Unlock()
		return
	}
	n, window, errText := l.n, now.Sub(l.first), l.lastErr
	l.failing, l.lastLine, l.n = true, now, 0
	l.reported.Store(true)
	l.mu.Unlock()

	msg := "sink failing: " + errText + ", retrying"
	if n > 1 {
		msg = fmt.Sprintf("sink failing: %s ×%d in the last %s, retrying", errText, n, roundDuration(window))
	}
	l.log.LogAttrs(context.Background(), slog.LevelInfo, msg,
		slog.Int("failures", n), slog.String("window", roundDuration(window).String()), slog.String("err", errText))
}

// delivered records a delivered message.
func (l *troubleLog) delivered() {
	if !l.reported.Load() {
		// Nothing to recover from: no line was logged since the last
		// recovery. Failures not reported yet stay counted for the next
		// line.
		return
	}
	l.mu.Lock()
	if !l.failing {
		l.mu.Unlock()
		return
	}
	total, d := l.total, l.now().Sub(l.since)
	l.failing, l.total, l.n = false, 0, 0
	l.reported.Store(false)
	l.mu.Unlock()
	l.log.LogAttrs(context.Background(), slog.LevelInfo, "sink recovered after "+roundDuration(d).String(),
		slog.Int("failures", total), slog.String("outage", roundDuration(d).String()))
}

// roundDuration rounds d for a log line: to the second from 10s, to the
// 100ms from 1s, to the millisecond below.
func roundDuration(d time.Duration) time.Duration {
	switch {
	case d >= 10*time.Second:
		return d.Round(time.Second)
	case d >= time.Second:
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}
