package consumertest

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/throttlehq/throttle/internal/testenv"
)

// logs records a consumer's log lines, so that the suite checks that every
// backend writes the same messages with the same keys for the same
// events. It passes them on to the test's log at warn level and above.
type logs struct {
	next slog.Handler

	mu    sync.Mutex
	lines []logLine
}

// logLine is one recorded line: its level, message and keys.
type logLine struct {
	level slog.Level
	msg   string
	keys  []string
}

func (l logLine) String() string {
	return fmt.Sprintf("%s %q %s", l.level, l.msg, strings.Join(l.keys, ","))
}

// newLogs returns the recorder and a logger that writes to it.
func newLogs(t testing.TB) (*logs, *slog.Logger) {
	l := &logs{next: testenv.Logger(t, slog.LevelWarn).Handler()}
	return l, slog.New(logHandler{l: l})
}

// want fails t unless a line with msg was logged at level with every key
// of keys (beside others).
func (l *logs) want(t testing.TB, level slog.Level, msg string, keys ...string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var same []string
	for _, line := range l.lines {
		if line.msg != msg {
			continue
		}
		if line.level == level && !slices.ContainsFunc(keys, func(k string) bool { return !slices.Contains(line.keys, k) }) {
			return
		}
		same = append(same, line.String())
	}
	t.Errorf("no %s line %q with the keys %s; lines with that message: %v", level, msg, strings.Join(keys, ","), same)
}

// logHandler is the slog.Handler of logs, with the attributes of With.
type logHandler struct {
	l     *logs
	attrs []slog.Attr
	next  slog.Handler // l.next with attrs, nil for l.next
}

func (h logHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h logHandler) Handle(ctx context.Context, r slog.Record) error {
	line := logLine{level: r.Level, msg: r.Message}
	for _, a := range h.attrs {
		line.keys = append(line.keys, a.Key)
	}
	r.Attrs(func(a slog.Attr) bool {
		line.keys = append(line.keys, a.Key)
		return true
	})
	h.l.mu.Lock()
	h.l.lines = append(h.l.lines, line)
	h.l.mu.Unlock()
	next := h.next
	if next == nil {
		next = h.l.next
	}
	if next.Enabled(ctx, r.Level) {
		return next.Handle(ctx, r)
	}
	return nil
}

func (h logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	next := h.next
	if next == nil {
		next = h.l.next
	}
	return logHandler{l: h.l, attrs: append(slices.Clip(h.attrs), as...), next: next.WithAttrs(as)}
}

// WithGroup is not used by the backends; the keys stay ungrouped.
func (h logHandler) WithGroup(string) slog.Handler { return h }
