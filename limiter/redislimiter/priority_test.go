package redislimiter

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/internal/storetest"
)

// watchedStore drives a Store at explicit instants and reads the pushes its
// Watch hears.
type watchedStore struct {
	clocked
	c       redis.UniversalClient
	changed chan struct{}
	mu      sync.Mutex
	pushes  []limiter.Push
}

// watchStore watches s until the test ends, and returns once the
// subscription is in place.
func watchStore(t *testing.T, c redis.UniversalClient, s *Store) *watchedStore {
	t.Helper()
	w := &watchedStore{clocked: clocked{s}, c: c, changed: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		s.Watch(ctx, func() {
			select {
			case w.changed <- struct{}{}:
			default:
			}
		}, func(p limiter.Push) {
			w.mu.Lock()
			w.pushes = append(w.pushes, p)
			w.mu.Unlock()
		})
	}()
	// Announce until the subscription hears one.
	deadline := time.Now().Add(5 * time.Second)
	for {
		c.Publish(ctx, s.channel, "test")
		select {
		case <-w.changed:
			return w
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("the watch did not subscribe")
		}
	}
}

// Pushes implements storetest.PriorityStore. It announces a change after
// the takes and waits until Watch hears it: the pushes the takes announced
// before it have then been heard too.
func (w *watchedStore) Pushes(t *testing.T) []limiter.Push {
	t.Helper()
	w.c.Publish(context.Background(), w.s.channel, "test")
	select {
	case <-w.changed:
	case <-time.After(5 * time.Second):
		t.Fatal("the watch did not hear the test's announcement")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.pushes
	w.pushes = nil
	return out
}

func (w *watchedStore) RefundClassAt(now time.Time, tokens int, class limiter.Priority) error {
	return w.s.refund(context.Background(), now.UnixMicro(), tokens, class)
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

func (c clockedPriorityLayers) TakeAt(now time.Time, req limiter.TakeRequest) (limiter.TakeResult, error) {
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
		want []limiter.Push
	}{
		{"push 1764560000123456 1500 2:3000", []limiter.Push{{Class: limiter.PriorityLow, Tokens: 1.5, Counter: 3, At: at}}},
		{"push 1764560000123456 1000 1:1000 2:2500", []limiter.Push{
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

// A take without classes writes no class field: the state hash holds only
// tokens and ts.
func TestPlainTakeWritesNoClassField(t *testing.T) {
	c := newClient(t)
	s, err := New(c, Config{Bucket: uniqueBucket(t, c), Rate: 10, Burst: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 2 {
		if _, err := s.take(ctx, storetest.Base.UnixMicro(), limiter.TakeRequest{Cost: 1, Priority: limiter.PriorityHigh}); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := c.HKeys(ctx, s.stateKeys[0]).Result()
	if err != nil || len(keys) != 2 {
		t.Fatalf("state fields = %q, %v; want tokens and ts only", keys, err)
	}
}
