package campaign

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Message is the JSON body of a published message; the HTTP sink gets it
// as is.
type Message struct {
	ID    int    `json:"id"`
	To    string `json:"to"`
	From  string `json:"from"`
	Acct  string `json:"acct,omitempty"`
	Class string `json:"class,omitempty"`
}

// Arrival returns the message as an arrival at t.
func (m Message) Arrival(t time.Time) Arrival {
	return Arrival{ID: m.ID, To: m.To, From: m.From, Acct: m.Acct, Class: m.Class, At: t}
}

// ReplicaHeader is the request header in which each replica of a run
// names itself (its number), so that a report can say which replicas sent
// a pair too close.
const ReplicaHeader = "x-campaign-replica"

// Sink is an HTTP sink on a free loopback port that records the time and
// the fields of every message it receives, and answers 200. It is safe for
// concurrent use; Close stops it.
type Sink struct {
	srv *http.Server
	ln  net.Listener

	mu       sync.Mutex
	arrivals []Arrival
	seen     map[int]int
	done     chan struct{}
}

// StartSink starts a sink.
func StartSink() (*Sink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("campaign: sink: %w", err)
	}
	s := &Sink{ln: ln, seen: map[int]int{}, done: make(chan struct{})}
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln)
	}()
	return s, nil
}

func (s *Sink) serve(w http.ResponseWriter, r *http.Request) {
	var m Message
	if err := json.NewDecoder(r.Body).Decode(&m); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	a := m.Arrival(time.Now())
	a.Replica = r.Header.Get(ReplicaHeader)
	s.mu.Lock()
	s.arrivals = append(s.arrivals, a)
	s.seen[m.ID]++
	s.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

// URL is the sink's sink.http.url.
func (s *Sink) URL() string { return "http://" + s.ln.Addr().String() + "/send" }

// Arrivals returns a copy of what the sink received, in arrival order.
func (s *Sink) Arrivals() []Arrival {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Arrival(nil), s.arrivals...)
}

// Counts returns the requests and the distinct messages received so far.
func (s *Sink) Counts() (requests, unique int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.arrivals), len(s.seen)
}

// Seen reports how often message id arrived.
func (s *Sink) Seen(id int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen[id]
}

// Close stops the sink and waits for it.
func (s *Sink) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	<-s.done
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// Stalls measures how late this process's goroutines wake up: the
// overshoot of a 5 ms sleep, which on a loaded machine is how long
// everything stood still, the sink's clock included. It keeps the longest
// and every overshoot of 5 ms or more with its time, so that a bound can
// be widened by the stalls around what it judges only. Stop ends it.
type Stalls struct {
	max     atomic.Int64 // time.Duration
	mu      sync.Mutex
	events  []stall
	stop    chan struct{}
	stopped chan struct{}
}

// stall is one overshoot, ending at Wake.
type stall struct {
	Wake time.Time
	Over time.Duration
}

// MeasureStalls starts measuring until Stop.
func MeasureStalls() *Stalls {
	s := &Stalls{stop: make(chan struct{}), stopped: make(chan struct{})}
	go func() {
		defer close(s.stopped)
		timer := time.NewTimer(5 * time.Millisecond)
		defer timer.Stop()
		for {
			start := time.Now()
			timer.Reset(5 * time.Millisecond)
			select {
			case <-s.stop:
				return
			case <-timer.C:
			}
			now := time.Now()
			late := now.Sub(start) - 5*time.Millisecond
			if late > time.Duration(s.max.Load()) {
				s.max.Store(int64(late))
			}
			if late >= 5*time.Millisecond {
				s.mu.Lock()
				s.events = append(s.events, stall{Wake: now, Over: late})
				s.mu.Unlock()
			}
		}
	}()
	return s
}

// Max returns the longest stall measured so far.
func (s *Stalls) Max() time.Duration { return time.Duration(s.max.Load()) }

// MaxIn returns the longest stall that overlapped [from, to], or 5 ms
// (the least it records) when none did.
func (s *Stalls) MaxIn(from, to time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	longest := 5 * time.Millisecond
	i := sort.Search(len(s.events), func(i int) bool { return !s.events[i].Wake.Before(from) })
	for ; i < len(s.events); i++ {
		e := s.events[i]
		if e.Wake.Add(-e.Over).After(to) {
			break
		}
		longest = max(longest, e.Over)
	}
	return longest
}

// Stop stops measuring and waits for the goroutine. It may be called more
// than once from one goroutine.
func (s *Stalls) Stop() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.stopped
}

// StallLine is the message of the warning a replica logs when its process
// stalled (internal/cli, throttle_process_stall_seconds): the line gives
// the longest stall, the count, and the span from the first one's start to
// the last one's end.
const StallLine = "the process stalled"

// LoggedStalls returns the stalls replicas logged in outputs (their JSON
// logs), for MaxIn: a line stands for a stall of its longest at its end,
// and another at its start when its span is longer. A message granted just
// before a replica's stall goes out that much late, so a pair of a key
// around it may reach the sink closer than the layer's spacing by as much,
// as a late timestamp of the checker's own shortens a gap.
func LoggedStalls(outputs ...string) *Stalls {
	s := &Stalls{}
	for _, out := range outputs {
		for _, line := range strings.Split(out, "\n") {
			if !strings.Contains(line, StallLine) {
				continue
			}
			var rec struct {
				Msg      string
				Longest  string
				From, To time.Time
			}
			if json.Unmarshal([]byte(line), &rec) != nil || !strings.HasPrefix(rec.Msg, StallLine) {
				continue
			}
			d, err := time.ParseDuration(rec.Longest)
			if err != nil {
				continue
			}
			s.events = append(s.events, stall{Wake: rec.To, Over: d})
			if start := rec.From.Add(d); start.Before(rec.To) {
				s.events = append(s.events, stall{Wake: start, Over: d})
			}
			if time.Duration(s.max.Load()) < d {
				s.max.Store(int64(d))
			}
		}
	}
	sort.Slice(s.events, func(i, j int) bool { return s.events[i].Wake.Before(s.events[j].Wake) })
	return s
}

// LongestIn returns a StallIn (Spec) that is the longest of each's MaxIn.
func LongestIn(each ...*Stalls) func(from, to time.Time) time.Duration {
	return func(from, to time.Time) time.Duration {
		var d time.Duration
		for _, s := range each {
			d = max(d, s.MaxIn(from, to))
		}
		return d
	}
}
