package redislimiter

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
)

// outcome is what one Take returned.
type outcome struct {
	res backend.TakeResult
	err error
}

// pipelineFunc stands in for a pipeline's execution in a batchRig.
type pipelineFunc func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error

// batchRig is a batching Store on its own client, on a bucket that does not
// refill during a test (rate 0.001/s). Its hook can hold the first lone
// Take in flight, so that the Takes started meanwhile queue up and go out
// as one batch, and it records the commands of every script pipeline.
type batchRig struct {
	t     *testing.T
	c     redis.UniversalClient
	s     *Store
	burst int

	holding atomic.Bool
	held    chan struct{} // closed when the first Take is held
	release chan struct{} // close to let it go

	mu         sync.Mutex
	pipes      [][]string // command names of each pipeline
	onPipeline pipelineFunc
}

func newBatchRig(t *testing.T, burst int) *batchRig {
	t.Helper()
	c := newClient(t)
	s, err := New(c, Config{Bucket: uniqueBucket(t, c), Rate: 0.001, Burst: burst})
	if err != nil {
		t.Fatal(err)
	}
	// Load the script, so that no EVALSHA misses unless a test says so.
	if _, err := s.take(context.Background(), 0, backend.TakeRequest{Cost: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.Refund(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	r := &batchRig{t: t, c: c, s: s, burst: burst, held: make(chan struct{}), release: make(chan struct{})}
	c.AddHook(r)
	return r
}

func (r *batchRig) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *batchRig) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" && r.holding.CompareAndSwap(true, false) {
			close(r.held)
			<-r.release
		}
		return next(ctx, cmd)
	}
}

func (r *batchRig) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if n := cmds[0].Name(); n != "evalsha" && n != "eval" {
			return next(ctx, cmds) // a new connection's handshake
		}
		names := make([]string, len(cmds))
		for i, c := range cmds {
			names[i] = c.Name()
		}
		r.mu.Lock()
		r.pipes = append(r.pipes, names)
		f := r.onPipeline
		r.mu.Unlock()
		if f != nil {
			return f(ctx, cmds, next)
		}
		return next(ctx, cmds)
	}
}

// setPipeline makes f run the next pipelines in place of the client.
func (r *batchRig) setPipeline(f pipelineFunc) {
	r.mu.Lock()
	r.onPipeline = f
	r.mu.Unlock()
}

// pipelines returns the command names of each pipeline sent so far.
func (r *batchRig) pipelines() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]string(nil), r.pipes...)
}

// hold starts a lone Take of cost 1 and holds it in flight until
// r.release is closed.
func (r *batchRig) hold() <-chan outcome {
	r.holding.Store(true)
	out := r.take(context.Background(), 1)
	select {
	case <-r.held:
	case <-time.After(5 * time.Second):
		r.t.Fatal("the first Take was never sent")
	}
	return out
}

// take starts a Take of cost and returns its outcome's channel.
func (r *batchRig) take(ctx context.Context, cost int) <-chan outcome {
	out := make(chan outcome, 1)
	go func() {
		res, err := r.s.Take(ctx, backend.TakeRequest{Cost: cost})
		out <- outcome{res, err}
	}()
	return out
}

// enqueue starts a Take of cost and waits until it is queued behind the
// flight, so that Takes enqueue in the order of the calls.
func (r *batchRig) enqueue(ctx context.Context, cost int) <-chan outcome {
	r.t.Helper()
	want := r.queued() + 1
	out := r.take(ctx, cost)
	r.waitQueued(want)
	return out
}

func (r *batchRig) queued() int {
	r.s.batch.mu.Lock()
	defer r.s.batch.mu.Unlock()
	return len(r.s.batch.queue)
}

func (r *batchRig) waitQueued(n int) {
	r.t.Helper()
	if !testenv.Within(5*time.Second, func() bool { return r.queued() == n }) {
		r.t.Fatalf("%d Takes queued, want %d", r.queued(), n)
	}
}

// tokens returns the bucket's tokens now.
func (r *batchRig) tokens() float64 {
	r.t.Helper()
	st, err := r.s.Status(context.Background())
	if err != nil {
		r.t.Fatal(err)
	}
	return st.Tokens
}

func (r *batchRig) wantTokens(want float64) {
	r.t.Helper()
	if got := r.tokens(); math.Abs(got-want) > 0.01 {
		r.t.Errorf("bucket holds %v tokens, want %v", got, want)
	}
}

func recv(t *testing.T, ch <-chan outcome) outcome {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(5 * time.Second):
		t.Fatal("Take did not return")
		return outcome{}
	}
}

func TestQueuedTakesGoOutAsOnePipelineInOrder(t *testing.T) {
	const burst = 100
	r := newBatchRig(t, burst)
	first := r.hold()
	var outs []<-chan outcome
	for cost := 1; cost <= 5; cost++ {
		outs = append(outs, r.enqueue(context.Background(), cost))
	}
	close(r.release)
	if o := recv(t, first); o.err != nil || !o.res.Granted {
		t.Fatalf("first Take = %+v, %v", o.res, o.err)
	}
	left := float64(burst - 1)
	for i, ch := range outs {
		cost := i + 1
		o := recv(t, ch)
		left -= float64(cost)
		if o.err != nil || !o.res.Granted || o.res.Tokens != cost || o.res.Remaining != left {
			t.Errorf("queued Take %d (cost %d) = %+v, %v; want granted %d with %v left", i, cost, o.res, o.err, cost, left)
		}
	}
	if p := r.pipelines(); len(p) != 1 || len(p[0]) != 5 {
		t.Errorf("pipelines sent: %v; want one of 5 EVALSHA", p)
	}
	r.wantTokens(left)
}

// TestLeaseRefillsAreNotBatched: a Take that asks for Extra tokens is sent
// at once, alone, even while a batch is in flight.
func TestLeaseRefillsAreNotBatched(t *testing.T) {
	r := newBatchRig(t, 100)
	first := r.hold()
	res, err := r.s.Take(context.Background(), backend.TakeRequest{Cost: 2, Extra: 5})
	if err != nil || !res.Granted || res.Tokens != 7 {
		t.Fatalf("Take with extra while a flight is held = %+v, %v; want 7 tokens at once", res, err)
	}
	close(r.release)
	recv(t, first)
	if p := r.pipelines(); len(p) != 0 {
		t.Errorf("pipelines sent: %v; want none", p)
	}
	r.wantTokens(100 - 1 - 7)
}

func TestConcurrentTakesGrantExactlyTheBurst(t *testing.T) {
	const burst, workers, each = 500, 64, 16
	for _, noBatching := range []bool{false, true} {
		t.Run(map[bool]string{false: "batching", true: "no batching"}[noBatching], func(t *testing.T) {
			c := newClient(t)
			s, err := New(c, Config{Bucket: uniqueBucket(t, c), Rate: 0.001, Burst: burst, NoBatching: noBatching})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.take(context.Background(), 0, backend.TakeRequest{Cost: 1}); err != nil { // load the script
				t.Fatal(err)
			}
			s.Refund(context.Background(), 1)
			h := &countingHook{}
			c.AddHook(h)
			var granted, denied atomic.Int64
			var wg sync.WaitGroup
			for range workers {
				wg.Go(func() {
					for range each {
						res, err := s.Take(context.Background(), backend.TakeRequest{Cost: 1})
						if err != nil {
							t.Error(err)
							return
						}
						if res.Granted {
							granted.Add(1)
						} else {
							denied.Add(1)
						}
					}
				})
			}
			wg.Wait()
			t.Logf("%d Takes in %d round trips", workers*each, h.N.Load())
			if granted.Load() != burst || denied.Load() != workers*each-burst {
				t.Errorf("granted %d, denied %d; want %d and %d", granted.Load(), denied.Load(), burst, workers*each-burst)
			}
			st, err := s.Status(context.Background())
			if err != nil || st.Tokens < 0 || st.Tokens > 0.01 {
				t.Errorf("bucket after = %v tokens, %v; want empty", st.Tokens, err)
			}
		})
	}
}

// TestCancelledTakeInABatch: a caller whose ctx ends while it waits for
// its batch returns at once, and its tokens end up back in the bucket.
func TestCancelledTakeInABatch(t *testing.T) {
	cases := []struct {
		name string
		// sent cancels while the batch is in flight, rather than while it
		// still waits in the queue.
		sent bool
	}{
		{"queued", false},
		{"in flight", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			const burst = 10
			r := newBatchRig(t, burst)
			inFlight, releasePipe := make(chan struct{}), make(chan struct{})
			r.setPipeline(func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
				close(inFlight)
				<-releasePipe
				return next(ctx, cmds)
			})
			first := r.hold()
			leader := r.enqueue(context.Background(), 2)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			quitter := r.enqueue(ctx, 3)
			if tc.sent {
				close(r.release)
				<-inFlight // the leader sent [leader, quitter]
			}
			cancel()
			if o := recv(t, quitter); !errors.Is(o.err, context.Canceled) {
				t.Fatalf("cancelled Take = %+v, %v; want context.Canceled", o.res, o.err)
			}
			if !tc.sent {
				close(r.release)
			}
			close(releasePipe)
			for _, ch := range []<-chan outcome{first, leader} {
				if o := recv(t, ch); o.err != nil || !o.res.Granted {
					t.Errorf("Take = %+v, %v", o.res, o.err)
				}
			}
			if p := r.pipelines(); tc.sent != (len(p) == 1) {
				t.Errorf("pipelines sent: %v", p)
			}
			r.wantTokens(burst - 1 - 2)
		})
	}
}

// TestAbandonedLeadPassesOn: a caller told to lead whose ctx ended hands
// the lead to the next in the queue.
func TestAbandonedLeadPassesOn(t *testing.T) {
	r := newBatchRig(t, 10)
	b := r.s.batch
	p1, p2 := pendingPool.Get().(*pending), pendingPool.Get().(*pending)
	p1.req, p2.req = backend.TakeRequest{Cost: 1}, backend.TakeRequest{Cost: 2}
	b.mu.Lock()
	b.flushing = true
	b.queue = append(b.queue, p1, p2)
	b.handOffLocked()
	b.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.abandon(ctx, p1); !errors.Is(err, context.Canceled) {
		t.Fatalf("abandon = %v, want context.Canceled", err)
	}
	if p2.state != leading || len(p2.ready) != 1 || len(b.queue) != 1 {
		t.Fatalf("after abandon: next state %v, signals %d, queue %d; want it leading", p2.state, len(p2.ready), len(b.queue))
	}
	<-p2.ready
	res, err := b.lead(context.Background(), p2)
	if err != nil || !res.Granted || res.Tokens != 2 {
		t.Fatalf("the new leader's Take = %+v, %v", res, err)
	}
	if b.flushing || len(b.queue) != 0 {
		t.Fatalf("flushing %v with %d queued after the last batch", b.flushing, len(b.queue))
	}
	r.wantTokens(8)
}

// noScript is the error Redis answers EVALSHA with when it lacks the script.
type noScript struct{}

func (noScript) Error() string { return "NOSCRIPT No matching script. Please use EVAL." }
func (noScript) RedisError()   {}

func TestBatchRecoversFromNoScript(t *testing.T) {
	cases := []struct {
		name string
		ran  int // EVALSHA of the batch that Redis ran before it lost the script
	}{
		{"all missed", 0},
		{"some missed", 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			const burst = 100
			r := newBatchRig(t, burst)
			var faked atomic.Bool
			r.setPipeline(func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
				if !faked.CompareAndSwap(false, true) {
					return next(ctx, cmds)
				}
				if tc.ran > 0 {
					if err := next(ctx, cmds[:tc.ran]); err != nil {
						return err
					}
				}
				for _, c := range cmds[tc.ran:] {
					c.SetErr(noScript{})
				}
				return noScript{}
			})
			first := r.hold()
			var outs []<-chan outcome
			for range 4 {
				outs = append(outs, r.enqueue(context.Background(), 2))
			}
			close(r.release)
			recv(t, first)
			for i, ch := range outs {
				if o := recv(t, ch); o.err != nil || !o.res.Granted || o.res.Tokens != 2 {
					t.Errorf("Take %d = %+v, %v; want granted 2", i, o.res, o.err)
				}
			}
			p := r.pipelines()
			if len(p) != 2 || len(p[1]) != 4-tc.ran || p[1][0] != "eval" {
				t.Errorf("pipelines sent: %v; want the %d missed sent again with EVAL", p, 4-tc.ran)
			}
			r.wantTokens(burst - 1 - 4*2)
		})
	}
}

func TestBatchErrors(t *testing.T) {
	injected := errors.New("connection reset by peer")
	cases := []struct {
		name string
		// prepare runs before the batch goes out.
		prepare  func(r *batchRig)
		pipeline pipelineFunc
		costs    []int
		want     []error // per queued Take
	}{
		{
			name: "pipeline fails",
			pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
				for _, c := range cmds {
					c.SetErr(injected)
				}
				return injected
			},
			costs: []int{1, 1, 1},
			want:  []error{injected, injected, injected},
		},
		{
			name: "hook fails without setting each command's error",
			pipeline: func(context.Context, []redis.Cmder, redis.ProcessPipelineHook) error {
				return injected
			},
			costs: []int{1, 1},
			want:  []error{injected, injected},
		},
		{
			name:  "cost above burst",
			costs: []int{1, 11, 2},
			want:  []error{nil, limiter.ErrCostExceedsBurst, nil},
		},
		{
			name: "malformed reply",
			pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
				err := next(ctx, cmds)
				cmds[1].(*redis.Cmd).SetVal([]any{int64(1), int64(2)})
				return err
			},
			costs: []int{1, 1},
			want:  []error{nil, backend.ErrMalformedReply},
		},
		{
			name: "script error",
			prepare: func(r *batchRig) {
				r.c.Set(context.Background(), r.s.stateKeys[0], "not a hash", 0)
			},
			costs: []int{1, 1},
			want:  []error{limiter.ErrStore, limiter.ErrStore},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newBatchRig(t, 10)
			if tc.pipeline != nil {
				r.setPipeline(tc.pipeline)
			}
			first := r.hold()
			var outs []<-chan outcome
			for _, cost := range tc.costs {
				outs = append(outs, r.enqueue(context.Background(), cost))
			}
			if tc.prepare != nil {
				tc.prepare(r)
			}
			close(r.release)
			recv(t, first)
			for i, ch := range outs {
				o := recv(t, ch)
				switch want := tc.want[i]; {
				case want == nil:
					if o.err != nil || !o.res.Granted {
						t.Errorf("Take %d = %+v, %v; want granted", i, o.res, o.err)
					}
				case errors.Is(want, limiter.ErrCostExceedsBurst):
					if !errors.Is(o.err, want) || o.res.Burst != 10 {
						t.Errorf("Take %d = %+v, %v; want %v with the burst", i, o.res, o.err, want)
					}
				default:
					var se *backend.StoreError
					if !errors.Is(o.err, want) || !errors.As(o.err, &se) || se.Op != "take" || se.Bucket != r.s.cfg.Bucket {
						t.Errorf("Take %d = %v; want a take StoreError wrapping %v", i, o.err, want)
					}
				}
			}
			if len(r.pipelines()) != 1 {
				t.Errorf("pipelines sent: %v; want one", r.pipelines())
			}
		})
	}
}
