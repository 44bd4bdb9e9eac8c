package httpsink_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
	"github.com/throttlehq/throttle/sinks"
	"github.com/throttlehq/throttle/sinks/httpsink"
)

// replica is one consumer process: its own Redis client, bucket handle and
// HTTP sink, sharing the bucket and the provider with the other replicas.
type replica struct {
	bucket  *limiter.Bucket
	handler consumer.Handler
}

func newReplica(t *testing.T, addr, bucket, url string) replica {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: addr})
	store, err := redislimiter.New(client, redislimiter.Config{Bucket: bucket, Rate: 20, Burst: 1})
	if err != nil {
		t.Fatal(err)
	}
	b, err := limiter.New(store, limiter.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sink := newSink(t, httpsink.Config{URL: url})
	t.Cleanup(func() {
		_ = b.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = client.Del(ctx, store.Keys()...).Err()
		_ = client.Close()
	})
	return replica{
		bucket:  b,
		handler: consumer.Chain(sinks.Handler(sink), consumer.Throttle(b, nil), consumer.PushBack(b)),
	}
}

// TestPushBackSlowsEveryReplica: replica A gets a 429 with Retry-After: 2.
// The shared bucket pauses, so replica B, which never saw the 429, waits
// too; then both go on at the shared rate.
func TestPushBackSlowsEveryReplica(t *testing.T) {
	t.Parallel()
	addr := testenv.RedisAddr(t)
	ctx := testenv.Context(t, 60*time.Second)
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	bucket := "test-pushback-" + hex.EncodeToString(suffix)

	var (
		mu     sync.Mutex
		served int
	)
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		served++
		first := served == 1
		mu.Unlock()
		if first {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer provider.Close()

	a := newReplica(t, addr, bucket, provider.URL)
	b := newReplica(t, addr, bucket, provider.URL)
	msg := jsonMsg(`{"to":"+15550100","text":"hi"}`)

	// A gets the 429; PushBack pauses the shared bucket.
	err := a.handler(ctx, msg)
	pausedAt := time.Now()
	if d, ok := consumer.RetryAfterOf(err); !ok || d != 2*time.Second || consumer.IsPermanent(err) {
		t.Fatalf("first send = %v (retry after %v), want a retryable 429 asking for 2s", err, d)
	}

	// B sees the pause in Redis, though its own sink never saw a 429.
	st, err := b.bucket.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.PausedFor < time.Second || st.PausedFor > 2*time.Second || st.Rate != 0 {
		t.Fatalf("B's view of the bucket: paused for %v at rate %v, want ~2s at rate 0", st.PausedFor, st.Rate)
	}

	// Both replicas' next messages wait out the pause.
	var wg sync.WaitGroup
	waited := map[string]time.Duration{}
	for name, r := range map[string]replica{"A": a, "B": b} {
		wg.Go(func() {
			err := r.handler(ctx, msg)
			d := time.Since(pausedAt)
			mu.Lock()
			defer mu.Unlock()
			waited[name] = d
			if err != nil {
				t.Errorf("replica %s after the pause: %v", name, err)
			}
		})
	}
	wg.Wait()
	for name, d := range waited {
		// The pause started in Redis just before pausedAt was read.
		if d < 1800*time.Millisecond {
			t.Errorf("replica %s sent %v after the 429, want >= ~2s", name, d)
		}
	}

	// The rate came back by itself, and it is still one shared rate:
	// 20 messages from two replicas at 20/s take about a second, not half.
	st, err = b.bucket.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.PausedFor != 0 || st.Rate != 20 {
		t.Errorf("after the pause: paused for %v at rate %v, want 0 and 20", st.PausedFor, st.Rate)
	}
	start := time.Now()
	for _, r := range []replica{a, b} {
		wg.Go(func() {
			for range 10 {
				if err := r.handler(ctx, msg); err != nil {
					t.Errorf("send after recovery: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	// Bounds are loose: the lower one shows the rate is shared, the upper
	// one that nothing is stuck at zero.
	if took := time.Since(start); took < 800*time.Millisecond || took > 10*time.Second {
		t.Errorf("20 sends after recovery took %v, want about 1s at the shared 20/s", took)
	}
	mu.Lock()
	defer mu.Unlock()
	if served != 23 {
		t.Errorf("provider served %d requests, want 23", served)
	}
}
