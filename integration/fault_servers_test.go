package integration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/testenv"
)

// faultStartTimeout bounds how long a test-owned server may take to answer.
const faultStartTimeout = 15 * time.Second

// faultNeedBinary returns the path of a program the test starts, or skips
// the test (fails it under CI=true) when it is not installed.
func faultNeedBinary(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		testenv.Missing(t, name, "install it (Debian: apt-get install redis-server redis-tools)", err)
	}
	return path
}

// faultFreePort returns a loopback port that was free a moment ago. A
// server started on it may find it taken: start it with faultRetryBind.
func faultFreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("finding a free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// faultProc is a server process the test owns. Stop and the test's cleanup
// kill it with SIGKILL.
type faultProc struct {
	name string
	cmd  *exec.Cmd
	out  *testenv.Buffer // its output, for failure messages
	exit chan struct{}
}

// faultStartProc starts a program whose lifetime the test controls.
func faultStartProc(t testing.TB, name, bin string, args ...string) *faultProc {
	t.Helper()
	return faultStartCmd(t, name, exec.Command(bin, args...))
}

// faultStartCmd starts cmd, collecting its output, and kills it when the
// test ends.
func faultStartCmd(t testing.TB, name string, cmd *exec.Cmd) *faultProc {
	t.Helper()
	p := &faultProc{name: name, cmd: cmd, out: &testenv.Buffer{}, exit: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = faultSysProcAttr()
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() {
		p.cmd.Wait()
		close(p.exit)
	}()
	t.Cleanup(p.Kill)
	return p
}

// Stop sends sig and waits up to d for the process to exit, returning its
// exit code, or -1 when it did not exit in time (it is then killed).
func (p *faultProc) Stop(sig os.Signal, d time.Duration) int {
	p.cmd.Process.Signal(sig)
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

// Kill sends SIGKILL and waits for the process to be reaped. It is safe to
// call more than once.
func (p *faultProc) Kill() {
	select {
	case <-p.exit:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exit
}

// Exited reports whether the process has ended.
func (p *faultProc) Exited() bool {
	select {
	case <-p.exit:
		return true
	default:
		return false
	}
}

// faultRedis is a redis-server on a free loopback port, without
// persistence, in its own temporary directory.
type faultRedis struct {
	t     testing.TB
	bin   string
	port  int
	dir   string
	extra []string
	proc  *faultProc
}

// faultStartRedis starts a redis-server with extra arguments (such as
// "--replicaof", "127.0.0.1", "6380") on a free port and waits until it
// answers PING. A port taken between finding it free and the server's
// bind is retried with another one.
func faultStartRedis(t testing.TB, extra ...string) *faultRedis {
	t.Helper()
	r := &faultRedis{t: t, bin: faultNeedBinary(t, "redis-server"), dir: t.TempDir(), extra: extra}
	faultRetryBind(t, func() (*faultProc, error) {
		r.port = faultFreePort(t)
		return r.start()
	})
	return r
}

// faultRetryBind calls start, which starts a server on a port it found
// free, until the server does not fail to bind, up to 5 times.
func faultRetryBind(t testing.TB, start func() (*faultProc, error)) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		proc, err := start()
		if err == nil {
			return
		}
		if !strings.Contains(proc.out.String(), "Address already in use") || attempt == 5 {
			t.Fatal(err)
		}
		t.Logf("retrying on another port: %v", err)
	}
}

// Addr returns the server's host:port.
func (r *faultRedis) Addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

// Port returns the server's port.
func (r *faultRedis) Port() int { return r.port }

// Start starts the server on its port again after Kill, and waits until
// it answers PING.
func (r *faultRedis) Start() {
	r.t.Helper()
	if _, err := r.start(); err != nil {
		r.t.Fatal(err)
	}
}

// start starts the server on its port and waits until it answers PING.
func (r *faultRedis) start() (*faultProc, error) {
	args := append([]string{
		"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--dir", r.dir,
		"--save", "", "--appendonly", "no", "--protected-mode", "no", "--daemonize", "no",
	}, r.extra...)
	r.proc = faultStartProc(r.t, "redis-server :"+strconv.Itoa(r.port), r.bin, args...)
	return r.proc, faultPing(r.Addr(), r.proc)
}

// Kill stops the server at once with SIGKILL, as a crash would.
func (r *faultRedis) Kill() { r.proc.Kill() }

// Client returns a plain client to the server for the test's own checks.
func (r *faultRedis) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1, DialTimeout: time.Second})
	r.t.Cleanup(func() { c.Close() })
	return c
}

// faultWaitPing waits until the server at addr answers PING, failing the
// test when proc exits first or after faultStartTimeout.
func faultWaitPing(t testing.TB, addr string, proc *faultProc) {
	t.Helper()
	if err := faultPing(addr, proc); err != nil {
		t.Fatal(err)
	}
}

// faultPing waits until the server at addr answers PING, and returns an
// error when proc exits first or after faultStartTimeout.
func faultPing(addr string, proc *faultProc) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond, DialerRetries: 1})
	defer c.Close()
	var err error
	exited := false
	answered := testenv.Within(faultStartTimeout, func() bool {
		// Dial first, so that go-redis does not log every refused attempt.
		err = faultDial(addr)
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			err = c.Ping(ctx).Err()
			cancel()
		}
		var reply redis.Error
		if err == nil || errors.As(err, &reply) { // an error reply, such as NOAUTH, is an answer too
			return true
		}
		exited = proc.Exited()
		return exited
	})
	switch {
	case exited:
		return fmt.Errorf("%s exited before answering PING:\n%s", proc.name, proc.out)
	case !answered:
		return fmt.Errorf("%s did not answer PING within %v: %v\n%s", proc.name, faultStartTimeout, err, proc.out)
	}
	return nil
}

// faultDial reports whether addr accepts TCP connections.
func faultDial(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// faultEventually is testenv.Eventually, for the tests that still call it
// by this name.
func faultEventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, d, what, cond)
}

// faultSentinelSet is one master, one replica and three Sentinels
// monitoring them as faultMasterName.
type faultSentinelSet struct {
	Master, Replica *faultRedis
	Sentinels       []*faultRedis // Addr and Port only; started with --sentinel
}

const faultMasterName = "mymaster"

// faultStartSentinelSet starts the set and waits until the replica is in
// sync and every Sentinel knows the replica and the other Sentinels, so
// that a forced failover can proceed.
func faultStartSentinelSet(t testing.TB) *faultSentinelSet {
	t.Helper()
	master := faultStartRedis(t)
	replica := faultStartRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port()))
	rc := replica.Client()
	testenv.Eventually(t, faultStartTimeout, "the replica in sync with the master", func() bool {
		info, err := rc.Info(context.Background(), "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	set := &faultSentinelSet{Master: master, Replica: replica}
	bin := faultNeedBinary(t, "redis-server")
	for range 3 {
		s := &faultRedis{t: t, bin: bin, dir: t.TempDir()}
		faultRetryBind(t, func() (*faultProc, error) {
			s.port = faultFreePort(t)
			conf := filepath.Join(s.dir, "sentinel.conf")
			text := fmt.Sprintf(`port %d
bind 127.0.0.1
protected-mode no
dir %s
sentinel monitor %s 127.0.0.1 %d 2
sentinel down-after-milliseconds %[3]s 1000
sentinel failover-timeout %[3]s 10000
sentinel parallel-syncs %[3]s 1
`, s.port, s.dir, faultMasterName, master.Port())
			if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			s.proc = faultStartProc(t, "redis-sentinel :"+strconv.Itoa(s.port), bin, conf, "--sentinel")
			return s.proc, faultPing(s.Addr(), s.proc)
		})
		set.Sentinels = append(set.Sentinels, s)
	}
	for _, s := range set.Sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
		testenv.Eventually(t, faultStartTimeout, "sentinel "+s.Addr()+" seeing the replica and the other sentinels", func() bool {
			ctx := context.Background()
			m, err := sc.Master(ctx, faultMasterName).Result()
			if err != nil {
				return false
			}
			return m["num-slaves"] == "1" && m["num-other-sentinels"] == "2"
		})
		sc.Close()
	}
	return set
}

// Addrs returns the Sentinels' addresses.
func (s *faultSentinelSet) Addrs() []string {
	var out []string
	for _, r := range s.Sentinels {
		out = append(out, r.Addr())
	}
	return out
}

// MasterAddr asks the first Sentinel for the master's address.
func (s *faultSentinelSet) MasterAddr(ctx context.Context) (string, error) {
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Sentinels[0].Addr(), MaxRetries: -1})
	defer sc.Close()
	hp, err := sc.GetMasterAddrByName(ctx, faultMasterName).Result()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}

// Failover forces a failover, as `redis-cli -p PORT SENTINEL FAILOVER
// mymaster` does, retrying while the Sentinel has no replica it considers
// good yet, and waits until the Sentinels name the replica as master.
func (s *faultSentinelSet) Failover(t testing.TB) {
	t.Helper()
	cli := faultNeedBinary(t, "redis-cli")
	var out []byte
	var err error
	if !testenv.Within(faultStartTimeout, func() bool {
		out, err = exec.Command(cli, "-p", strconv.Itoa(s.Sentinels[0].Port()), "SENTINEL", "FAILOVER", faultMasterName).CombinedOutput()
		return err == nil && strings.TrimSpace(string(out)) == "OK"
	}) {
		t.Fatalf("SENTINEL FAILOVER never succeeded: %s %v", out, err)
	}
	testenv.Eventually(t, faultStartTimeout, "the sentinels naming the replica as master", func() bool {
		addr, err := s.MasterAddr(context.Background())
		return err == nil && addr == s.Replica.Addr()
	})
}

// faultCluster is a Redis Cluster of three masters without replicas.
type faultCluster struct {
	Nodes []*faultRedis
}

// faultStartCluster starts three cluster-enabled servers, joins them with
// `redis-cli --cluster create` and waits until every node reports
// cluster_state:ok.
func faultStartCluster(t testing.TB) *faultCluster {
	t.Helper()
	cli := faultNeedBinary(t, "redis-cli")
	c := &faultCluster{}
	for range 3 {
		// Both the client port and the bus port are picked again when
		// either bind fails.
		n := &faultRedis{t: t, bin: faultNeedBinary(t, "redis-server"), dir: t.TempDir()}
		faultRetryBind(t, func() (*faultProc, error) {
			n.port = faultFreePort(t)
			n.extra = []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
				"--cluster-node-timeout", "2000", "--cluster-port", strconv.Itoa(faultFreePort(t))}
			return n.start()
		})
		c.Nodes = append(c.Nodes, n)
	}
	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), faultStartTimeout)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, n := range c.Nodes {
		nc := n.Client()
		testenv.Eventually(t, faultStartTimeout, n.Addr()+" reporting cluster_state:ok", func() bool {
			info, err := nc.ClusterInfo(context.Background()).Result()
			return err == nil && strings.Contains(info, "cluster_state:ok")
		})
	}
	return c
}

// Addrs returns the nodes' addresses.
func (c *faultCluster) Addrs() []string {
	var out []string
	for _, n := range c.Nodes {
		out = append(out, n.Addr())
	}
	return out
}
