package rabbitmq_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/throttlehq/throttle/consumer/internal/kit"
	"github.com/throttlehq/throttle/consumer/rabbitmq"
	"github.com/throttlehq/throttle/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testLogger sends log records to t.Log, so that they show with -v or on
// failure only.
func testLogger(t testing.TB) *slog.Logger { return testenv.Logger(t, slog.LevelDebug) }

// broker is the test's own connection to RabbitMQ, for topology and
// publishing.
type broker struct {
	url string
	ch  *amqp.Channel
}

func newBroker(t *testing.T) *broker {
	t.Helper()
	u := testenv.AMQPURL(t)
	conn, err := amqp.Dial(u)
	if err != nil {
		t.Fatalf("dialing RabbitMQ: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("opening channel: %v", err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("enabling publisher confirms: %v", err)
	}
	return &broker{url: u, ch: ch}
}

// declareQueue declares a unique queue with the topology that
// Config.Declare sets up, and deletes it all when the test ends.
func (b *broker) declareQueue(t *testing.T) string {
	t.Helper()
	q := testenv.Name(t, "throttle-test")
	dlx, dlq := q+".dlx", q+".dlq"
	t.Cleanup(func() {
		conn, err := amqp.Dial(b.url)
		if err != nil {
			t.Errorf("dialing RabbitMQ for cleanup: %v", err)
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Errorf("opening channel for cleanup: %v", err)
			return
		}
		for _, name := range []string{q, dlq} {
			if _, err := ch.QueueDelete(name, false, false, false); err != nil {
				t.Errorf("deleting queue %s: %v", name, err)
			}
		}
		if err := ch.ExchangeDelete(dlx, false, false); err != nil {
			t.Errorf("deleting exchange %s: %v", dlx, err)
		}
		// The delay queues, if a test set messages aside; deleting what
		// does not exist is no error.
		for _, name := range rabbitmq.DelayQueues(q, math.MaxInt64) {
			if _, err := ch.QueueDelete(name, false, false, false); err != nil {
				t.Errorf("deleting queue %s: %v", name, err)
			}
			if err := ch.ExchangeDelete(name, false, false); err != nil {
				t.Errorf("deleting exchange %s: %v", name, err)
			}
		}
	})
	must(t, b.ch.ExchangeDeclare(dlx, amqp.ExchangeFanout, true, false, false, false, nil))
	_, err := b.ch.QueueDeclare(dlq, true, false, false, false, nil)
	must(t, err)
	must(t, b.ch.QueueBind(dlq, "", dlx, false, nil))
	_, err = b.ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-dead-letter-exchange": dlx})
	must(t, err)
	return q
}

// publish publishes n messages with ids m-0000, m-0001, ... to q and waits
// for the broker to confirm them all.
func (b *broker) publish(t *testing.T, q string, n int) []string {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	ids := make([]string, n)
	confirms := make([]*amqp.DeferredConfirmation, n)
	for i := range n {
		ids[i] = fmt.Sprintf("m-%04d", i)
		dc, err := b.ch.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false, amqp.Publishing{
			MessageId:    ids[i],
			DeliveryMode: amqp.Persistent,
			Body:         []byte("body " + ids[i]),
		})
		if err != nil {
			t.Fatalf("publishing %s: %v", ids[i], err)
		}
		confirms[i] = dc
	}
	for i, dc := range confirms {
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			t.Fatalf("publishing %s: confirmed %v, %v", ids[i], ok, err)
		}
	}
	return ids
}

// ready returns the number of messages ready in q, which excludes those
// delivered and not yet acked.
func (b *broker) ready(t *testing.T, q string) int {
	t.Helper()
	info, err := b.ch.QueueDeclarePassive(q, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspecting queue %s: %v", q, err)
	}
	return info.Messages
}

// waitReady waits up to 5s for q to hold want ready messages, since the
// broker requeues a closed channel's deliveries asynchronously, and returns
// the last count seen.
func (b *broker) waitReady(t *testing.T, q string, want int) int {
	t.Helper()
	var got int
	testenv.Within(5*time.Second, func() bool {
		got = b.ready(t, q)
		return got == want
	})
	return got
}

// waitDelayEmpty waits up to 5 s until no message is ready in the delay
// queues of q (with the default Options.MaxSetAside), and returns how many
// are left.
func (b *broker) waitDelayEmpty(t *testing.T, q string) int {
	t.Helper()
	left := 0
	for _, dq := range rabbitmq.DelayQueues(q, kit.DefaultMaxSetAside) {
		left += b.waitReady(t, dq, 0)
	}
	return left
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// proxy is a TCP proxy to RabbitMQ whose connections the test can cut, as
// a network failure or a crashed process would.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	held   chan struct{} // closed while data flows; see stall
	resume func()        // ends the current stall, if any
	refuse bool          // close new connections at once; see refuseNew
	wg     sync.WaitGroup
}

func newProxy(t *testing.T, amqpURL string) (*proxy, string) {
	t.Helper()
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatalf("parsing AMQP URL: %v", err)
	}
	target := u.Host
	if u.Port() == "" {
		target = net.JoinHostPort(u.Hostname(), "5672")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listening: %v", err)
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, held: make(chan struct{})}
	close(p.held)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	u.Host = ln.Addr().String()
	return p, u.String()
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse := p.refuse
		p.mu.Unlock()
		if refuse {
			_ = down.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = down.Close()
			continue
		}
		p.mu.Lock()
		p.conns[down], p.conns[up] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(up, down)
		go p.pipe(down, up)
	}
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			held := p.held
			p.mu.Unlock()
			<-held
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	_ = dst.Close()
	_ = src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// cut resets every connection through the proxy. New connections are still
// accepted.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // RST, not FIN
		}
		_ = c.Close()
	}
}

// refuseNew makes the proxy close new connections as soon as it accepts
// them (on) or proxy them again (off), as a broker that is down would and
// then would not.
func (p *proxy) refuseNew(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = on
}

// stall holds the data that reaches the proxy, in both directions, as a
// broker that stopped answering would, until the returned resume is called.
// Connections stay open.
func (p *proxy) stall() (resume func()) {
	held := make(chan struct{})
	var once sync.Once
	resume = func() { once.Do(func() { close(held) }) }
	p.mu.Lock()
	p.held, p.resume = held, resume
	p.mu.Unlock()
	return resume
}

// close stops accepting, cuts every connection, ends any stall and waits for the proxy's
// goroutines.
func (p *proxy) close() {
	_ = p.ln.Close()
	p.cut()
	p.mu.Lock()
	resume := p.resume
	p.mu.Unlock()
	if resume != nil {
		resume() // pipes held by a stall find their connections closed
	}
	p.wg.Wait()
}

// runAll runs each consumer's Run in its own goroutine and returns a func
// that waits for them all and fails the test unless each returned nil.
func runAll(t *testing.T, ctx context.Context, runs ...func(context.Context) error) (wait func()) {
	t.Helper()
	errs := make(chan error, len(runs))
	for _, run := range runs {
		go func() { errs <- run(ctx) }()
	}
	return func() {
		t.Helper()
		for range runs {
			select {
			case err := <-errs:
				if err != nil {
					t.Errorf("Run returned %v, want nil", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Run did not return 30s after its context ended")
			}
		}
	}
}
