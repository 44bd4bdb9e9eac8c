package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/cli"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// The -fair mode measures fair shares among tenants (limit.fair,
// docs/fair.md) through `throttle run` (cli.Run, in process, -fair-replicas
// replicas; max_set_aside 15m, so that a backlog is set aside once) on
// RabbitMQ (ordering none) and a private redis-server, into an
// HTTP sink in this process that records when each tenant's messages
// arrive. Each run names one scenario:
//
//	two      tenant A has a backlog (-fair-backlog, 20,000); once the
//	         replicas have set aside what is over A's share, B sends 5/s
//	         for -fair-for: B's latency (publish to sink), A's rate,
//	         the longest time without a delivery meanwhile (the bucket
//	         idle) and the script calls per delivered message.
//	weights  three tenants with backlogs, weights 3:1:1, -fair-for of
//	         deliveries after a 5 s warm-up: their shares.
//	scale    -fair-tenants tenants (10,000) send together -fair-others of
//	         the rate, each message the next tenant's, for -fair-for; then
//	         one tenant publishes 100 seconds of the others' traffic at
//	         once and the others go on for -fair-for: the others' latency
//	         before and during the burst, Redis calls per message.
//	memory   -fair-tenants tenants each holding a reservation in a
//	         saturated bucket (one script call each, no consumer): MEMORY
//	         USAGE of the fair keys and used_memory's growth per tenant.
//	waits    no consumer: 200 callers of Buckets on the fair store, each
//	         asking for the next of -fair-tenants tenants, saturate the
//	         bucket for -fair-for; then 200 callers of one tenant join
//	         for -fair-for: the others' waits in WaitN before and during,
//	         with fair shares and without (fairWaits).
type fairConfig struct {
	scenario string
	replicas int
	rate     float64
	backlog  int
	runFor   time.Duration
	tenants  int
	others   float64 // the others' share of the rate (scale)
	amqpURL  string
	flags    string
	// cpuProfile, when set, is where the run's CPU profile goes
	// (-cpuprofile).
	cpuProfile string
}

// fairMsg is a message's body: tenant, sequence within the tenant, publish
// time (Unix ns).
type fairMsg struct {
	T int   `json:"t"`
	N int   `json:"n"`
	P int64 `json:"p"`
}

// fairSink records the first arrival of every message.
type fairSink struct {
	mu   sync.Mutex
	seen map[[2]int]bool
	arr  []fairArrival
	srv  *http.Server
	url  string
}

type fairArrival struct {
	t, n    int
	pub, at time.Time
}

func newFairSink() (*fairSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &fairSink{seen: map[[2]int]bool{}, url: "http://" + ln.Addr().String() + "/send"}
	s.srv = &http.Server{Handler: s}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *fairSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	b, _ := io.ReadAll(r.Body)
	var m fairMsg
	if json.Unmarshal(b, &m) != nil {
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	if k := [2]int{m.T, m.N}; !s.seen[k] {
		s.seen[k] = true
		s.arr = append(s.arr, fairArrival{t: m.T, n: m.N, pub: time.Unix(0, m.P), at: at})
	}
	s.mu.Unlock()
}

// arrivals returns a copy of the arrivals so far, in order.
func (s *fairSink) arrivals() []fairArrival {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.arr)
}

// fairRig is a queue, its publisher, the sink and the replicas.
type fairRig struct {
	cfg   fairConfig
	queue string
	conn  *amqp.Connection
	ch    *amqp.Channel
	sink  *fairSink
	rds   *privateRedis
	admin *redis.Client
	stop  context.CancelFunc
	done  chan error
	logs  syncWriter
	logb  strings.Builder
}

func newFairRig(ctx context.Context, cfg fairConfig) (*fairRig, error) {
	r := &fairRig{cfg: cfg, queue: "bench-fair-" + randomID()}
	r.logs.w = &r.logb
	var err error
	if r.rds, err = startRedis(ctx); err != nil {
		return nil, err
	}
	r.admin = redis.NewClient(&redis.Options{Addr: r.rds.addr})
	if r.sink, err = newFairSink(); err != nil {
		r.close()
		return nil, err
	}
	if r.conn, err = amqp.Dial(cfg.amqpURL); err != nil {
		r.close()
		return nil, fmt.Errorf("connecting to RabbitMQ: %w", err)
	}
	if r.ch, err = r.conn.Channel(); err == nil {
		err = declareRabbitQueue(r.ch, r.queue)
	}
	if err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

// start starts the replicas with limit.fair at rate (burst 5) and weights
// (YAML), and waits until they consume.
func (r *fairRig) start(ctx context.Context, weights string) error {
	runCtx, stop := context.WithCancel(ctx)
	r.stop = stop
	r.done = make(chan error, r.cfg.replicas)
	for i := range r.cfg.replicas {
		port, err := freePort()
		if err != nil {
			return err
		}
		yaml := fmt.Sprintf(`redis:
  addr: %s
limit:
  bucket: %s
  rate: %s
  burst: 5
  fair:
    key: '{{index .Headers "x-tenant"}}'
    weights: %s
source:
  rabbitmq:
    url: %s
    queue: %s
    prefetch: 200
    concurrency: 100
    ordering: none
    declare: true
sink:
  http:
    url: %s
    timeout: 5s
delivery:
  drain_timeout: 5s
  max_set_aside: 15m
metrics:
  listen: 127.0.0.1:%d
log:
  level: warn
`, r.rds.addr, r.queue, strconv.FormatFloat(r.cfg.rate, 'f', -1, 64), weights, r.cfg.amqpURL, r.queue, r.sink.url, port)
		path := fmt.Sprintf("%s/throttle-fair-%s-%d.yaml", os.TempDir(), r.queue, i)
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			return err
		}
		go func() {
			defer os.Remove(path)
			if code := cli.Run(runCtx, []string{"run", "--config", path}, io.Discard, &r.logs); code != cli.ExitOK {
				r.done <- fmt.Errorf("throttle run exited %d", code)
				return
			}
			r.done <- nil
		}()
	}
	return r.waitFor(ctx, time.Minute, "the replicas consuming", func() (bool, error) {
		q, err := r.ch.QueueDeclarePassive(r.queue, true, false, false, false, amqp.Table{"x-dead-letter-exchange": r.queue + ".dlx"})
		return err == nil && q.Consumers == r.cfg.replicas, err
	})
}

// waitFor polls cond every 50 ms until it holds, a replica stops or
// timeout passes.
func (r *fairRig) waitFor(ctx context.Context, timeout time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		select {
		case err := <-r.done:
			return fmt.Errorf("waiting for %s: a replica stopped: %v; log: %s", what, err, r.logb.String())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %v", what, timeout)
		}
	}
}

// queued returns the messages ready in the queue.
func (r *fairRig) queued() (int, error) {
	q, err := r.ch.QueueDeclarePassive(r.queue, true, false, false, false, amqp.Table{"x-dead-letter-exchange": r.queue + ".dlx"})
	return q.Messages, err
}

// publish publishes message n of tenant t, stamped now.
func (r *fairRig) publish(ctx context.Context, t, n int) error {
	body, _ := json.Marshal(fairMsg{T: t, N: n, P: time.Now().UnixNano()})
	return r.ch.PublishWithContext(ctx, "", r.queue, false, false, amqp.Publishing{
		ContentType: "application/json", Body: body, Headers: amqp.Table{"x-tenant": "t" + strconv.Itoa(t)},
	})
}

// publishAt publishes, for each i, message n of tenant tenant(i) at
// start + i/perSecond, until end, and returns how many.
func (r *fairRig) publishAt(ctx context.Context, start, end time.Time, perSecond float64, tenant func(i int) (t, n int)) (int, error) {
	for i := 0; ; i++ {
		at := start.Add(time.Duration(float64(i) / perSecond * float64(time.Second)))
		if !at.Before(end) {
			return i, nil
		}
		if d := time.Until(at); d > 0 {
			select {
			case <-ctx.Done():
				return i, ctx.Err()
			case <-time.After(d):
			}
		}
		t, n := tenant(i)
		if err := r.publish(ctx, t, n); err != nil {
			return i, err
		}
	}
}

func (r *fairRig) close() {
	if r.stop != nil {
		r.stop()
		for range r.cfg.replicas {
			<-r.done
		}
	}
	if r.ch != nil {
		_, _ = r.ch.QueueDelete(r.queue, false, false, false)
		_, _ = r.ch.QueueDelete(r.queue+".dlq", false, false, false)
		_ = r.ch.ExchangeDelete(r.queue+".dlx", false, false)
	}
	if r.conn != nil {
		r.conn.Close()
	}
	if r.sink != nil {
		_ = r.sink.srv.Close()
	}
	if r.admin != nil {
		r.admin.Close()
	}
	if r.rds != nil {
		r.rds.stop()
	}
}

// latencies returns the publish-to-sink latencies of as, sorted.
func latencies(as []fairArrival) []time.Duration {
	out := make([]time.Duration, 0, len(as))
	for _, a := range as {
		out = append(out, a.at.Sub(a.pub))
	}
	slices.Sort(out)
	return out
}

// pct returns the q-quantile of sorted ds (nearest rank).
func pct(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(q*float64(len(ds))+0.999999) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

func fmtLat(ds []time.Duration) string {
	return fmt.Sprintf("p50 %v, p99 %v, max %v over %d", pct(ds, 0.5).Round(time.Millisecond), pct(ds, 0.99).Round(time.Millisecond), pct(ds, 1).Round(time.Millisecond), len(ds))
}

// runFair runs cfg.scenario and prints its figures.
func runFair(ctx context.Context, cfg fairConfig) error {
	load0 := loadAverage()
	stopProfile, err := startCPUProfile(cfg.cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	var out string
	switch cfg.scenario {
	case "two":
		out, err = fairTwo(ctx, cfg)
	case "weights":
		out, err = fairWeights(ctx, cfg)
	case "scale":
		out, err = fairScale(ctx, cfg)
	case "memory":
		out, err = fairMemory(ctx, cfg)
	case "waits":
		out, err = fairWaits(ctx, cfg)
	default:
		err = fmt.Errorf("-fair: unknown scenario %q (two, weights, scale, memory, waits)", cfg.scenario)
	}
	if err != nil {
		return err
	}
	fmt.Printf("fair %s (%s): %s\nload average %s at the start, %s at the end\n", cfg.scenario, cfg.flags, out, load0, loadAverage())
	return nil
}

// fairTwo: A's backlog, then B at 5/s.
func fairTwo(ctx context.Context, cfg fairConfig) (string, error) {
	r, err := newFairRig(ctx, cfg)
	if err != nil {
		return "", err
	}
	defer r.close()
	for n := range cfg.backlog {
		if err := r.publish(ctx, 0, n); err != nil {
			return "", err
		}
	}
	before, err := snapshot(ctx, r.admin, nil)
	if err != nil {
		return "", err
	}
	t0 := time.Now()
	if err := r.start(ctx, "{}"); err != nil {
		return "", err
	}
	if err := r.waitFor(ctx, 30*time.Minute, "A's backlog set aside", func() (bool, error) {
		n, err := r.queued()
		return n < 50, err
	}); err != nil {
		return "", err
	}
	aside := time.Since(t0)
	start := time.Now()
	end := start.Add(cfg.runFor)
	nb, err := r.publishAt(ctx, start, end, 5, func(i int) (int, int) { return 1, i })
	if err != nil {
		return "", err
	}
	if err := r.waitFor(ctx, time.Minute, "B's messages delivered", func() (bool, error) {
		n := 0
		for _, a := range r.sink.arrivals() {
			if a.t == 1 {
				n++
			}
		}
		return n >= nb, nil
	}); err != nil {
		return "", err
	}
	after, err := snapshot(ctx, r.admin, nil)
	if err != nil {
		return "", err
	}
	var b []fairArrival
	na := 0
	// gap is the longest time without a delivery while B sent: the
	// bucket idle.
	var gap, gapAt time.Duration
	last := start
	all := r.sink.arrivals()
	for _, a := range all {
		if !a.at.Before(start) && a.at.Before(end) {
			if d := a.at.Sub(last); d > gap {
				gap, gapAt = d, last.Sub(start)
			}
			last = a.at
		}
		switch {
		case a.t == 1:
			b = append(b, a)
		case !a.at.Before(start) && a.at.Before(end):
			na++
		}
	}
	d := after.sub(before)
	return fmt.Sprintf("%d replicas at %v/s; A's %d set aside in %v; B sent %d at 5/s for %v: latency %s; A meanwhile %.1f/s; longest gap between deliveries %v (%v after B's first); %d script calls for %d messages delivered (%.2f per message)",
		cfg.replicas, cfg.rate, cfg.backlog, aside.Round(100*time.Millisecond), nb, cfg.runFor, fmtLat(latencies(b)), float64(na)/end.Sub(start).Seconds(),
		gap.Round(time.Millisecond), gapAt.Round(100*time.Millisecond), d.redis.scripts, len(all), float64(d.redis.scripts)/float64(len(all))), nil
}

// fairWeights: three backlogs, weights 3:1:1.
func fairWeights(ctx context.Context, cfg fairConfig) (string, error) {
	r, err := newFairRig(ctx, cfg)
	if err != nil {
		return "", err
	}
	defer r.close()
	per := cfg.backlog / 3
	for n := range per {
		for t := range 3 {
			if err := r.publish(ctx, t, n); err != nil {
				return "", err
			}
		}
	}
	if err := r.start(ctx, "{t0: 3}"); err != nil {
		return "", err
	}
	var first time.Time
	if err := r.waitFor(ctx, time.Minute, "the first delivery", func() (bool, error) {
		as := r.sink.arrivals()
		if len(as) > 0 {
			first = as[0].at
		}
		return len(as) > 0, nil
	}); err != nil {
		return "", err
	}
	from, to := first.Add(5*time.Second), first.Add(5*time.Second+cfg.runFor)
	if err := r.waitFor(ctx, cfg.runFor+time.Minute, "the window's end", func() (bool, error) { return time.Now().After(to), nil }); err != nil {
		return "", err
	}
	var n [3]int
	for _, a := range r.sink.arrivals() {
		if !a.at.Before(from) && a.at.Before(to) {
			n[a.t]++
		}
	}
	total := n[0] + n[1] + n[2]
	if total == 0 {
		return "", fmt.Errorf("nothing delivered in the window")
	}
	left := 0
	for t := range 3 {
		if n[t] >= per {
			left++
		}
	}
	s := func(i int) float64 { return float64(n[i]) / float64(total) }
	note := ""
	if left > 0 {
		note = " (a tenant ran out of backlog: raise -fair-backlog)"
	}
	return fmt.Sprintf("%d replicas at %v/s, backlogs of %d each, %v from 5 s after the first delivery: %v messages (%.1f/s), shares %.3f / %.3f / %.3f (want 0.600 / 0.200 / 0.200 ± 0.05)%s",
		cfg.replicas, cfg.rate, per, cfg.runFor, n, float64(total)/cfg.runFor.Seconds(), s(0), s(1), s(2), note), nil
}

// fairScale: many tenants, then one tenant's burst.
func fairScale(ctx context.Context, cfg fairConfig) (string, error) {
	r, err := newFairRig(ctx, cfg)
	if err != nil {
		return "", err
	}
	defer r.close()
	if err := r.start(ctx, "{}"); err != nil {
		return "", err
	}
	perSecond := cfg.rate * cfg.others
	// The others: each message the next tenant's (1..tenants), the n-th
	// round of them.
	next := 0
	other := func(int) (int, int) {
		i := next
		next++
		return 1 + i%cfg.tenants, i / cfg.tenants
	}
	before, err := snapshot(ctx, r.admin, nil)
	if err != nil {
		return "", err
	}
	start := time.Now()
	mid := start.Add(cfg.runFor)
	end := mid.Add(cfg.runFor)
	if _, err := r.publishAt(ctx, start, mid, perSecond, other); err != nil {
		return "", err
	}
	burst := int(100 * perSecond)
	errc := make(chan error, 1)
	go func() {
		for n := range burst {
			if err := r.publish(ctx, 0, n); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	if _, err := r.publishAt(ctx, mid, end, perSecond, other); err != nil {
		return "", err
	}
	if err := <-errc; err != nil {
		return "", err
	}
	sent := next
	if err := r.waitFor(ctx, 10*time.Minute, "the others' messages delivered", func() (bool, error) {
		n := 0
		for _, a := range r.sink.arrivals() {
			if a.t != 0 {
				n++
			}
		}
		return n >= sent, nil
	}); err != nil {
		return "", err
	}
	after, err := snapshot(ctx, r.admin, nil)
	if err != nil {
		return "", err
	}
	var base, during []fairArrival
	delivered, burstIn := 0, 0
	for _, a := range r.sink.arrivals() {
		delivered++
		switch {
		case a.t == 0:
			if a.at.Before(end) {
				burstIn++
			}
		case a.pub.Before(mid):
			base = append(base, a)
		default:
			during = append(during, a)
		}
	}
	d := after.sub(before)
	lb, ld := latencies(base), latencies(during)
	rise := float64(pct(ld, 0.99)-pct(lb, 0.99)) / float64(pct(lb, 0.99)) * 100
	return fmt.Sprintf("%d replicas at %v/s; %d tenants sending %.0f/s together, each message the next tenant's, for %v, then one tenant published %d at once and the others went on for %v. The others' latency before the burst: %s; during: %s (p99 %+.1f%%); the burst tenant got %d in the %v. Redis: %d script calls for %d messages delivered (%.3f per message; %.3f commands of any kind per message)",
		cfg.replicas, cfg.rate, cfg.tenants, perSecond, cfg.runFor, burst, cfg.runFor, fmtLat(lb), fmtLat(ld), rise, burstIn, cfg.runFor,
		d.redis.scripts, delivered, float64(d.redis.scripts)/float64(delivered), float64(d.redis.calls)/float64(delivered)), nil
}

// fairMemory: tenants each holding a reservation, what they cost Redis.
func fairMemory(ctx context.Context, cfg fairConfig) (string, error) {
	rds, err := startRedis(ctx)
	if err != nil {
		return "", err
	}
	defer rds.stop()
	c := redis.NewClient(&redis.Options{Addr: rds.addr})
	defer c.Close()
	bucket := "fair-memory-" + randomID()
	// 1/s: every tenant's reservation falls in a bin of its own, the
	// bins' worst case.
	l, err := fairStore(c, bucket, 1, 1)
	if err != nil {
		return "", err
	}
	used := func() (int64, error) {
		info, err := c.Info(ctx, "memory").Result()
		if err != nil {
			return 0, err
		}
		for line := range strings.SplitSeq(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
				return strconv.ParseInt(v, 10, 64)
			}
		}
		return 0, fmt.Errorf("no used_memory in INFO memory")
	}
	u0, err := used()
	if err != nil {
		return "", err
	}
	before, err := snapshot(ctx, c, nil)
	if err != nil {
		return "", err
	}
	for i := range cfg.tenants {
		res, err := l.TakeLayers(ctx, backend.LayerRequest{Cost: 1, MaxWait: 10 * time.Hour, Tenant: fmt.Sprintf("tenant-%05d", i)})
		if err != nil || !res.Granted {
			return "", fmt.Errorf("take %d: %+v %v", i, res, err)
		}
	}
	after, err := snapshot(ctx, c, nil)
	if err != nil {
		return "", err
	}
	u1, err := used()
	if err != nil {
		return "", err
	}
	var keys []string
	iter := c.Scan(ctx, 0, "*{"+bucket+"}:fair*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return "", err
	}
	var total int64
	enc := map[string]int{}
	for _, k := range keys {
		total += c.MemoryUsage(ctx, k, 0).Val()
		enc[c.ObjectEncoding(ctx, k).Val()]++
	}
	n := float64(cfg.tenants)
	d := after.sub(before)
	return fmt.Sprintf("%d tenants each holding a reservation (tenant-NNNNN, bucket at 1/s): MEMORY USAGE of the %d fair keys %d bytes, %.1f per tenant (encodings %v); used_memory grew %.1f per tenant; %.2f script calls per take",
		cfg.tenants, len(keys), total, float64(total)/n, enc, float64(u1-u0)/n, float64(d.redis.scripts)/n), nil
}

// fairStore returns the Redis store of bucket at rate and burst with fair
// shares (default weights and horizon) and no layers.
func fairStore(c *redis.Client, bucket string, rate float64, burst int) (*redislimiter.Layered, error) {
	s, err := redislimiter.New(c, redislimiter.Config{Bucket: bucket, Rate: rate, Burst: burst})
	if err != nil {
		return nil, err
	}
	l, err := s.WithLayers(nil)
	if err != nil {
		return nil, err
	}
	return l.WithFair(limiter.Fair{})
}

// fairWaits: the fair decision alone, the others' waits in the limiter
// rather than their latency through a queue. -fair-replicas Buckets, each
// with its own client, on one fair store in a private redis-server at
// -fair-rate (300/s), burst 5, leasing off. fairWaitCallers callers over
// the replicas, each asking for the next of -fair-tenants tenants, keep
// the bucket saturated for -fair-for; then one tenant's callers, as many
// as all the others', join for -fair-for. Run with fair shares, then, as
// the control, with the same callers outside them (Tenant ""). A wait is
// WaitN's duration, its sleeps when set aside included; the first 5 s of
// the first phase are not counted (the queue forming).
func fairWaits(ctx context.Context, cfg fairConfig) (string, error) {
	var out []string
	for _, fair := range []bool{true, false} {
		s, err := fairWaitsRun(ctx, cfg, fair)
		if err != nil {
			return "", err
		}
		out = append(out, s)
	}
	return strings.Join(out, "\n"), nil
}

// fairWaitCallers is how many callers keep the bucket saturated in
// fairWaits, and how many the burst's tenant brings; fairWaitWaiting is
// their Request.FairWaiting, consumer.LimitOptions.TenantWaiting's
// default: beyond it a request refused by its tenant's share sleeps until
// the room the refusal names, as a message set aside would.
const (
	fairWaitCallers = 200
	fairWaitWaiting = 4
)

func fairWaitsRun(ctx context.Context, cfg fairConfig, fair bool) (string, error) {
	rds, err := startRedis(ctx)
	if err != nil {
		return "", err
	}
	defer rds.stop()
	admin := redis.NewClient(&redis.Options{Addr: rds.addr})
	defer admin.Close()
	name := "fair-waits-" + randomID()
	buckets := make([]*limiter.Bucket, cfg.replicas)
	for i := range buckets {
		c := redis.NewClient(&redis.Options{Addr: rds.addr, PoolSize: 2 * fairWaitCallers})
		defer c.Close()
		l, err := fairStore(c, name, cfg.rate, 5)
		if err != nil {
			return "", err
		}
		b, err := limiter.New(l, limiter.Options{Lease: limiter.LeaseOptions{Disabled: true}})
		if err != nil {
			return "", err
		}
		defer b.Close()
		buckets[i] = b
	}
	type wait struct {
		at time.Time
		d  time.Duration
	}
	var (
		mu     sync.Mutex
		others []wait
		burstN int
		next   int
		wg     sync.WaitGroup
	)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 2*fairWaitCallers)
	call := func(b *limiter.Bucket, tenant func() string, burst bool) {
		defer wg.Done()
		for runCtx.Err() == nil {
			t := tenant()
			if !fair {
				t = ""
			}
			t0 := time.Now()
			for {
				err := b.WaitN(runCtx, limiter.Request{Cost: 1, Tenant: t, FairWaiting: fairWaitWaiting})
				var le *limiter.LimitError
				if errors.As(err, &le) && le.Layer == limiter.FairLayer && le.Action == limiter.ActionDelay {
					// Set aside, as a consumer does: back when the
					// tenant has room.
					select {
					case <-time.After(le.Wait):
						continue
					case <-runCtx.Done():
						return
					}
				}
				if err != nil {
					if runCtx.Err() == nil {
						errc <- err
					}
					return
				}
				break
			}
			mu.Lock()
			if burst {
				burstN++
			} else {
				others = append(others, wait{t0, time.Since(t0)})
			}
			mu.Unlock()
		}
	}
	other := func() string {
		mu.Lock()
		defer mu.Unlock()
		next++
		return fmt.Sprintf("tenant-%05d", 1+next%cfg.tenants)
	}
	before, err := snapshot(ctx, admin, nil)
	if err != nil {
		return "", err
	}
	start := time.Now()
	for i := range fairWaitCallers {
		wg.Add(1)
		go call(buckets[i%len(buckets)], other, false)
	}
	sleep := func(d time.Duration) error {
		select {
		case <-time.After(d):
			return nil
		case err := <-errc:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := sleep(cfg.runFor); err != nil {
		return "", err
	}
	mid := time.Now()
	mu.Lock()
	granted0 := len(others)
	mu.Unlock()
	for i := range fairWaitCallers {
		wg.Add(1)
		go call(buckets[i%len(buckets)], func() string { return "tenant-00000" }, true)
	}
	if err := sleep(cfg.runFor); err != nil {
		return "", err
	}
	end := time.Now()
	stop()
	wg.Wait()
	after, err := snapshot(ctx, admin, nil)
	if err != nil {
		return "", err
	}
	var base, during []time.Duration
	for _, w := range others {
		switch {
		case w.at.Before(start.Add(5 * time.Second)):
		case w.at.Before(mid):
			base = append(base, w.d)
		case w.at.Before(end):
			during = append(during, w.d)
		}
	}
	slices.Sort(base)
	slices.Sort(during)
	rise := float64(pct(during, 0.99)-pct(base, 0.99)) / float64(pct(base, 0.99)) * 100
	othersDuring := len(others) - granted0
	how := "fair shares"
	if !fair {
		how = "without fair shares (control)"
	}
	d := after.sub(before)
	return fmt.Sprintf("%s: %d replicas at %v/s, %d callers over %d tenants for %v, then %d callers of one tenant join for %v. The others' waits before: %s; during: %s (p99 %+.1f%%); in the second phase the others got %d (%.1f/s), the burst's tenant %d (%.1f/s); %.3f script calls per grant",
		how, cfg.replicas, cfg.rate, fairWaitCallers, cfg.tenants, cfg.runFor, fairWaitCallers, cfg.runFor,
		fmtLat(base), fmtLat(during), rise, othersDuring, float64(othersDuring)/end.Sub(mid).Seconds(), burstN, float64(burstN)/end.Sub(mid).Seconds(),
		float64(d.redis.scripts)/float64(len(others)+burstN)), nil
}
