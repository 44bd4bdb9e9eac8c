package main

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestSink(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	tests := []struct {
		name     string
		limit    int
		requests []time.Duration // offsets from start of the POSTs
		want     []int           // status of each
	}{
		{"no limit", 0, []time.Duration{0, 0, 0}, []int{202, 202, 202}},
		{"over the limit in one second", 2, []time.Duration{0, 100 * time.Millisecond, 900 * time.Millisecond}, []int{202, 202, 429}},
		{"limit resets each second", 1, []time.Duration{0, 500 * time.Millisecond, time.Second}, []int{202, 429, 202}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var now time.Time
			var logs bytes.Buffer
			s := newSink(slog.New(slog.NewTextHandler(&logs, nil)), tt.limit, true, func() time.Time { return now })
			for i, off := range tt.requests {
				now = start.Add(off)
				rec := httptest.NewRecorder()
				s.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/sms", strings.NewReader(`{"to":"+1555"}`)))
				if rec.Code != tt.want[i] {
					t.Errorf("request %d: status %d, want %d", i, rec.Code, tt.want[i])
				}
				if rec.Code == http.StatusTooManyRequests && rec.Header().Get("Retry-After") != "1" {
					t.Errorf("request %d: 429 without Retry-After: 1", i)
				}
			}
			accepted := 0
			for _, c := range tt.want {
				if c == 202 {
					accepted++
				}
			}
			if got := strings.Count(logs.String(), `body="{\"to\":\"+1555\"}"`); got != accepted {
				t.Errorf("logged %d bodies, want %d:\n%s", got, accepted, logs.String())
			}
		})
	}
}

func TestHealthz(t *testing.T) {
	s := newSink(slog.New(slog.DiscardHandler), 1, true, time.Now)
	for range 3 { // health probes never count against the limit
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("GET /healthz: status %d", rec.Code)
		}
	}
	srv := httptest.NewServer(s)
	defer srv.Close()
	if err := probe(srv.URL+"/healthz", time.Second); err != nil {
		t.Errorf("probe /healthz: %v", err)
	}
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer down.Close()
	if err := probe(down.URL+"/healthz", time.Second); err == nil {
		t.Error("probe of a server answering 503 succeeded")
	}
}

func TestReportRate(t *testing.T) {
	var logs bytes.Buffer
	s := newSink(slog.New(slog.NewTextHandler(&logs, nil)), 0, false, time.Now)
	tick := make(chan time.Time)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.reportRate(ctx, tick) }()

	for range 3 {
		s.admit()
	}
	tick <- time.Now() // 3 received
	tick <- time.Now() // 0 received, logged once to show the rate dropped
	tick <- time.Now() // idle again: not logged
	cancel()
	<-done

	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d rate lines, want 2:\n%s", len(lines), logs.String())
	}
	for i, want := range []string{"received_per_second=3 rejected_per_second=0 total=3", "received_per_second=0 rejected_per_second=0 total=3"} {
		if !strings.Contains(lines[i], want) {
			t.Errorf("line %d = %q, want it to contain %q", i, lines[i], want)
		}
	}
}
