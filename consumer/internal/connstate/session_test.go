package connstate

import (
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/internal/testenv"
)

// TestStateEvents steps a State through a start that fails once, a lost
// session, two failed attempts and the reconnect, and checks Connected,
// the observer's events and the log lines at each step.
func TestStateEvents(t *testing.T) {
	var (
		mu     sync.Mutex
		events []string
	)
	record := func(kind string) func(string, error) {
		return func(broker string, err error) {
			mu.Lock()
			defer mu.Unlock()
			e := kind + " " + broker
			if err != nil {
				e += ": " + err.Error()
			}
			events = append(events, e)
		}
	}
	obs := &consumer.MessageObserver{
		ReconnectAttempt: record("attempt"),
		Reconnected:      record("reconnected"),
		Disconnected:     record("disconnected"),
	}
	var buf testenv.Buffer
	s := New("b", obs, slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	refused := errors.New("refused")
	down := errors.New("down")
	steps := []struct {
		name      string
		do        func()
		connected bool
		events    []string
		log       string // a substring of the last log line; "" for none new
	}{
		{"before Run", func() {}, false, nil, ""},
		{"first attempt fails", func() { s.Attempted(refused); s.Retry(t.Context(), refused, 0, true) }, false, nil, `level=ERROR msg="connect failed; retrying" attempt=1 retry_in=0s err=refused`},
		{"second attempt connects", func() { s.Attempted(nil); s.Up(slog.String("queue", "q")) }, true, []string{"attempt b"}, `level=INFO msg=connected queue=q`},
		{"up again: a rebalance", func() { s.Attempted(nil); s.Up() }, true, nil, ""},
		{"session lost", func() { s.Lost(down, 0) }, false, []string{"disconnected b: down"}, `level=WARN msg="connection lost; reconnecting" retry_in=0s err=down`},
		{"attempt fails", func() { s.Attempted(down); s.Retry(t.Context(), down, 0, false) }, false, []string{"attempt b: down"}, `level=WARN msg="connect failed; retrying" attempt=2`},
		{"reconnects", func() { s.Attempted(nil); s.Up() }, true, []string{"attempt b", "reconnected b: down"}, `level=INFO msg=reconnected attempts=2 cause=down`},
		{"Run returns", func() { s.Stopped() }, false, nil, ""},
	}
	for _, st := range steps {
		mu.Lock()
		events = nil
		mu.Unlock()
		before := buf.String()
		st.do()
		err := s.Connected()
		if (err == nil) != st.connected {
			t.Fatalf("%s: Connected() = %v, want connected %v", st.name, err, st.connected)
		}
		if err != nil && !errors.Is(err, consumer.ErrNotConnected) {
			t.Errorf("%s: Connected() = %v, want it to wrap consumer.ErrNotConnected", st.name, err)
		}
		mu.Lock()
		got := strings.Join(events, "|")
		mu.Unlock()
		if want := strings.Join(st.events, "|"); got != want {
			t.Errorf("%s: events %q, want %q", st.name, got, want)
		}
		added := strings.TrimPrefix(buf.String(), before)
		if st.log == "" && added != "" || !strings.Contains(added, st.log) {
			t.Errorf("%s: logged %q, want a line with %q", st.name, added, st.log)
		}
	}
	if err := s.Connected(); err == nil || !strings.Contains(err.Error(), "Run returned") {
		t.Errorf("after Stopped, Connected() = %v, want Run returned", err)
	}
}
