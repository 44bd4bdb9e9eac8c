// Package faultproxy is a TCP proxy that a test controls, to put network
// faults between a client and a server: cut every connection, partition
// the two sides, or slow every chunk down.
//
// Point the client at Proxy.Addr instead of the server. The proxy dials the
// target once per accepted connection and copies bytes both ways until
// either side closes, or the test cuts the connection.
package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// chunkSize is the most bytes read and forwarded at once.
const chunkSize = 32 << 10

// queueLen is how many chunks a direction holds while they wait out the
// latency or a partition. When it is full the proxy stops reading, so the
// sender sees TCP back-pressure.
const queueLen = 64

// dialTimeout bounds the dial to the target.
const dialTimeout = 5 * time.Second

// Proxy forwards TCP connections from Addr to a target and injects faults.
//
// A Proxy is safe for concurrent use: the fault methods may be called from
// any goroutine while traffic flows.
type Proxy struct {
	target string
	ln     net.Listener

	latency  atomic.Int64 // time.Duration
	accepted atomic.Int64

	mu     sync.Mutex
	links  map[*link]struct{}
	open   chan struct{} // closed while not blocked
	closed bool

	wg sync.WaitGroup
}

// link is one proxied connection: the client's side and, once dialed, the
// target's. done is closed when the link is cut.
type link struct {
	mu     sync.Mutex
	client net.Conn
	server net.Conn
	done   chan struct{}
	once   sync.Once
}

// cut closes both sides and done, once.
func (l *link) cut() {
	l.once.Do(func() {
		close(l.done)
		l.mu.Lock()
		defer l.mu.Unlock()
		l.client.Close()
		if l.server != nil {
			l.server.Close()
		}
	})
}

// attach sets the dialed server side, or closes it and reports false when
// the link was cut meanwhile.
func (l *link) attach(server net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.done:
		server.Close()
		return false
	default:
	}
	l.server = server
	return true
}

// New starts a proxy to target (host:port) listening on a free port of
// 127.0.0.1. It does not dial target until a client connects.
func New(target string) (*Proxy, error) {
	if _, _, err := net.SplitHostPort(target); err != nil {
		return nil, fmt.Errorf("faultproxy: target %q: %w", target, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listening: %w", err)
	}
	p := &Proxy{target: target, ln: ln, links: make(map[*link]struct{}), open: make(chan struct{})}
	close(p.open)
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr returns the host:port clients should connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target returns the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Accepted returns how many client connections the proxy has accepted so
// far, which tells a test that a client reconnected. A connection counts
// once it is live: a Cut after Accepted saw it closes it.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// Live returns how many connections are open through the proxy now,
// including those held by a partition.
func (p *Proxy) Live() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Cut closes every live connection, both the client's and the target's
// side, as a server restart or a reset would. Bytes not yet forwarded are
// dropped. The proxy keeps accepting new connections.
func (p *Proxy) Cut() {
	p.mu.Lock()
	links := p.links
	p.links = make(map[*link]struct{})
	p.mu.Unlock()
	for l := range links {
		l.cut()
	}
}

// Block partitions the network: new connections are accepted but held
// without reaching the target, and bytes on live connections stop flowing in
// both directions. Nothing is closed, so the client sees only silence and
// its own timeouts. Unblock ends the partition. Block on a blocked proxy
// does nothing.
func (p *Proxy) Block() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
		p.open = make(chan struct{})
	default:
	}
}

// Unblock ends a partition: held connections are dialed through and
// stalled bytes flow again, in order. Unblock on an open proxy does
// nothing.
func (p *Proxy) Unblock() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
	default:
		close(p.open)
	}
}

// SetLatency delays every chunk of bytes by d in each direction, so a
// request and its answer take at least 2d more. Chunks are delayed, not
// throttled: several in flight wait out their latency together. Zero turns
// the delay off; it applies to chunks read from then on.
func (p *Proxy) SetLatency(d time.Duration) { p.latency.Store(int64(max(d, 0))) }

// Close stops accepting, closes every connection and waits for the proxy's
// goroutines to end. It is safe to call more than once.
func (p *Proxy) Close() error {
	p.mu.Lock()
	already := p.closed
	p.closed = true
	p.mu.Unlock()
	var err error
	if !already {
		err = p.ln.Close()
	}
	p.Cut()
	p.wg.Wait()
	return err
}

// gate returns a channel that is closed while the proxy is not blocked.
func (p *Proxy) gate() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.open
}

// wait blocks until the proxy is not blocked and d has passed, or l is cut;
// it reports whether l is still live.
func (p *Proxy) wait(l *link, d time.Duration) bool {
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-l.done:
			return false
		}
	}
	select {
	case <-p.gate():
		return true
	case <-l.done:
		return false
	}
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // closed
		}
		l := &link{client: c, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.links[l] = struct{}{}
		// Counted once it is live: a Cut after Accepted saw it cuts it
		// (counted before, a Cut in between missed the connection).
		p.accepted.Add(1)
		p.mu.Unlock()
		p.wg.Add(1)
		go p.serve(l)
	}
}

// serve waits out a partition, dials the target and copies both ways.
func (p *Proxy) serve(l *link) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
		l.cut()
	}()
	if !p.wait(l, 0) {
		return
	}
	server, err := net.DialTimeout("tcp", p.target, dialTimeout)
	if err != nil {
		return // the client sees its connection closed, as if refused
	}
	if !l.attach(server) {
		return
	}
	var dirs sync.WaitGroup
	dirs.Add(2)
	go func() { defer dirs.Done(); p.pipe(l, server, l.client) }()
	go func() { defer dirs.Done(); p.pipe(l, l.client, server) }()
	dirs.Wait()
}

// chunk is bytes read from one side, due to be written at due. A chunk with
// err set ends the direction.
type chunk struct {
	data []byte
	due  time.Time
	err  error
}

// pipe copies src to dst, holding each chunk until its latency has passed
// and the proxy is not blocked. At EOF it half-closes dst; on any other
// error it cuts the link, which ends the other direction too.
func (p *Proxy) pipe(l *link, dst, src net.Conn) {
	q := make(chan chunk, queueLen)
	go func() {
		defer close(q)
		for {
			buf := make([]byte, chunkSize)
			n, err := src.Read(buf)
			due := time.Now().Add(time.Duration(p.latency.Load()))
			var c chunk
			switch {
			case n > 0:
				c = chunk{data: buf[:n], due: due}
			case err != nil:
				c = chunk{due: due, err: err}
			default:
				continue
			}
			select {
			case q <- c:
			case <-l.done:
				return
			}
			if err != nil && n > 0 {
				select {
				case q <- chunk{due: due, err: err}:
				case <-l.done:
				}
				return
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		if !p.wait(l, time.Until(c.due)) {
			break
		}
		if c.err != nil {
			if tc, ok := dst.(*net.TCPConn); ok && errors.Is(c.err, io.EOF) {
				if tc.CloseWrite() == nil {
					break
				}
			}
			l.cut()
			break
		}
		if _, err := dst.Write(c.data); err != nil {
			l.cut()
			break
		}
	}
	for range q { // let the reader finish; it stops at l.done or src's error
	}
}
