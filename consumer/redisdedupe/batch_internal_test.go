package redisdedupe

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/testenv"
)

// TestBatcherBothWays: concurrent claims, marks and releases get their
// own replies both as one script call (a single node; through Process, or
// through Script.Run with a Client that has no Process) and as a pipeline
// of one call per operation (what a Cluster's batcher sends).
func TestBatcherBothWays(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { c.Close() })
	for _, way := range []string{"script", "script without Process", "cluster"} {
		t.Run(way, func(t *testing.T) {
			prefix := testenv.Name(t, "ddb") + ":"
			b := newBatcher(c, prefix+"ch")
			b.cluster = way == "cluster"
			if way == "script without Process" {
				b.proc = nil
			}
			const n = 150
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for i := range n {
				wg.Go(func() {
					key := fmt.Sprintf("%s{k%d}", prefix, i)
					check := func(kind, token, ttl string, want any) {
						if v, err := b.do(kind, key, token, any(ttl)); err != nil || v != want {
							errs <- fmt.Errorf("%s %s %s: %v %v, want %v", kind, key, token, v, err, want)
						}
					}
					check("c", "a", "60000", int64(0))
					check("r", "b", "", int64(0))
					if i%2 == 0 {
						check("r", "a", "", int64(1))
						check("c", "b", "60000", int64(0))
						return
					}
					check("m", "", "60000", int64(1))
					check("c", "b", "60000", int64(1))
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}

// TestBatcherLater: operations queued with later go out in the order
// they were queued (a claim, its release, another token's claim of the
// same key), within linger without anyone waiting, at once on flush, and
// at once when maxBatch are queued.
func TestBatcherLater(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { c.Close() })
	prefix := testenv.Name(t, "ddl") + ":"
	b := newBatcher(c, prefix+"ch")
	key := prefix + "{k}"
	replies := make(chan string, maxBatch+3)
	record := func(what string) func(any, error) {
		return func(v any, err error) { replies <- fmt.Sprint(what, " ", v, " ", err) }
	}
	b.later("c", key, "a", "60000", record("claim a"))
	b.later("r", key, "a", "", record("release a"))
	b.later("c", key, "b", "60000", record("claim b"))
	for _, want := range []string{"claim a 0 <nil>", "release a 1 <nil>", "claim b 0 <nil>"} {
		select {
		case got := <-replies:
			if got != want {
				t.Fatalf("reply %q, want %q", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no reply within 10 s (linger %v), want %q", b.linger, want)
		}
	}

	b.linger = time.Hour
	b.later("c", key, "c", "60000", record("claim c"))
	b.flush() // sends from this goroutine: the reply is in
	select {
	case got := <-replies:
		// b holds the claim: c gets 4 + its remaining TTL (ms).
		if !strings.HasPrefix(got, "claim c ") || !strings.HasSuffix(got, " <nil>") || strings.HasPrefix(got, "claim c 0 ") || strings.HasPrefix(got, "claim c 1 ") {
			t.Fatalf("flushed claim: %q, want the remaining TTL of b's claim", got)
		}
	default:
		t.Fatal("flush returned before the queued claim's reply")
	}

	for i := range maxBatch {
		b.later("m", fmt.Sprintf("%s{m%d}", prefix, i), "", "60000", record("mark"))
	}
	for range maxBatch {
		select {
		case got := <-replies:
			if got != "mark 1 <nil>" {
				t.Fatalf("mark: %q", got)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a full batch did not go out without the linger")
		}
	}
}

// noScript is the error Redis answers EVALSHA with when it lacks the
// script.
type noScript struct{}

func (noScript) Error() string { return "NOSCRIPT No matching script. Please use EVAL." }
func (noScript) RedisError()   {}

// noScriptHook answers the first EVALSHA with NOSCRIPT, as a Redis that
// lost its scripts, and records the commands' names.
type noScriptHook struct {
	mu    sync.Mutex
	names []string
}

func (h *noScriptHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *noScriptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *noScriptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := cmd.Name()
		if name != "evalsha" && name != "eval" {
			return next(ctx, cmd) // the connection's HELLO, CLIENT
		}
		h.mu.Lock()
		h.names = append(h.names, name)
		first := len(h.names) == 1
		h.mu.Unlock()
		if first {
			cmd.SetErr(noScript{})
			return noScript{}
		}
		return next(ctx, cmd)
	}
}

// TestBatcherNoScript: a batch whose EVALSHA finds no script goes again
// as EVAL, and gets its replies.
func TestBatcherNoScript(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { c.Close() })
	h := &noScriptHook{}
	c.AddHook(h)
	prefix := testenv.Name(t, "ddn") + ":"
	b := newBatcher(c, prefix+"ch")
	if v, err := b.do(kindClaim, prefix+"{k}", "a", any("60000")); err != nil || v != int64(0) {
		t.Fatalf("claim: %v, %v; want 0 (claimed)", v, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.names) != 2 || h.names[0] != "evalsha" || h.names[1] != "eval" {
		t.Errorf("commands %q, want [evalsha eval]", h.names)
	}
}
