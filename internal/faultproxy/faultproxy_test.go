package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// echoServer answers every line with the same line, and closes its side
// after the client's EOF.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func newProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes a line and reads it back, failing after timeout.
func roundTrip(c net.Conn, line string, timeout time.Duration) error {
	c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return err
	}
	got := make([]byte, len(line)+1)
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if string(got) != line+"\n" {
		return errors.New("echo mismatch: " + string(got))
	}
	return nil
}

func TestForwardsBothWays(t *testing.T) {
	p := newProxy(t, echoServer(t))
	c := dial(t, p)
	for _, line := range []string{"hello", strings.Repeat("x", 3*chunkSize)} {
		if err := roundTrip(c, line, 5*time.Second); err != nil {
			t.Fatalf("round trip of %d bytes: %v", len(line), err)
		}
	}
	if p.Accepted() != 1 || p.Live() != 1 {
		t.Errorf("Accepted, Live = %d, %d; want 1, 1", p.Accepted(), p.Live())
	}
}

func TestHalfCloseReachesTheTarget(t *testing.T) {
	p := newProxy(t, echoServer(t))
	c := dial(t, p)
	io.WriteString(c, "last words")
	c.(*net.TCPConn).CloseWrite()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "last words" {
		t.Fatalf("after CloseWrite read %q, %v; want the echo then EOF", got, err)
	}
}

func TestCutClosesLiveConnectionsAndKeepsAccepting(t *testing.T) {
	p := newProxy(t, echoServer(t))
	c := dial(t, p)
	if err := roundTrip(c, "before", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Cut()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read on a cut connection = %v, want EOF or reset", err)
	}
	c2 := dial(t, p)
	if err := roundTrip(c2, "after", 5*time.Second); err != nil {
		t.Fatalf("new connection after Cut: %v", err)
	}
	if p.Accepted() != 2 {
		t.Errorf("Accepted = %d, want 2", p.Accepted())
	}
}

func TestBlockStallsTrafficUntilUnblock(t *testing.T) {
	p := newProxy(t, echoServer(t))
	live := dial(t, p)
	if err := roundTrip(live, "warm", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Block()
	p.Block() // idempotent
	held := dial(t, p)
	for name, c := range map[string]net.Conn{"live": live, "new": held} {
		io.WriteString(c, name+"\n")
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if n, err := c.Read(make([]byte, 16)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("%s connection read %d bytes, %v during a partition; want a timeout", name, n, err)
		}
	}
	p.Unblock()
	p.Unblock() // idempotent
	for name, c := range map[string]net.Conn{"live": live, "new": held} {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || line != name+"\n" {
			t.Fatalf("%s connection after Unblock read %q, %v; want the stalled echo", name, line, err)
		}
	}
}

func TestCutDuringBlockDropsHeldConnections(t *testing.T) {
	p := newProxy(t, echoServer(t))
	p.Block()
	c := dial(t, p)
	for p.Accepted() == 0 {
		time.Sleep(time.Millisecond)
	}
	p.Cut()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read on a held, cut connection = %v, want EOF or reset", err)
	}
	p.Unblock()
	if err := roundTrip(dial(t, p), "ok", 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestLatencyDelaysEachDirection(t *testing.T) {
	p := newProxy(t, echoServer(t))
	c := dial(t, p)
	const d = 30 * time.Millisecond
	p.SetLatency(d)
	start := time.Now()
	if err := roundTrip(c, "slow", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(start); rtt < 2*d {
		t.Errorf("round trip took %v with %v latency each way, want >= %v", rtt, d, 2*d)
	}
	p.SetLatency(0)
	if err := roundTrip(c, "fast", 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestUnreachableTargetClosesTheClient(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	p := newProxy(t, dead)
	c := dial(t, p)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read through a proxy to a closed port = %v, want EOF or reset", err)
	}
}

func TestNewAndClose(t *testing.T) {
	if _, err := New("no-port"); err == nil || !strings.Contains(err.Error(), "no-port") {
		t.Errorf("New(no-port) = %v, want an error naming the target", err)
	}
	p, err := New(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, p)
	if err := roundTrip(c, "x", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Error("the proxy still accepts after Close")
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after Close = %v, want EOF or reset", err)
	}
}
