package kit

import (
	"context"
	"sync"

	"github.com/throttlehq/throttle/consumer"
)

// Lifecycle implements the Run and Close contract that every backend
// shares:
//
//   - Run runs once. It returns when its context ends or Close is called,
//     after draining (Options.DrainTimeout). A second call of Run, or a
//     call after Close, returns consumer.ErrStopped at once.
//   - Close stops a running Run as if its context had ended and waits for
//     it to return. Close before Run makes Run return consumer.ErrStopped. Close is
//     idempotent, safe from any goroutine except a handler of the same
//     consumer (it would wait for itself), and returns nil.
//
// The zero value is ready to use. It is safe for concurrent use.
type Lifecycle struct {
	mu      sync.Mutex
	started bool
	closed  bool
	cancel  context.CancelFunc
	done    chan struct{}
}

// Start begins Run. It returns ctx with a cancel that Close triggers, and
// end, which Run must call (deferred) when it returns. It returns consumer.ErrStopped
// when Run was called before or Close was called.
func (l *Lifecycle) Start(ctx context.Context) (_ context.Context, end func(), _ error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started || l.closed {
		return nil, nil, consumer.ErrStopped
	}
	l.started = true
	ctx, cancel := context.WithCancel(ctx)
	l.cancel = cancel
	l.done = make(chan struct{})
	done := l.done
	return ctx, func() { cancel(); close(done) }, nil
}

// Close stops Run, if it runs, and waits for it to return.
func (l *Lifecycle) Close() error {
	l.mu.Lock()
	l.closed = true
	cancel, done := l.cancel, l.done
	l.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	return nil
}

// Closed reports whether Close was called.
func (l *Lifecycle) Closed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}
