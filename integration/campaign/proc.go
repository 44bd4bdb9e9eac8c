package campaign

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// buffer is a bytes.Buffer safe for concurrent use, keeping the last
// 8 MiB. wrote is closed by the first write.
type buffer struct {
	mu    sync.Mutex
	b     bytes.Buffer
	wrote chan struct{}
}

func newBuffer() *buffer { return &buffer{wrote: make(chan struct{})} }

func (b *buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(p) > 0 {
		select {
		case <-b.wrote:
		default:
			close(b.wrote)
		}
	}
	if b.b.Len() > 16<<20 {
		keep := b.b.Bytes()[b.b.Len()-8<<20:]
		b.b = *bytes.NewBuffer(append([]byte(nil), keep...))
	}
	return b.b.Write(p)
}

func (b *buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Proc is a process the campaign owns. Kill ends it; the kernel kills it
// too when the campaign's process dies (Linux).
type Proc struct {
	Name string
	cmd  *exec.Cmd
	out  *buffer
	exit chan struct{}
	// exitedAt is when Wait returned; read only after exit is closed.
	exitedAt time.Time
}

// StartProc starts cmd, collecting its output.
func StartProc(name string, cmd *exec.Cmd) (*Proc, error) {
	p := &Proc{Name: name, cmd: cmd, out: newBuffer(), exit: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() {
		_ = cmd.Wait()
		p.exitedAt = time.Now()
		close(p.exit)
	}()
	return p, nil
}

// Signal sends sig to the process.
func (p *Proc) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Stop sends sig and waits up to d for the process to exit, returning its
// exit code, or -1 when it did not exit in time (it is then killed). It
// first waits, up to d, for the process's first output: a signal sent in
// the instant after the exec, before the program installed its handlers,
// ends it with the signal's default action (a step that picked a replica
// started 1 ms before saw "signal: terminated" instead of a drain).
func (p *Proc) Stop(sig os.Signal, d time.Duration) int {
	p.waitOutput(d)
	_ = p.cmd.Process.Signal(sig)
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-p.exit:
		return p.cmd.ProcessState.ExitCode()
	case <-timer.C:
		p.Kill()
		return -1
	}
}

// waitOutput waits until the process has written something, has exited,
// or d has passed.
func (p *Proc) waitOutput(d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-p.out.wrote:
	case <-p.exit:
	case <-timer.C:
	}
}

// Kill sends SIGKILL and waits for the process to be reaped. It is safe to
// call more than once.
func (p *Proc) Kill() {
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exit
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.exit:
		return true
	default:
		return false
	}
}

// Ended describes how the process ended and when ("signal: killed at
// 15:04:05.000"), or "running".
func (p *Proc) Ended() string {
	if !p.Exited() {
		return "running"
	}
	return fmt.Sprintf("%v at %s", p.cmd.ProcessState, p.exitedAt.Format("15:04:05.000"))
}

// Output returns what the process wrote so far (its last 8 MiB or more).
func (p *Proc) Output() string { return p.out.String() }

// Tail returns the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("... (%d lines before)", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// FreePort returns a loopback port that was free a moment ago.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Redis is a redis-server on a free loopback port, without persistence, in
// its own directory: a restart after Kill starts it empty.
type Redis struct {
	bin, dir string
	port     int
	proc     *Proc
}

// StartRedis starts redis-server (bin, found on PATH when empty) with its
// files in dir, and waits until it answers PING. A port taken between
// finding it free and the bind is retried with another.
func StartRedis(ctx context.Context, bin, dir string) (*Redis, error) {
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("redis-server"); err != nil {
			return nil, fmt.Errorf("campaign: %w", err)
		}
	}
	r := &Redis{bin: bin, dir: dir}
	for attempt := 1; ; attempt++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		r.port = port
		err = r.Start(ctx)
		if err == nil {
			return r, nil
		}
		if !strings.Contains(r.proc.Output(), "Address already in use") || attempt == 5 {
			return nil, err
		}
	}
}

// Addr returns the server's host:port.
func (r *Redis) Addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

// Start starts the server on its port (again, after Kill) and waits until
// it answers PING.
func (r *Redis) Start(ctx context.Context) error {
	args := []string{"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--dir", r.dir,
		"--save", "", "--appendonly", "no", "--protected-mode", "no", "--daemonize", "no"}
	p, err := StartProc("redis-server :"+strconv.Itoa(r.port), exec.Command(r.bin, args...))
	if err != nil {
		return err
	}
	r.proc = p
	return waitPing(ctx, r.Addr(), p)
}

// Kill stops the server at once with SIGKILL, as a crash would.
func (r *Redis) Kill() { r.proc.Kill() }

// Pause stops the server with SIGSTOP: connections stay open and nothing
// answers, as a stuck server or a partition.
func (r *Redis) Pause() error { return r.proc.Signal(syscall.SIGSTOP) }

// Resume continues a paused server.
func (r *Redis) Resume() error { return r.proc.Signal(syscall.SIGCONT) }

// Close kills the server (resuming it first, should it be paused).
func (r *Redis) Close() {
	_ = r.proc.Signal(syscall.SIGCONT)
	r.proc.Kill()
}

// waitPing waits until the server at addr answers PING, for up to 15 s,
// and returns an error when proc exits first.
func waitPing(ctx context.Context, addr string, proc *Proc) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var err error
		if conn, derr := net.DialTimeout("tcp", addr, time.Second); derr != nil {
			err = derr
		} else {
			conn.Close()
			pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			err = c.Ping(pctx).Err()
			cancel()
		}
		var reply redis.Error
		if err == nil || errors.As(err, &reply) {
			return nil
		}
		if proc.Exited() {
			return fmt.Errorf("%s exited before answering PING:\n%s", proc.Name, Tail(proc.Output(), 20))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s did not answer PING: %v", proc.Name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Build builds the throttle binary from the module at root into dir and
// returns its path.
func Build(ctx context.Context, root, dir string) (string, error) {
	bin := filepath.Join(dir, "throttle")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/throttle")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/throttle: %w\n%s", err, out)
	}
	return bin, nil
}
