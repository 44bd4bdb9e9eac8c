package topk

import (
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestWindowSteps(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w := NewWindow(time.Minute, 6, 3) // slots of 10 s, 3 keys each
	steps := []struct {
		at    time.Duration
		key   string
		n     int64
		top   []Entry
		total int64
	}{
		{0, "a", 5, []Entry{{"a", 5}}, 5},
		{time.Second, "b", 2, []Entry{{"a", 5}, {"b", 2}}, 7},
		{2 * time.Second, "c", 2, []Entry{{"a", 5}, {"b", 2}, {"c", 2}}, 9},
		// Full: d takes the place of the smallest (b, ties by key) with
		// its count plus its own.
		{3 * time.Second, "d", 1, []Entry{{"a", 5}, {"d", 3}, {"c", 2}}, 10},
		// Another slot: its own 3 keys; sums over the window.
		{15 * time.Second, "b", 4, []Entry{{"a", 5}, {"b", 4}, {"d", 3}}, 14},
		// 60 s after the first slot began, that slot is dropped.
		{60 * time.Second, "e", 1, []Entry{{"b", 4}, {"e", 1}}, 5},
		// Over a whole window later, everything is dropped.
		{200 * time.Second, "f", 1, []Entry{{"f", 1}}, 1},
	}
	for i, st := range steps {
		now := t0.Add(st.at)
		w.Add(now, st.key, st.n)
		top, total := w.Top(now, 3)
		if !reflect.DeepEqual(top, st.top) || total != st.total {
			t.Fatalf("step %d (%v): Top = %v, total %d; want %v, total %d", i, st.at, top, total, st.top, st.total)
		}
	}
	if top, total := w.Top(t0.Add(300*time.Second), 3); top != nil || total != 0 {
		t.Fatalf("a minute after the last Add: Top = %v, %d; want none", top, total)
	}
}

// TestWindowHeavyKeyKept checks the algorithm's promise: a key counted more
// than total/capacity is kept, whatever the others.
func TestWindowHeavyKeyKept(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w := NewWindow(time.Minute, 1, 8)
	for i := range 1000 {
		w.Add(t0, "k"+strings.Repeat("x", i%97)+string(rune('a'+i%26)), 1)
		if i%5 == 0 {
			w.Add(t0, "heavy", 1)
		}
	}
	top, total := w.Top(t0, 1)
	if len(top) != 1 || top[0].Key != "heavy" || top[0].Count < 200 {
		t.Fatalf("Top = %v (total %d), want heavy with at least its 200", top, total)
	}
}

func TestMerge(t *testing.T) {
	got := Merge([]map[string]int64{{"a": 3, "b": 1}, {"b": 4, "c": 2}, nil}, 2)
	if want := []Entry{{"b", 5}, {"a", 3}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("Merge = %v, want %v", got, want)
	}
	if got := Of(map[string]int{"a": 1}, 0); got != nil {
		t.Fatalf("Of(_, 0) = %v, want none", got)
	}
}

func TestClip(t *testing.T) {
	if got := Clip("+33612345678"); got != "+33612345678" {
		t.Fatalf("Clip of a short key = %q", got)
	}
	long := strings.Repeat("é", 100) // 200 bytes
	got := Clip(long)
	if len(got) > MaxKey || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") {
		t.Fatalf("Clip = %q (%d bytes), want at most %d valid bytes ending in …", got, len(got), MaxKey)
	}
}
