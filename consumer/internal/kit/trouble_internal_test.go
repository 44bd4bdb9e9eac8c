package kit

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/testenv"
)

// TestTroubleLog steps the failure log through an outage at fixed instants:
// the first failure is reported at once, then at most one line per 10 s
// with the count since the previous line, and one line on recovery.
func TestTroubleLog(t *testing.T) {
	var buf testenv.Buffer
	l := newTroubleLog(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{ReplaceAttr: dropTime})))
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var now time.Time
	l.now = func() time.Time { return now }
	e503 := errors.New("503 Service Unavailable")
	steps := []struct {
		at     time.Duration
		fail   bool
		expect string // the line logged at this step, or ""
	}{
		{0, false, ""}, // healthy: nothing
		{1 * time.Second, true, `msg="sink failing: 503 Service Unavailable, retrying" failures=1 window=0s err="503 Service Unavailable"`},
		{2 * time.Second, true, ""},
		{5 * time.Second, true, ""},
		{10 * time.Second, true, ""},
		{11 * time.Second, true, `msg="sink failing: 503 Service Unavailable ×4 in the last 9s, retrying" failures=4 window=9s`},
		{15 * time.Second, true, ""},
		{21 * time.Second, false, `msg="sink recovered after 20s" failures=6 outage=20s`},
		{22 * time.Second, false, ""}, // still healthy: nothing
		// A flapping sink: at most one failing line per 10 s.
		{23 * time.Second, true, `msg="sink failing: 503 Service Unavailable, retrying" failures=1`},
		{24 * time.Second, false, `msg="sink recovered after 1s"`},
		{25 * time.Second, true, ""},
		{26 * time.Second, false, ""},
		{27 * time.Second, true, ""},
		{33 * time.Second, true, `msg="sink failing: 503 Service Unavailable ×3 in the last 8s, retrying" failures=3`},
	}
	for i, s := range steps {
		now = t0.Add(s.at)
		before := buf.String()
		if s.fail {
			l.failed(e503)
		} else {
			l.delivered()
		}
		line := strings.TrimPrefix(buf.String(), before)
		if s.expect == "" {
			if line != "" {
				t.Fatalf("step %d (t=%v): logged %q, want nothing", i, s.at, line)
			}
			continue
		}
		if !strings.Contains(line, s.expect) || strings.Count(line, "\n") != 1 || !strings.Contains(line, "level=INFO") {
			t.Fatalf("step %d (t=%v): logged %q, want one info line with %q", i, s.at, line, s.expect)
		}
	}
}

func dropTime(_ []string, a slog.Attr) slog.Attr {
	if a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}
