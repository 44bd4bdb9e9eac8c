package cli

import (
	"context"
	"encoding/json"
	"log/slog"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/throttlehq/throttle/internal/testenv"
)

// TestStallLogSteps: stalls below stallLogged are not logged; the first
// one is logged at once, the next ones at most once per stallLogEvery,
// each line with the longest and the count since the line before.
func TestStallLogSteps(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 13, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	type step struct {
		from, to int // a stall, in ms after t0; from == to for none
		flushAt  int
		want     []any // the line's attributes, nil for no line
	}
	steps := []step{
		{0, 30, 30, nil}, // shorter than stallLogged
		{100, 180, 180, []any{"longest", 80 * time.Millisecond, "stalls", 1, "from", at(100), "to", at(180)}},
		{300, 360, 360, nil},    // within a second of the last line: kept
		{500, 650, 650, nil},    // kept
		{1000, 1000, 1000, nil}, // nothing new, still within the second
		{1190, 1190, 1190, []any{"longest", 150 * time.Millisecond, "stalls", 2, "from", at(300), "to", at(650)}},
		{1300, 1300, 5000, nil}, // nothing to log
		{5000, 5400, 5400, []any{"longest", 400 * time.Millisecond, "stalls", 1, "from", at(5000), "to", at(5400)}},
	}
	var s stallLog
	for i, st := range steps {
		s.add(at(st.from), at(st.to))
		got, ok := s.flush(at(st.flushAt))
		if ok != (st.want != nil) || !reflect.DeepEqual(got, st.want) {
			t.Errorf("step %d (stall %d-%d ms, flush at %d ms): line %v (%v), want %v", i, st.from, st.to, st.flushAt, got, ok, st.want)
		}
	}
}

// TestWatchStallsLogsAStall: a clock that jumps 80 ms between two ticks is
// a stall of about 80 ms: one warning with it, and one histogram sample.
func TestWatchStallsLogsAStall(t *testing.T) {
	var buf testenv.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{ReplaceAttr: logReplaceAttr}))
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h", Buckets: []float64{0.01, 0.05, 0.1}})
	var calls atomic.Int64
	clock := func() time.Time {
		if calls.Add(1) > 5 { // from the end of the third tick on
			return time.Now().Add(80 * time.Millisecond)
		}
		return time.Now()
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		watchStalls(ctx, log, h, clock)
	}()
	testenv.Eventually(t, 10*time.Second, "a stall logged", func() bool { return strings.Contains(buf.String(), "the process stalled") })
	cancel()
	<-done
	var rec struct {
		Level   string `json:"level"`
		Longest string `json:"longest"`
		Stalls  int    `json:"stalls"`
	}
	line, _, _ := strings.Cut(buf.String(), "\n")
	if err := json.Unmarshal([]byte(line), &rec); err != nil {
		t.Fatalf("%v: %q", err, line)
	}
	d, err := time.ParseDuration(rec.Longest)
	if rec.Level != "WARN" || rec.Stalls != 1 || err != nil || d < 80*time.Millisecond || d > time.Second {
		t.Fatalf("logged %+v, want one WARN stall of 80 ms or a little more", rec)
	}
	if n := testutil.CollectAndCount(h); n != 1 {
		t.Fatalf("histogram series = %d, want 1", n)
	}
	if got := sampleCount(t, h); got != 1 {
		t.Fatalf("histogram samples = %d, want 1 (the one stall)", got)
	}
}

// sampleCount returns how many samples h holds.
func sampleCount(t *testing.T, h prometheus.Histogram) uint64 {
	t.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}
