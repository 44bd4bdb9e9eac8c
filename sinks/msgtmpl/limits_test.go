package msgtmpl

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
)

// TestRenderLimits: an execution stops at MaxSteps loop iterations and
// template calls, at MaxDepth nested template calls and at the output
// limit, with ErrLimit saying which; within them it renders. The clock
// stands still, so that MaxTime (a loaded machine, -race) stops none of
// them first.
func TestRenderLimits(t *testing.T) {
	frozen := time.Unix(1_700_000_000, 0)
	now = func() time.Time { return frozen }
	defer func() { now = time.Now }()
	deep := strings.Repeat("x", MaxDepth+10)
	tests := []struct {
		name, text, body string
		wantErr          string // "" means success
	}{
		{"a long loop", `{{range 64000000}}{{end}}`, ``, "100000 loop iterations and template calls"},
		{"nested loops", `{{range 1000}}{{range 1000}}{{end}}{{end}}`, ``, "loop iterations"},
		{"loops at the limit", `{{range 999}}{{range 99}}{{end}}{{end}}`, ``, ""},
		{"exponential calls", `{{define "r"}}{{if .}}{{template "r" (slice . 1)}}{{template "r" (slice . 1)}}{{end}}{{end}}{{template "r" .Body}}`, strings.Repeat("x", 40), "loop iterations and template calls"},
		{"deep calls", `{{define "r"}}{{if .}}{{template "r" (slice . 1)}}{{end}}{{end}}{{template "r" .Body}}`, deep, "nested template calls"},
		{"calls within the depth", `{{define "r"}}{{if .}}{{template "r" (slice . 1)}}{{end}}{{end}}{{template "r" .Body}}`, deep[:MaxDepth-5], ""},
		{"a large output", `{{range 100}}{{printf "%1000000d" 1}}{{end}}`, ``, "bytes of output"},
	}
	for _, tt := range tests {
		tmpl, err := Parse("limit.cost_template", tt.text)
		if err != nil {
			t.Fatalf("%s: Parse: %v", tt.name, err)
		}
		start := time.Now()
		_, err = Render(tmpl, NewData(consumer.Message{Body: []byte(tt.body)}))
		took := time.Since(start)
		t.Logf("%s: %v in %v", tt.name, err, took)
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case tt.wantErr != "" && (err == nil || !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%s: err = %v, want ErrLimit containing %q", tt.name, err, tt.wantErr)
		case tt.wantErr != "" && !strings.Contains(err.Error(), "limit.cost_template"):
			t.Errorf("%s: error %q does not name the template", tt.name, err)
		}
	}
}

// TestRenderTimeLimit: an execution whose steps take long stops at
// MaxTime, by the clock read at each step and write. The clock here
// advances 10ms at each reading.
func TestRenderTimeLimit(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	var reads int
	now = func() time.Time {
		reads++
		return base.Add(time.Duration(reads) * 10 * time.Millisecond)
	}
	defer func() { now = time.Now }()
	tmpl, err := Parse("key", `{{range 1000}}{{end}}`)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Render(tmpl, NewData(consumer.Message{}))
	if !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), "250ms") {
		t.Fatalf("err = %v, want ErrLimit naming 250ms", err)
	}
	// The first reading sets the deadline; the step that reads 260ms
	// after it is the one that stops; every run is stopped so.
	if want := MaxTimeRuns * (int(MaxTime/(10*time.Millisecond)) + 2); reads != want {
		t.Errorf("the clock was read %d times, want %d", reads, want)
	}
}

// TestRenderStarvedRunsAgain: a key template of microseconds whose
// process was starved of CPU past MaxTime (the clock jumps 300 ms during
// its first run) runs again and renders. Under load 35 such a template
// used to dead-letter a valid message ("ran for more than 250ms").
func TestRenderStarvedRunsAgain(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	var reads int
	now = func() time.Time {
		reads++
		if reads >= 2 && reads <= 3 { // the first run's step: starved
			return base.Add(300 * time.Millisecond)
		}
		return base.Add(time.Duration(reads) * time.Microsecond)
	}
	defer func() { now = time.Now }()
	tmpl, err := Parse("key", `{{.JSON.to}}`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := Render(tmpl, NewData(consumer.Message{Body: []byte(`{"to":"+12125550100"}`)}))
	if err != nil || string(out) != "+12125550100" {
		t.Fatalf("Render = %q, %v; want the key, run again after a starved first run", out, err)
	}
}

// TestCostFuncLongLoop: a cost template with a 64M-step loop fails the
// message permanently at the step limit instead of running on. The clock
// stands still, so that MaxTime does not stop it first on a loaded
// machine; 100k empty iterations took 8ms on the 2-core machine (1.5s
// for 64M before the limit).
func TestCostFuncLongLoop(t *testing.T) {
	frozen := time.Unix(1_700_000_000, 0)
	now = func() time.Time { return frozen }
	defer func() { now = time.Now }()
	cost, err := CostFunc("limit.cost_template", `{{range 64000000}}{{end}}1`)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = cost(consumer.Message{Body: []byte(`{}`)})
	t.Logf("%v in %v", err, time.Since(start))
	if !consumer.IsPermanent(err) || !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), "more than 100000 loop iterations") {
		t.Fatalf("err = %v, want a permanent ErrLimit at the step limit", err)
	}
}

// BenchmarkRenderKey renders a per-recipient key template, as a keyed
// layer does for every message.
func BenchmarkRenderKey(b *testing.B) {
	tmpl, err := Parse("limit.extra[0].key", `{{.JSON.to}}`)
	if err != nil {
		b.Fatal(err)
	}
	msg := consumer.Message{Body: []byte(`{"to":"+15550100","text":"Your code is 123456"}`)}
	for b.Loop() {
		if _, err := Render(tmpl, NewData(msg)); err != nil {
			b.Fatal(err)
		}
	}
}
