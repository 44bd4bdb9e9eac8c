package integration

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/internal/faultproxy"
	"github.com/throttlehq/throttle/internal/testenv"
)

// The tests in this file: Redis and RabbitMQ
// that refuse the replica (a wrong password, missing permissions, a wrong
// database) are not outages, and a replica that is not connected is not
// ready.

// faultLastLine returns the last non-empty line of s.
func faultLastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// TestFaultRedisRefusesAtStart starts replicas against a test-owned Redis
// that refuses them and checks that each exits 1 within 15 s with one
// sentence that names the problem, and never the password. Before:
// two replicas with a wrong password limited locally at the whole rate
// each and answered /readyz with 200.
func TestFaultRedisRefusesAtStart(t *testing.T) {
	t.Parallel()
	const secret = "s3cret-Pa55"
	srv := faultStartRedis(t, "--requirepass", secret)
	ctx := context.Background()
	admin := srv.Client()
	if err := admin.Do(ctx, "AUTH", secret).Err(); err != nil {
		t.Fatalf("AUTH: %v", err)
	}
	// A user without the scripting commands the bucket needs.
	if err := admin.Do(ctx, "ACL", "SETUSER", "noscripts", "on", ">"+secret, "~*", "&*", "+@all", "-@scripting").Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	noScripts := faultStartRedis(t, "--rename-command", "EVALSHA", "", "--rename-command", "EVAL", "")
	addr := "  addr: " + srv.Addr() + "\n"
	for _, tc := range []struct {
		name     string
		redis    string
		replicas int
		want     *regexp.Regexp // what the sentence names
	}{
		{"wrong password", addr + "  password: wrong-" + secret + "\n", 2, regexp.MustCompile(`(?i)password|WRONGPASS`)},
		{"no password", addr, 1, regexp.MustCompile(`(?i)NOAUTH|password`)},
		{"no permission", addr + "  username: noscripts\n  password: " + secret + "\n", 1, regexp.MustCompile(`(?i)NOPERM|permission`)},
		{"wrong db", addr + "  password: " + secret + "\n  db: 99\n", 1, regexp.MustCompile(`(?i)\bdb\b|database`)},
		{"scripts disabled", "  addr: " + noScripts.Addr() + "\n", 1, regexp.MustCompile(`(?i)script|evalsha`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := faultNewFleet(t)
			spec := faultFleetSpec{Redis: tc.redis, Burst: 5, OnStoreError: "local"}
			var procs []*faultFleetProc
			for range tc.replicas {
				procs = append(procs, f.Start(spec, 20))
			}
			for _, p := range procs {
				if code := p.Stop(nil, 15*time.Second); code != 1 {
					t.Errorf("%s: exit code %d, want 1 within 15 s", p.name, code)
					continue
				}
				out := p.out.String()
				last := faultLastLine(out)
				t.Logf("%s: exit 1: %s", p.name, last)
				if !strings.HasPrefix(last, "throttle: ") || !strings.Contains(strings.ToLower(last), "redis") || !tc.want.MatchString(last) {
					t.Errorf("%s: last line %q, want one sentence \"throttle: ...\" about Redis that matches %v", p.name, last, tc.want)
				}
				if strings.HasSuffix(last, "..") {
					t.Errorf("%s: last line %q ends in \"..\"", p.name, last)
				}
				if strings.Contains(out, secret) {
					t.Errorf("%s: the output holds the password:\n%s", p.name, out)
				}
			}
			if n, _ := f.Sink.counts(); n > 0 {
				t.Errorf("%d messages were delivered by replicas that Redis refused", n)
			}
		})
	}
}

// TestFaultRedisRefusesAtRunTime makes a test-owned Redis require a
// password while a replica runs on it, and drops the replica's
// connections: the replica must stop delivering (act as closed), log an
// error, and answer /readyz with 503.
func TestFaultRedisRefusesAtRunTime(t *testing.T) {
	t.Parallel()
	const (
		rate  = 20.0
		burst = 5
	)
	srv := faultStartRedis(t)
	f := faultStartFleet(t, faultFleetSpec{
		Redis: "  addr: " + srv.Addr() + "\n", Rates: []float64{rate}, Burst: burst, OnStoreError: "local", Metrics: true,
	})
	metrics := f.Procs[0].MetricsAddr(t)
	f.Publish(0, 400)
	faultWaitFlowing(t, f, 2*burst)
	ctx := context.Background()
	admin := srv.Client()
	if err := admin.ConfigSet(ctx, "requirepass", "now-required").Err(); err != nil {
		t.Fatalf("CONFIG SET requirepass: %v", err)
	}
	refusedAt := time.Now()
	for _, typ := range []string{"normal", "pubsub"} {
		if err := admin.Do(ctx, "CLIENT", "KILL", "TYPE", typ).Err(); err != nil {
			t.Fatalf("CLIENT KILL TYPE %s: %v", typ, err)
		}
	}
	testenv.Eventually(t, 5*time.Second, "/readyz answering 503 while Redis refuses the replica", func() bool {
		code, _ := cliGet("http://" + metrics + "/readyz")
		return code == 503
	})
	settled := refusedAt.Add(2 * time.Second)
	faultSleepUntil(ctx, settled.Add(3*time.Second))
	ts := f.Sink.times()
	n := faultCount(ts, settled, settled.Add(3*time.Second))
	t.Logf("Redis refused the replica from +0: deliveries per second %v", faultPerSecond(ts, refusedAt.Add(-2*time.Second), settled.Add(3*time.Second)))
	if n > 0 {
		t.Errorf("%d deliveries from 2 s to 5 s after Redis refused the replica, want 0 (closed)", n)
	}
	if code, body := cliGet("http://" + metrics + "/readyz"); code != 503 {
		t.Errorf("/readyz answered %d %q while Redis refused the replica, want 503", code, body)
	}
	// Redis answers a client that has not authenticated with NOAUTH, or,
	// for a long command, with "Protocol error: unauthenticated ...".
	refusal := regexp.MustCompile(`NOAUTH|unauthenticated`)
	var logged bool
	for _, rec := range faultLogRecords(f.Procs[0].out.String()) {
		if rec["level"] == "ERROR" && refusal.MatchString(fmt.Sprint(rec)) {
			logged = true
			t.Logf("logged: %v", rec)
		}
	}
	if !logged {
		t.Error("no log record at level ERROR names Redis's refusal (NOAUTH or unauthenticated)")
	}
	f.Stop()
}

// TestFaultFleetStartDuringOutage starts three replicas at a shared 20/s,
// burst 5, with on_store_error local, while their Redis is down, and starts
// Redis 10 s later. A replica that has never reached Redis does not know
// how many replicas share the bucket; together they must deliver at most 1.1× the limit (each took the whole rate: 3×). The
// limiter's rule: without limit.fallback_rate such a replica does not
// grant until Redis answers; with it, it runs at fallback_rate. Once Redis
// answers they share the bucket: deliveries resume, and no 1 s window
// holds more than rate + 2 × burst.
func TestFaultFleetStartDuringOutage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		extra string
	}{
		{"without fallback_rate", ""},
		{"fallback_rate a third", "  fallback_rate: 6.67\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			faultStartDuringOutage(t, tc.extra)
		})
	}
}

func faultStartDuringOutage(t *testing.T, limitExtra string) {
	const (
		rate  = 20.0
		burst = 5
		span  = 10 * time.Second
	)
	srv := faultStartRedis(t)
	srv.Kill()
	f := faultStartFleet(t, faultFleetSpec{
		Redis: "  addr: " + srv.Addr() + "\n", Rates: []float64{rate, rate, rate}, Burst: burst,
		OnStoreError: "local", LimitExtra: limitExtra,
	})
	f.Publish(0, 600)
	start := time.Now()
	ctx := context.Background()
	faultSleepUntil(ctx, start.Add(span))
	upAt := time.Now()
	srv.Start()
	testenv.Eventually(t, 20*time.Second, "deliveries after Redis came up", func() bool {
		return faultCount(f.Sink.times(), upAt, time.Now()) >= 2*burst
	})
	resumed := time.Now()
	faultSleepUntil(ctx, resumed.Add(5*time.Second))
	end := time.Now()
	f.Stop()
	ts := f.Sink.times()
	n := faultCount(ts, start, upAt)
	limit := 1.1*rate*span.Seconds() + burst
	t.Logf("3 replicas started during an outage, limit %v/s burst %d: %d deliveries in the %v before Redis came up (%.1f/s), per second %v; bound %.0f",
		rate, burst, n, span, float64(n)/span.Seconds(), faultPerSecond(ts, start, upAt), limit)
	if float64(n) > limit {
		t.Errorf("%d deliveries in %v, want at most %.0f (1.1 × the limit, and one burst)", n, span, limit)
	}
	t.Logf("Redis up at +%.1f s; deliveries resumed %v later", upAt.Sub(start).Seconds(), resumed.Sub(upAt).Round(time.Millisecond))
	faultReport(t, f, rate, burst, upAt, end, int(rate)+2*burst, faultPhase{"after Redis came up", upAt, end})
}

// TestFaultRabbitMQRefusesAtStart starts a replica with a wrong AMQP
// password: it must exit 1 within 15 s with one sentence that says the
// broker refused it, and never print the password. It once
// logged "Exception (403)" every 3 s forever.
func TestFaultRabbitMQRefusesAtStart(t *testing.T) {
	t.Parallel()
	f := faultNewFleet(t)
	u, err := url.Parse(f.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	const secret = "wrong-Pa55-for-test"
	u.User = url.UserPassword(u.User.Username(), secret)
	srv := faultStartRedis(t)
	p := f.Start(faultFleetSpec{Redis: "  addr: " + srv.Addr() + "\n", Burst: 5, Env: []string{"FAULT_AMQP_URL=" + u.String()}}, 20)
	code := p.Stop(nil, 15*time.Second)
	out := p.out.String()
	last := faultLastLine(out)
	t.Logf("exit %d: %s", code, last)
	if code != 1 {
		t.Fatalf("exit code %d, want 1 within 15 s", code)
	}
	if !strings.HasPrefix(last, "throttle: ") || !regexp.MustCompile(`(?i)access refused|ACCESS_REFUSED|403`).MatchString(last) {
		t.Errorf("last line %q, want one sentence \"throttle: ...\" saying the broker refused access", last)
	}
	if strings.Contains(out, secret) {
		t.Errorf("the output holds the password:\n%s", out)
	}
}

// TestFaultRabbitMQDisconnected cuts a running replica off RabbitMQ for 6 s
// (every connection through a proxy is cut as soon as it opens): /readyz
// must answer 503 meanwhile, every reconnect attempt must be counted in
// throttle_reconnects_total, and /readyz must answer 200 again once the
// replica is back.
func TestFaultRabbitMQDisconnected(t *testing.T) {
	t.Parallel()
	f := faultNewFleet(t)
	u, err := url.Parse(f.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.New(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	u.Host = proxy.Addr()
	srv := faultStartRedis(t)
	spec := faultFleetSpec{Redis: "  addr: " + srv.Addr() + "\n", Burst: 5, Metrics: true, Env: []string{"FAULT_AMQP_URL=" + u.String()}}
	p := f.Start(spec, 50)
	f.WaitConsumers(1)
	metrics := p.MetricsAddr(t)
	testenv.Eventually(t, 10*time.Second, "/readyz answering 200", func() bool {
		code, _ := cliGet("http://" + metrics + "/readyz")
		return code == 200
	})
	ctx, stop := context.WithCancel(context.Background())
	cutting := make(chan struct{})
	go func() {
		defer close(cutting)
		for ctx.Err() == nil {
			proxy.Cut()
			time.Sleep(5 * time.Millisecond)
		}
	}()
	cutAt := time.Now()
	testenv.Eventually(t, 5*time.Second, "/readyz answering 503 while the replica is cut off RabbitMQ", func() bool {
		code, _ := cliGet("http://" + metrics + "/readyz")
		return code == 503
	})
	notReady := time.Since(cutAt)
	var ready200 int
	for time.Since(cutAt) < 6*time.Second {
		if code, _ := cliGet("http://" + metrics + "/readyz"); code == 200 {
			ready200++
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, body := cliGet("http://" + metrics + "/metrics")
	attempts := cliMetric(body, "throttle_reconnects_total")
	accepted := proxy.Accepted()
	stop()
	<-cutting
	testenv.Eventually(t, 30*time.Second, "/readyz answering 200 again after RabbitMQ came back", func() bool {
		code, _ := cliGet("http://" + metrics + "/readyz")
		return code == 200
	})
	t.Logf("cut off RabbitMQ for 6 s: /readyz 503 after %v, 200 on %d probes meanwhile; throttle_reconnects_total %v; the proxy accepted %d connections",
		notReady.Round(time.Millisecond), ready200, attempts, accepted)
	if ready200 > 0 {
		t.Errorf("/readyz answered 200 %d times while the replica was cut off", ready200)
	}
	// The first connection was not a reconnect; every later one that the
	// proxy accepted during the cut was an attempt.
	if attempts < 2 || attempts < float64(accepted-1)/2 {
		t.Errorf("throttle_reconnects_total = %v after 6 s cut off, with %d connections accepted by the proxy: want every attempt counted", attempts, accepted)
	}
	f.Stop()
}
