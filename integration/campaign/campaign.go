// Package campaign is a seeded fault campaign against a fleet of
// `throttle run` processes, in the manner of Jepsen and FoundationDB's
// simulation: a nemesis injects faults chosen at random from a seed on a
// schedule (Plan) while a publisher sends a seeded workload (Workload), and
// a checker (Check) reads what the recording sink received and verifies
// every promise the documentation makes for the faults involved
// (docs/operations.md, Failure modes).
//
// The fleet: replicas of the binary consume one RabbitMQ queue through a
// faultproxy (so a cut breaks only their connections) and share one bucket
// in a private redis-server, also behind a faultproxy, with a per-sender
// token bucket (on_exceed: wait), a per-recipient one (on_exceed: delay,
// through the delay queue), an hourly quota per account (on_exceed:
// dead_letter), and priority classes from a header. Run is used by the
// integration test (TestCampaign, about a minute) and by the benchmark
// program's -campaign mode (any length); the two share this one
// implementation. docs/campaign.md describes it.
package campaign

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/throttlehq/throttle/internal/faultproxy"
)

// The fleet's limits.
const (
	Rate        = 20.0 // the shared bucket, per second
	Burst       = 5
	Prefetch    = 20 // per replica: also the duplicates a SIGKILL or a cut may cause
	Replicas    = 3  // at the start
	MaxReplicas = 5
	SenderRate  = 5.0       // per-sender, per second, burst 1, wait
	RecipRate   = 30.0 / 60 // per-recipient, per second, burst 1, delay
	Quota       = 10        // per account and UTC hour, dead_letter
	// Settle is how long after a Redis fault is healed its allowances
	// hold: a replica returns within probe_interval (1 s) and the
	// heartbeats rebuild the replica count within 3 s.
	Settle = 5 * time.Second
	// ArrivalAllowance is the windows' allowance for the sink's arrival
	// jitter: a grant reaches the sink 1–50 ms after the limiter's
	// instant on a loaded 2-core machine, so a window of arrivals may
	// hold grants from 50 ms more, rate × 50 ms = 1 more at 20/s (a 1 s
	// window measured 26 against 25 once under the whole suite's load).
	ArrivalAllowance = 1
)

// Config says how to run a campaign.
type Config struct {
	Seed int64
	// Duration is how long the nemesis acts and the publisher sends;
	// the run also starts the fleet and waits for the backlog to drain.
	Duration time.Duration
	// Bin is the throttle binary (Build makes one).
	Bin string
	// AMQPURL is RabbitMQ's URL; default amqp://guest:guest@127.0.0.1:5672/.
	AMQPURL string
	// RedisServer is the redis-server program; found on PATH when empty.
	RedisServer string
	// Dir holds the configs and the Redis files; it must exist.
	Dir string
	// Name is the bucket's and the queue's name; default one made of the
	// seed and a random suffix.
	Name string
	// LogDir, when set, receives each replica's whole log at the end, as
	// replica-N.log.
	LogDir string
	// LogLevel is the replicas' log.level; default info.
	LogLevel string
	// Logf receives the progress, the schedule as it runs and the
	// checker's report; nil discards it.
	Logf func(format string, args ...any)
}

// Outcome is a campaign's result. Violations lists every broken promise;
// Run's error is for a campaign that could not run.
type Outcome struct {
	Seed      int64
	Name      string
	Schedule  []Step
	Published int
	// FaultTime is the time some fault was in force: the holds, and
	// Settle after each fault, merged.
	FaultTime time.Duration
	Took      time.Duration
	Report    *Report
	// Violations are the checker's, and what went wrong outside it, such
	// as a replica that did not exit 0 on SIGTERM.
	Violations []string
}

// OK reports whether the campaign kept every promise.
func (o *Outcome) OK() bool { return len(o.Violations) == 0 }

// replica is one `throttle run` process of the fleet.
type replica struct {
	n    int // 1, 2, ... in start order
	proc *Proc
	// ended is set when the campaign stops or kills it: a replica that
	// exits without it ended on its own, which is a broken promise.
	ended bool
}

// run is one campaign in progress.
type run struct {
	cfg       Config
	logf      func(string, ...any)
	start     time.Time // the nemesis's and the publisher's start
	name      string
	config    string // the replicas' config file
	redis     *Redis
	redisPx   *faultproxy.Proxy
	amqpPx    *faultproxy.Proxy
	conn      *amqp.Connection
	sink      *Sink
	stalls    *Stalls
	replicas  []*replica
	started   int
	published map[int]Arrival

	mu           sync.Mutex
	overrides    []RateChange
	disturbances []Disturbance
	faults       [][2]time.Time // every fault's span, for FaultTime
	dupBound     int
	notes        []string
	events       []Event
}

func (r *run) event(at time.Time, what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, Event{At: at, What: what})
}

func (r *run) note(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	msg := fmt.Sprintf(format, args...)
	r.notes = append(r.notes, msg)
	r.logf("VIOLATION: %s", msg)
}

// Run runs one campaign: it starts the fleet, runs the schedule of
// cfg.Seed while publishing the workload, heals every fault, waits for the
// backlog to drain, stops the fleet and checks what the sink received.
func Run(ctx context.Context, cfg Config) (*Outcome, error) {
	if cfg.Duration <= 0 {
		cfg.Duration = 40 * time.Second
	}
	if cfg.AMQPURL == "" {
		cfg.AMQPURL = "amqp://guest:guest@127.0.0.1:5672/"
	}
	if cfg.Name == "" {
		cfg.Name = fmt.Sprintf("campaign-%d-%04x", cfg.Seed, rand.IntN(1<<16))
	}
	logf := cfg.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	began := time.Now()
	r := &run{cfg: cfg, logf: logf, name: cfg.Name, published: map[int]Arrival{}}
	out := &Outcome{Seed: cfg.Seed, Name: cfg.Name, Schedule: Plan(cfg.Seed, cfg.Duration)}
	defer r.close()
	if err := r.setUp(ctx); err != nil {
		return nil, err
	}
	logf("campaign seed %d, %v of faults, bucket and queue %s; schedule:\n  %s", cfg.Seed, cfg.Duration, r.name, steps(out.Schedule))

	work := Workload(cfg.Seed, cfg.Duration)
	out.Published = len(work)
	r.start = time.Now()
	// The publisher is Run's: stopped and waited for on every return.
	pubCtx, stopPub := context.WithCancel(ctx)
	pubDone := make(chan struct{})
	var pubErr error
	go func() {
		defer close(pubDone)
		pubErr = r.publish(pubCtx, work)
	}()
	defer func() {
		stopPub()
		<-pubDone
	}()
	for _, s := range out.Schedule {
		if err := sleepUntil(ctx, r.start.Add(s.At)); err != nil {
			return nil, err
		}
		if err := r.inject(ctx, s); err != nil {
			return nil, fmt.Errorf("step %v: %w", s, err)
		}
	}
	<-pubDone
	if pubErr != nil {
		return nil, pubErr
	}
	if err := r.heal(ctx); err != nil {
		return nil, err
	}
	if err := r.drain(ctx); err != nil {
		return nil, err
	}
	r.stopFleet()
	queued, err := r.readQueued()
	if err != nil {
		return nil, err
	}
	dead, err := r.read(r.name + ".dlq")
	if err != nil {
		return nil, err
	}
	r.stalls.Stop()
	spec := r.spec(dead)
	spec.Queued = queued
	out.Report = Check(r.sink.Arrivals(), spec)
	for _, l := range out.Report.Lines {
		logf("%s", l)
	}
	r.mu.Lock()
	out.Violations = append(append([]string(nil), r.notes...), out.Report.Violations...)
	out.FaultTime = merged(r.faults)
	r.mu.Unlock()
	out.Took = time.Since(began)
	if out.OK() {
		logf("seed %d: every promise kept (%v of faults in force, %v in all)", cfg.Seed, out.FaultTime.Round(time.Second), out.Took.Round(time.Second))
	} else {
		for _, rep := range r.replicas {
			logf("%s: its last warnings and errors:\n%s", rep.proc.Name, Tail(warnings(rep.proc.Output()), 15))
		}
		logf("seed %d FAILED (rerun: THROTTLE_CAMPAIGN_SEED=%d, or the benchmark program's -campaign %v -seed %d):\n  %s",
			cfg.Seed, cfg.Seed, cfg.Duration, cfg.Seed, strings.Join(out.Violations, "\n  "))
	}
	return out, nil
}

// warnings returns the lines of a replica's JSON log at level WARN or
// ERROR, and any line that is not JSON.
func warnings(out string) string {
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		if l != "" && (!strings.HasPrefix(l, "{") || strings.Contains(l, `"level":"WARN"`) || strings.Contains(l, `"level":"ERROR"`)) {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// steps formats a schedule.
func steps(ss []Step) string {
	var lines []string
	for _, s := range ss {
		lines = append(lines, s.String())
	}
	return strings.Join(lines, "\n  ")
}

// merged returns the total time covered by spans.
func merged(spans [][2]time.Time) time.Duration {
	s := slices.Clone(spans)
	slices.SortFunc(s, func(a, b [2]time.Time) int { return a[0].Compare(b[0]) })
	var total time.Duration
	var cur [2]time.Time
	for i, sp := range s {
		if i == 0 || sp[0].After(cur[1]) {
			total += cur[1].Sub(cur[0])
			cur = sp
			continue
		}
		if sp[1].After(cur[1]) {
			cur[1] = sp[1]
		}
	}
	return total + cur[1].Sub(cur[0])
}

// sleepUntil sleeps until t or until ctx ends.
func sleepUntil(ctx context.Context, t time.Time) error {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// setUp starts Redis, the proxies, the sink and the first replicas, and
// waits until they consume.
func (r *run) setUp(ctx context.Context) error {
	dir := filepath.Join(r.cfg.Dir, "redis")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var err error
	if r.redis, err = StartRedis(ctx, r.cfg.RedisServer, dir); err != nil {
		return err
	}
	if r.redisPx, err = faultproxy.New(r.redis.Addr()); err != nil {
		return err
	}
	u, err := url.Parse(r.cfg.AMQPURL)
	if err != nil {
		return fmt.Errorf("campaign: AMQP URL: %w", err)
	}
	host := u.Host
	if u.Port() == "" {
		host += ":5672"
	}
	if r.amqpPx, err = faultproxy.New(host); err != nil {
		return err
	}
	if r.conn, err = amqp.Dial(r.cfg.AMQPURL); err != nil {
		return fmt.Errorf("campaign: connecting to RabbitMQ: %w", err)
	}
	if r.sink, err = StartSink(); err != nil {
		return err
	}
	r.stalls = MeasureStalls()
	proxied := *u
	proxied.Host = r.amqpPx.Addr()
	r.config = filepath.Join(r.cfg.Dir, "throttle.yaml")
	if err := os.WriteFile(r.config, []byte(r.yaml(proxied.String())), 0o600); err != nil {
		return err
	}
	for range Replicas {
		if err := r.startReplica(); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for r.consumers() < Replicas {
		for _, rep := range r.replicas {
			if rep.proc.Exited() {
				return fmt.Errorf("campaign: %s exited at start:\n%s", rep.proc.Name, Tail(rep.proc.Output(), 30))
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("campaign: %d consumers on the queue after 30 s, want %d", r.consumers(), Replicas)
		}
		if err := sleepUntil(ctx, time.Now().Add(50*time.Millisecond)); err != nil {
			return err
		}
	}
	return nil
}

// yaml returns the replicas' config.
func (r *run) yaml(amqpURL string) string {
	return fmt.Sprintf(`redis:
  addr: %q
limit:
  bucket: %s
  rate: %v
  burst: %d
  on_store_error: local
  priority_header: x-priority
  min_share: {low: 0.1}
  extra:
    - name: per-sender
      key: '{{.JSON.from}}'
      rate: %v
      burst: 1
      on_exceed: wait
    - name: per-recipient
      key: '{{.JSON.to}}'
      rate: 30/min
      burst: 1
      on_exceed: delay
    - name: per-account
      key: '{{.JSON.acct}}'
      quota: %d
      per: hour
      on_exceed: dead_letter
source:
  rabbitmq:
    url: %q
    queue: %s
    prefetch: %d
    declare: true
sink:
  http:
    url: %q
    timeout: 5s
    headers: {x-campaign-replica: "${THROTTLE_CAMPAIGN_REPLICA}"}
delivery:
  drain_timeout: 5s
metrics:
  listen: "off"
log:
  level: %s
  format: json
`, r.redisPx.Addr(), r.name, Rate, Burst, SenderRate, Quota, amqpURL, r.name, Prefetch, r.sink.URL(), r.logLevel())
}

func (r *run) logLevel() string {
	if r.cfg.LogLevel == "" {
		return "info"
	}
	return r.cfg.LogLevel
}

// startReplica starts one more replica.
func (r *run) startReplica() error {
	r.started++
	cmd := exec.Command(r.cfg.Bin, "run", "--config", r.config)
	// The sink records which replica sent each request (ReplicaHeader).
	cmd.Env = append(os.Environ(), fmt.Sprintf("THROTTLE_CAMPAIGN_REPLICA=%d", r.started))
	p, err := StartProc(fmt.Sprintf("replica %d", r.started), cmd)
	if err != nil {
		return err
	}
	r.replicas = append(r.replicas, &replica{n: r.started, proc: p})
	return nil
}

// running returns the replicas that have not exited.
func (r *run) running() []*replica {
	var out []*replica
	for _, rep := range r.replicas {
		if !rep.proc.Exited() {
			out = append(out, rep)
		}
	}
	return out
}

// queueState returns a queue's messages and consumers, zeros when it does
// not exist.
func (r *run) queueState(name string) amqp.Queue { return QueueState(r.conn, name) }

func (r *run) consumers() int { return r.queueState(r.name).Consumers }

// publish sends work at its times, each confirmed by the broker, on a
// connection of its own (not through the proxy).
func (r *run) publish(ctx context.Context, work []Pub) error {
	ch, err := r.conn.Channel()
	if err != nil {
		return fmt.Errorf("campaign: publisher channel: %w", err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("campaign: confirm mode: %w", err)
	}
	for _, p := range work {
		if err := sleepUntil(ctx, r.start.Add(p.At)); err != nil {
			return err
		}
		body, _ := json.Marshal(p.Msg)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", r.name, true, false, amqp.Publishing{
			ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: fmt.Sprint(p.Msg.ID),
			Headers: amqp.Table{"x-priority": p.Msg.Class}, Body: body,
		})
		if err != nil {
			return fmt.Errorf("campaign: publishing %d: %w", p.Msg.ID, err)
		}
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return fmt.Errorf("campaign: message %d not confirmed: %v", p.Msg.ID, err)
		}
		r.mu.Lock()
		r.published[p.Msg.ID] = p.Msg.Arrival(time.Time{})
		r.mu.Unlock()
	}
	return nil
}

// inject runs one step to its heal.
func (r *run) inject(ctx context.Context, s Step) error {
	at := time.Now()
	r.logf("%v (begun at %s, +%.1fs)", s, at.Format("15:04:05.000"), at.Sub(r.start).Seconds())
	r.event(at, s.Kind)
	defer func() { r.event(time.Now(), s.Kind+" healed") }()
	hold := func() error { return sleepUntil(ctx, time.Now().Add(s.Hold)) }
	disturb := func(keyExtra int) {
		end := time.Now().Add(Settle)
		r.mu.Lock()
		r.disturbances = append(r.disturbances, Disturbance{Kind: s.Kind, From: at, To: end, ExtraBursts: 1, ExtraKeyBursts: keyExtra})
		r.faults = append(r.faults, [2]time.Time{at, end})
		r.mu.Unlock()
	}
	span := func(extraDups int) {
		r.mu.Lock()
		r.faults = append(r.faults, [2]time.Time{at, time.Now()})
		r.dupBound += extraDups
		r.mu.Unlock()
	}
	switch s.Kind {
	case RedisKill:
		r.redis.Kill()
		if err := hold(); err != nil {
			return err
		}
		if err := r.redis.Start(ctx); err != nil {
			return err
		}
		disturb(2) // the fallback's burst per key, and Redis restarted without the keys
	case RedisPause:
		if err := r.redis.Pause(); err != nil {
			return err
		}
		err := hold()
		if rerr := r.redis.Resume(); rerr != nil {
			return rerr
		}
		if err != nil {
			return err
		}
		disturb(1)
	case RedisCut:
		r.redisPx.Cut()
		disturb(1)
	case AMQPCut:
		r.amqpPx.Cut()
		span(Prefetch * len(r.running()))
	case ReplicaKill, ReplicaTerm:
		live := r.running()
		if len(live) == 0 {
			return errors.New("no replica running")
		}
		rep := live[s.Pick%len(live)]
		rep.ended = true
		if s.Kind == ReplicaKill {
			rep.proc.Kill()
			span(Prefetch)
		} else if code := rep.proc.Stop(syscall.SIGTERM, 20*time.Second); code != 0 {
			r.note("%s exited %d after SIGTERM at +%.1fs, want 0 (drained); it ended: %s:\n%s", rep.proc.Name, code, at.Sub(r.start).Seconds(), rep.proc.Ended(), Tail(rep.proc.Output(), 20))
		}
		if err := hold(); err != nil {
			return err
		}
		if err := r.startReplica(); err != nil {
			return err
		}
		span(0)
	case RateSet:
		if err := r.setRate(ctx, s.Rate); err != nil {
			return err
		}
		if err := hold(); err != nil {
			return err
		}
		if err := r.setRate(ctx, 0); err != nil {
			return err
		}
		span(0)
	case AddReplica:
		if len(r.running()) < MaxReplicas {
			if err := r.startReplica(); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("unknown fault %q", s.Kind)
	}
	return nil
}

// setRate runs `throttle bucket set` against Redis itself (not through the
// proxy), with --rate, or --clear for 0, and records the change.
func (r *run) setRate(ctx context.Context, rate float64) error {
	args := []string{"bucket", "set", r.name, "--redis", r.redis.Addr()}
	if rate > 0 {
		args = append(args, "--rate", fmt.Sprint(rate))
	} else {
		args = append(args, "--clear")
	}
	from := time.Now()
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, r.cfg.Bin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("throttle %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	r.mu.Lock()
	r.overrides = append(r.overrides, RateChange{From: from, To: time.Now(), Rate: rate})
	r.mu.Unlock()
	return nil
}

// heal leaves every fault healed: Redis up, at least Replicas replicas.
func (r *run) heal(ctx context.Context) error {
	for len(r.running()) < Replicas {
		if err := r.startReplica(); err != nil {
			return err
		}
	}
	return nil
}

// drain waits until every published message was delivered or
// dead-lettered and the queues are empty: up to 20 s plus 1.5 times the
// backlog's time at the rate, or what the busiest recipient's layer
// needs if that is longer.
func (r *run) drain(ctx context.Context) error {
	_, unique := r.sink.Counts()
	backlog := len(r.published) - unique
	limit := time.Duration(1.5 * float64(backlog) / Rate * float64(time.Second))
	perTo := map[string]int{}
	for _, m := range r.published {
		perTo[m.To]++
	}
	for to, n := range perTo {
		// A recipient's messages go out 1/RecipRate apart from the
		// start at the earliest.
		need := time.Duration(float64(n-1)/RecipRate*float64(time.Second)) - time.Since(r.start)
		if need > limit {
			limit = need
			r.logf("recipient %s has %d messages: %v more at the least", to, n, need.Round(time.Second))
		}
	}
	limit += 20 * time.Second
	r.logf("+%.1fs published %d, %d delivered; waiting up to %v for the rest", time.Since(r.start).Seconds(), len(r.published), unique, limit.Round(time.Second))
	deadline := time.Now().Add(limit)
	// A hot recipient's slots may lie further out than the estimate when
	// faults made its layer forfeit some (a Redis kill loses the booked
	// slots, and each message booked before it books again, behind the
	// others): while messages are set aside and the sink still receives,
	// the wait goes on, 5 s past the last delivery, up to a minute more,
	// or as long again as the estimate for a long schedule.
	hardStop, lastUnique, lastProgress := deadline.Add(max(time.Minute, limit)), -1, time.Now()
	for {
		_, unique := r.sink.Counts()
		dead := r.queueState(r.name + ".dlq").Messages
		setAside := SetAside(r.conn, r.name)
		if unique+dead >= len(r.published) && r.queueState(r.name).Messages == 0 && setAside == 0 {
			r.logf("+%.1fs drained: %d delivered, %d dead-lettered", time.Since(r.start).Seconds(), unique, dead)
			return nil
		}
		if unique != lastUnique {
			lastUnique, lastProgress = unique, time.Now()
		}
		if time.Now().After(deadline) && setAside > 0 && time.Since(lastProgress) < 5*time.Second && time.Now().Before(hardStop) {
			deadline = time.Now().Add(time.Second)
		}
		if time.Now().After(deadline) {
			r.logf("+%.1fs not drained after %v: %d delivered, %d dead-lettered of %d; %d ready, %d set aside",
				time.Since(r.start).Seconds(), limit.Round(time.Second), unique, dead, len(r.published),
				r.queueState(r.name).Messages, SetAside(r.conn, r.name))
			return nil // the checker reports what is missing
		}
		if err := sleepUntil(ctx, time.Now().Add(250*time.Millisecond)); err != nil {
			return err
		}
	}
}

// stopFleet stops every replica with SIGTERM; each must exit 0.
func (r *run) stopFleet() {
	for _, rep := range r.replicas {
		if !rep.ended && rep.proc.Exited() {
			r.note("%s ended on its own (%s), not by a step:\n%s", rep.proc.Name, rep.proc.Ended(), Tail(rep.proc.Output(), 20))
		}
	}
	for _, rep := range r.running() {
		rep.ended = true
		if code := rep.proc.Stop(syscall.SIGTERM, 20*time.Second); code != 0 {
			r.note("%s exited %d after the final SIGTERM, want 0; it ended: %s:\n%s", rep.proc.Name, code, rep.proc.Ended(), Tail(rep.proc.Output(), 20))
		}
	}
	for _, rep := range r.replicas {
		if strings.Contains(rep.proc.Output(), "panic:") {
			r.note("%s panicked:\n%s", rep.proc.Name, Tail(rep.proc.Output(), 40))
		}
	}
}

// readQueued empties the queue and its delay queues (ReadQueued),
// logging what was left.
func (r *run) readQueued() (map[int]int, error) {
	out, left, err := ReadQueued(r.conn, r.name)
	for _, l := range left {
		r.logf("%s", l)
	}
	return out, err
}

// read empties a queue (Read), logging the dead letters that no quota
// refused.
func (r *run) read(queue string) (map[int]int, error) {
	out, msgs, err := Read(r.conn, queue)
	for _, d := range msgs {
		if lim, _ := d.Headers["x-throttle-limit"].(string); lim != "per-account" {
			r.logf("%s: %s: headers %v", queue, d.Body, d.Headers)
		}
	}
	return out, err
}

// spec returns what the run promised.
func (r *run) spec(dead map[int]int) Spec {
	r.mu.Lock()
	defer r.mu.Unlock()
	// The replicas' own stalls count as the checker's (LoggedStalls).
	var outs []string
	for _, rep := range r.replicas {
		outs = append(outs, rep.proc.Output())
	}
	logged := LoggedStalls(outs...)
	return Spec{
		Rate: Rate, Burst: Burst, ArrivalAllowance: ArrivalAllowance,
		Overrides: r.overrides, Disturbances: r.disturbances,
		Keyed: []KeyedLayer{
			{Name: "per-sender", Key: func(a Arrival) string { return a.From }, Rate: SenderRate, Burst: 1,
				Open: "a wait layer's pair too close under load: the causes found are fixed, a replica stalled or limiting locally can still shorten one, docs/campaign.md", HardFraction: 0.5},
			{Name: "per-recipient", Key: func(a Arrival) string { return a.To }, Rate: RecipRate, Burst: 1,
				Open: "a delay layer's pair too close under the campaign's mix: the causes found are fixed, a replica stalled or limiting locally can still shorten one, docs/campaign.md", HardFraction: 0.5},
		},
		Quotas: []QuotaLayer{
			{Name: "per-account", Key: func(a Arrival) string { return a.Acct }, Quota: Quota, Per: time.Hour},
		},
		Stall:         max(r.stalls.Max(), logged.Max()),
		StallIn:       LongestIn(r.stalls, logged),
		Published:     r.published,
		DeadLettered:  dead,
		MayDeadLetter: func(a Arrival) bool { return a.Acct == CappedAccount },
		DupBound:      r.dupBound,
		Events:        r.events,
	}
}

// close stops everything the run started and deletes its queues.
func (r *run) close() {
	for _, rep := range r.replicas {
		rep.proc.Kill()
		if r.cfg.LogDir != "" {
			_ = os.WriteFile(filepath.Join(r.cfg.LogDir, fmt.Sprintf("replica-%d.log", rep.n)), []byte(rep.proc.Output()), 0o600)
		}
	}
	if r.redisPx != nil {
		r.redisPx.Close()
	}
	if r.amqpPx != nil {
		r.amqpPx.Close()
	}
	if r.redis != nil {
		r.redis.Close()
	}
	if r.sink != nil {
		r.sink.Close()
	}
	if r.stalls != nil {
		r.stalls.Stop()
	}
	if r.conn != nil {
		DeleteQueues(r.conn, r.name)
		r.conn.Close()
	}
}
