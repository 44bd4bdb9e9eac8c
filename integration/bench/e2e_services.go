package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// The end-to-end scenarios need an HTTP sink and a Kafka broker (kfake).
// Both run in a child process, this same binary started with
// -serve-services, so that the CPU, allocation, block and mutex profiles of
// the bench process show the consumer under test only, and so that the sink
// and the broker weigh the same on every consumer compared.

// servicesFlag starts the child process's mode.
const servicesFlag = "-serve-services"

// servicesInfo is the line the child prints once it serves.
type servicesInfo struct {
	Sink  string   `json:"sink"`  // base URL of the HTTP sink
	Kafka []string `json:"kafka"` // kfake broker addresses
}

// maxArrivals bounds the arrivals a sink records between two resets.
const maxArrivals = 1 << 21

// sinkServer is the HTTP sink: it answers every request 200 with an empty
// body after reading the request body and waiting latency, and records when
// each arrived.
type sinkServer struct {
	latency time.Duration
	start   atomic.Pointer[time.Time]
	n       atomic.Int64
	at      []int64      // ns since start, of each arrival, up to maxArrivals
	spans   atomic.Int64 // spans received on /v1/traces (OTLP/HTTP) since the reset
}

func (s *sinkServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/reset":
		now := time.Now()
		s.start.Store(&now)
		s.n.Store(0)
		s.spans.Store(0)
		return
	case "/count":
		fmt.Fprint(w, s.n.Load())
		return
	case "/spans":
		fmt.Fprint(w, s.spans.Load())
		return
	case "/v1/traces":
		// The OTLP/HTTP receiver of the tracing runs: it decodes each
		// export and counts its spans, in this child process.
		body, _ := io.ReadAll(r.Body)
		var export coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &export); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, rs := range export.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				s.spans.Add(int64(len(ss.Spans)))
			}
		}
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
		return
	case "/stats":
		n := min(s.n.Load(), maxArrivals)
		_ = json.NewEncoder(w).Encode(sinkStats{N: s.n.Load(), At: s.at[:n]})
		return
	}
	_, _ = io.Copy(io.Discard, r.Body)
	if i := s.n.Add(1) - 1; i < maxArrivals {
		s.at[i] = int64(time.Since(*s.start.Load()))
	}
	if s.latency > 0 {
		time.Sleep(s.latency)
	}
}

// sinkStats is what the sink recorded since its last reset. At is in the
// order the requests were counted, which may differ from time order by a
// few microseconds.
type sinkStats struct {
	N  int64   `json:"n"`
	At []int64 `json:"at"`
}

// serveServices is the child process: it serves the sink and kfake until
// its standard input closes. args may set the sink's latency
// (-sink-latency).
func serveServices(args []string) error {
	fs := flag.NewFlagSet(servicesFlag, flag.ContinueOnError)
	latency := fs.Duration("sink-latency", 0, "how long the sink takes to answer")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	sink := &sinkServer{at: make([]int64, maxArrivals), latency: *latency}
	now := time.Now()
	sink.start.Store(&now)
	srv := &http.Server{Handler: sink, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.ListenFn(func(network, _ string) (net.Listener, error) {
		return net.Listen(network, "127.0.0.1:0")
	}), kfake.AllowAutoTopicCreation(), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		return err
	}
	defer cluster.Close()
	info, _ := json.Marshal(servicesInfo{Sink: "http://" + ln.Addr().String(), Kafka: cluster.ListenAddrs()})
	fmt.Println(string(info))
	_, _ = io.Copy(io.Discard, os.Stdin) // until the parent exits
	return nil
}

// services is the running child process, seen from the bench.
type services struct {
	servicesInfo
	cmd   *exec.Cmd
	stdin io.WriteCloser
	http  *http.Client
}

// startServices starts the child process, its sink answering after
// sinkLatency, and waits until it serves.
func startServices(ctx context.Context, sinkLatency time.Duration) (*services, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, exe, servicesFlag, "-sink-latency", sinkLatency.String())
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the services process: %w", err)
	}
	s := &services{cmd: cmd, stdin: stdin, http: &http.Client{Timeout: 30 * time.Second}}
	line, err := bufio.NewReader(out).ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(line, &s.servicesInfo)
	}
	if err != nil {
		s.stop()
		return nil, fmt.Errorf("reading the services' addresses: %w", err)
	}
	return s, nil
}

// cpu is the user and system time the child process has used, from
// /proc (0 where that cannot be read).
func (s *services) cpu() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// The fields after the command's name, in parentheses: utime and
	// stime are the 12th and 13th, in clock ticks (100 a second).
	_, rest, ok := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+st) * 10 * time.Millisecond
}

func (s *services) stop() {
	s.stdin.Close()
	_ = s.cmd.Wait()
}

// resetSink zeroes the sink's count and clock.
func (s *services) resetSink(ctx context.Context) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.Sink+"/reset", nil)
	resp, err := s.http.Do(req)
	if err != nil {
		return fmt.Errorf("resetting the sink: %w", err)
	}
	resp.Body.Close()
	return nil
}

// sinkCount is the number of requests the sink answered since its reset.
func (s *services) sinkCount(ctx context.Context) (int64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.Sink+"/count", nil)
	resp, err := s.http.Do(req)
	if err != nil {
		return 0, fmt.Errorf("reading the sink's count: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("reading the sink's count: %w", err)
	}
	return strconv.ParseInt(string(b), 10, 64)
}

// sinkSpans is the number of spans the OTLP receiver counted since the
// sink's reset.
func (s *services) sinkSpans(ctx context.Context) (int64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.Sink+"/spans", nil)
	resp, err := s.http.Do(req)
	if err != nil {
		return 0, fmt.Errorf("reading the span count: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("reading the span count: %w", err)
	}
	return strconv.ParseInt(string(b), 10, 64)
}

// sinkStats returns what the sink recorded since its reset.
func (s *services) sinkStats(ctx context.Context) (sinkStats, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.Sink+"/stats", nil)
	resp, err := s.http.Do(req)
	if err != nil {
		return sinkStats{}, fmt.Errorf("reading the sink's stats: %w", err)
	}
	defer resp.Body.Close()
	var st sinkStats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return sinkStats{}, fmt.Errorf("reading the sink's stats: %w", err)
	}
	return st, nil
}

// privateRedis is a redis-server this program starts for the end-to-end
// scenarios, so that INFO commandstats counts the consumer's calls and
// nobody else's.
type privateRedis struct {
	addr string
	cmd  *exec.Cmd
}

func startRedis(ctx context.Context) (*privateRedis, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning")
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting redis-server (needed for exact Redis counts): %w", err)
	}
	r := &privateRedis{addr: "127.0.0.1:" + strconv.Itoa(port), cmd: cmd}
	c := redis.NewClient(&redis.Options{Addr: r.addr})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := c.Ping(ctx).Err(); err == nil {
			return r, nil
		} else if time.Now().After(deadline) || ctx.Err() != nil {
			r.stop()
			return nil, fmt.Errorf("redis-server on %s does not answer: %w", r.addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *privateRedis) stop() {
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
}
