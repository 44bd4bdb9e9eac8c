package redislimiter

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

// watchedStore drives a Store at explicit instants and reads the pushes its
// Watch hears.
type watchedStore struct {
	clocked
	c      redis.UniversalClient
	marks  chan int // the marks heard
	sent   int      // the last mark announced
	mu     sync.Mutex
	pushes []backend.Push
}

// mark announces a mark, an announcement only the test makes: a push whose
// counter is minus its number. Watch delivers it in order with the take
// scripts' pushes.
func (w *watchedStore) mark() int {
	w.sent++
	w.c.Publish(context.Background(), w.s.channel, fmt.Sprintf("push 1 0 1:%d", -1000*w.sent))
	return w.sent
}

// heard waits up to d for mark n, and reports whether it came.
func (w *watchedStore) heard(n int, d time.Duration) bool {
	timeout := time.After(d)
	for {
		select {
		case m := <-w.marks:
			if m == n {
				return true
			}
		case <-timeout:
			return false
		}
	}
}

// watchStore watches s until the test ends, and returns once the
// subscription is in place.
func watchStore(t *testing.T, c redis.UniversalClient, s *Store) *watchedStore {
	t.Helper()
	w := &watchedStore{clocked: clocked{s}, c: c, marks: make(chan int, 1000)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		s.Watch(ctx, func() {}, func(p backend.Push) {
			if p.Counter < 0 {
				w.marks <- int(-p.Counter)
				return
			}
			w.mu.Lock()
			w.pushes = append(w.pushes, p)
			w.mu.Unlock()
		})
	}()
	// Announce marks until the subscription hears one.
	testenv.Eventually(t, 5*time.Second, "the watch subscribed", func() bool { return w.heard(w.mark(), 10*time.Millisecond) })
	return w
}

// Pushes implements storetest.PriorityStore. It announces a mark after the
// takes and waits until Watch hears it: the pushes the takes announced
// before it have then been heard too.
func (w *watchedStore) Pushes(t *testing.T) []backend.Push {
	t.Helper()
	if !w.heard(w.mark(), 5*time.Second) {
		t.Fatal("the watch did not hear the test's mark")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.pushes
	w.pushes = nil
	return out
}

func (w *watchedStore) RefundClassAt(now time.Time, tokens int, class limiter.Priority) error {
	return w.s.refund(context.Background(), now.UnixMicro(), tokens, class, false)
}

func TestRedisPrioritySteps(t *testing.T) {
	c := newClient(t)
	storetest.RunPriority(t, func(t *testing.T, rate float64, burst int) storetest.PriorityStore {
		s, err := New(c, Config{Bucket: uniqueBucket(t, c), Rate: rate, Burst: burst})
		if err != nil {
			t.Fatal(err)
		}
		return watchStore(t, c, s)
	})
}

// clockedPriorityLayers also takes from the shared bucket alone.
type clockedPriorityLayers struct{ clockedLayers }

func (c clockedPriorityLayers) TakeAt(now time.Time, req backend.TakeRequest) (backend.TakeResult, error) {
	return c.l.take(context.Background(), now.UnixMicro(), req)
}

func TestRedisLayerPrioritySteps(t *testing.T) {
	c := newClient(t)
	storetest.RunPriorityLayers(t, func(t *testing.T, rate float64, burst int, layers []limiter.Layer) storetest.LayeredClockedStore {
		return clockedPriorityLayers{clockedLayers{newLayered(t, c, rate, burst, layers)}}
	})
}

// The push announcement is "push NOW_US TOKENS_MILLI RANK:COUNTER_MILLI...";
// every other announcement is a change.
func TestParsePush(t *testing.T) {
	at := time.UnixMicro(1764560000123456)
	for _, tc := range []struct {
		in   string
		want []backend.Push
	}{
		{"push 1764560000123456 1500 2:3000", []backend.Push{{Class: limiter.PriorityLow, Tokens: 1.5, Counter: 3, At: at}}},
		{"push 1764560000123456 1000 1:1000 2:2500", []backend.Push{
			{Class: limiter.PriorityNormal, Tokens: 1, Counter: 1, At: at},
			{Class: limiter.PriorityLow, Tokens: 1, Counter: 2.5, At: at},
		}},
		{"push 1764560000123456 1000", nil},
		{"push 1764560000123456 1000 0:1000", nil},
		{"push 1764560000123456 1000 3:1000", nil},
		{"push x 1000 1:1000", nil},
		{"push 1 1000 1-1000", nil},
		{"pause", nil},
	} {
		got := parsePush(tc.in)
		if len(got) != len(tc.want) {
			t.Errorf("parsePush(%q) = %+v, want %+v", tc.in, got, tc.want)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("parsePush(%q) = %+v, want %+v", tc.in, got, tc.want)
			}
		}
	}
}

// A bucket used by the default class alone, reserving ahead or not, keeps
// no class field: the state hash holds only tokens and ts, as without
// classes. A low reservation adds its queue.
func TestDefaultClassWritesNoClassField(t *testing.T) {
	c := newClient(t)
	s, err := New(c, Config{Bucket: uniqueBucket(t, c), Rate: 10, Burst: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	fields := func() []string {
		t.Helper()
		keys, err := c.HKeys(ctx, s.stateKeys[0]).Result()
		if err != nil {
			t.Fatal(err)
		}
		// Not a class field: the key's recorded expiry (save).
		keys = slices.DeleteFunc(keys, func(k string) bool { return k == "x" })
		slices.Sort(keys)
		return keys
	}
	for i := range 4 {
		if _, err := s.take(ctx, storetest.Base.UnixMicro(), backend.TakeRequest{Cost: 1, MaxWait: time.Second}); err != nil {
			t.Fatal(err)
		}
		if got := fields(); !slices.Equal(got, []string{"tokens", "ts"}) {
			t.Fatalf("take %d: state fields = %q; want tokens and ts only", i, got)
		}
	}
	if _, err := s.take(ctx, storetest.Base.UnixMicro(), backend.TakeRequest{Cost: 1, MaxWait: time.Second, Priority: limiter.PriorityLow}); err != nil {
		t.Fatal(err)
	}
	if got := fields(); !slices.Equal(got, []string{"q2", "tokens", "ts"}) {
		t.Fatalf("after a low reservation: state fields = %q; want q2 too", got)
	}
}

// A take of the default class, sent with the trimmed arguments, announces
// its push on the channel named after the state key.
func TestDefaultTakeAnnouncesPush(t *testing.T) {
	c := newClient(t)
	s, err := New(c, Config{Bucket: uniqueBucket(t, c), Rate: 1, Burst: 1, NoBatching: true})
	if err != nil {
		t.Fatal(err)
	}
	w := watchStore(t, c, s)
	ctx := context.Background()
	for range 2 {
		if _, err := s.Take(ctx, backend.TakeRequest{Cost: 1, MaxWait: time.Minute, Priority: limiter.PriorityLow}); err != nil {
			t.Fatal(err)
		}
	}
	res, err := s.Take(ctx, backend.TakeRequest{Cost: 1, MaxWait: time.Minute})
	if err != nil || !res.Granted || res.Class != limiter.PriorityNormal {
		t.Fatalf("normal take = %+v, %v; want granted in normal", res, err)
	}
	got := w.Pushes(t)
	if len(got) != 1 || got[0].Class != limiter.PriorityLow || got[0].Tokens != 1 || got[0].Counter != 1 || !got[0].At.Equal(res.At) {
		t.Fatalf("pushes = %+v; want low pushed by 1 to 1 at %v", got, res.At)
	}
}
