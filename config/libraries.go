package config

import (
	"crypto/tls"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/consumer/kafka"
	"github.com/throttlehq/throttle/consumer/rabbitmq"
	"github.com/throttlehq/throttle/consumer/redisdedupe"
	"github.com/throttlehq/throttle/internal/telemetry"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
	"github.com/throttlehq/throttle/sinks/httpsink"
	"github.com/throttlehq/throttle/sinks/msgtmpl"
	"github.com/throttlehq/throttle/sinks/postgres"
)

// Libraries is a Config mapped onto the configurations of the libraries
// that make one replica of the throttle binary: the shared bucket in Redis
// and its layers, the limiter, what the consumer waits on, the consumer of
// the source and the sink. [Config.Libraries] returns it. Each field is
// the library's own configuration holding what the YAML says and nothing
// else: a zero field is the library's default, which config never
// repeats, and the library validates it when it is built. What is not
// configuration is the caller's to add: the Redis client, the observers
// and loggers, and the bucket, which the consumer waits on
// (consumer.NewLimiter) and, with PushBack, pauses (Options.Pauser).
//
// The binary builds its pipeline from a Libraries and reads nothing else
// of the Config for it, so a program that loads the binary's YAML and
// builds the same way gets the same consumer:
//
//	store, _ := redislimiter.New(client, lib.Bucket)        // + store.WithLayers(lib.Layers)
//	bucket, _ := limiter.New(store, lib.Limiter)             // + Observer, Logger
//	lim, _ := consumer.NewLimiter(bucket, lib.Limit)         // + Waiting, Granted
//	kc := *lib.Kafka                                         // or *lib.RabbitMQ
//	kc.Limiter = lim                                         // + Pauser (bucket) with PushBack
//	kc.Assigned = func(n int) { bucket.SetIdle(n == 0) }
//	h := *lib.HTTP                                           // or *lib.Postgres, or stdout
//	h.MaxRetryAfter = bucket.MaxPause()
//
// A Libraries is a plain value: safe to read concurrently, not to mutate
// concurrently. Its functions (keys, classes, costs) are safe for
// concurrent use.
type Libraries struct {
	// Bucket configures the shared bucket in Redis (redislimiter.New):
	// limit.bucket, rate, burst and warmup.
	Bucket redislimiter.Config
	// Layers are limit.extra, for redislimiter.Store.WithLayers; nil
	// without.
	Layers []limiter.Layer
	// Fair is limit.fair, for redislimiter.Layered.WithFair; nil without.
	// The consumer's Limit.Tenant and TenantWaiting come with it.
	Fair *limiter.Fair
	// Limiter configures the limiter.Bucket (limiter.New): limit.*
	// (on_store_error, fallback_rate, probe_interval, lease, adaptive,
	// priority, min_share) and sink.http.max_pause, which is MaxPause,
	// the one cap on a push-back pause. The caller adds the Observer and
	// the Logger.
	Limiter limiter.Options
	// Limit configures what the consumer waits on, the bucket through
	// consumer.NewLimiter: limit.extra's key templates (Keys),
	// limit.priority_header (Priority; nil without, so that every
	// message has the bucket's class, limit.priority) and limit.max_wait
	// (WaitTimeout). The consumer orders its messages by the same
	// classes (consumer.Options.Priority's default). The caller adds
	// Waiting and Granted.
	Limit consumer.LimitOptions
	// PushBack is sink.http.push_back: the consumer's Options.Pauser is
	// to be the bucket, so that a delay the sink reports (a 429's
	// Retry-After) pauses it for every replica.
	PushBack bool
	// Kafka or RabbitMQ configures the consumer of source.kafka or
	// source.rabbitmq; exactly one is set in a valid Config. Their
	// Options hold delivery.* (Retry, DrainTimeout, MaxSetAside),
	// limit.cost_template or limit.cost_header (Cost), the source's
	// ordering and ordering_key, and its concurrency (Kafka's
	// max_in_flight under ordering key and none); SetAside is set when a
	// layer of limit.extra has on_exceed delay. The caller adds the Limiter, the
	// Pauser, the Observer and the Logger, and Kafka's Assigned.
	Kafka    *kafka.Config
	RabbitMQ *rabbitmq.Config
	// HTTP, Postgres or Stdout configures the sink of sink.http,
	// sink.postgres or sink.stdout; exactly one is set in a valid Config.
	// HTTP's MaxRetryAfter is left to the caller: the binary gives it the
	// bucket's cap (limiter.Bucket.MaxPause), so that a message that got
	// a Retry-After is retried when the pause it caused ends.
	HTTP     *httpsink.Config
	Postgres *postgres.Config
	Stdout   bool
	// Tracing is tracing.*, nil when tracing is off: the caller builds a
	// TracerProvider from it and sets the consumer's
	// Options.TracerProvider.
	Tracing *telemetry.Options
	// DedupeStore configures the Redis store of delivery.dedupe
	// (redisdedupe.New), in the namespace of limit.bucket; nil without
	// dedupe. The consumer's Options.Dedupe holds the rest of
	// delivery.dedupe; the caller sets its Store.
	DedupeStore *redisdedupe.Config
}

// Libraries maps c onto the libraries' configurations; it is the one
// mapping, which Validate checks too. It reads the certificate files of
// source.kafka.tls and source.rabbitmq.tls (redis.tls is read when the
// Redis client is built). Its problems are those of the mapping itself,
// in a *ValidationError naming each YAML key: a template that does not
// parse, a class, time zone or enumerated value that is not known, a file
// that cannot be used, SASL credentials that cannot be. Validate reports
// them too, but reads no file; the libraries check the rest when they are
// built from the result.
func (c *Config) Libraries() (*Libraries, error) {
	var ps problems
	lib, _ := c.libraries(&ps, true)
	if len(ps) > 0 {
		return nil, &ValidationError{Problems: ps}
	}
	return lib, nil
}

// libraries maps c, recording the problems of the mapping in ps. With
// readFiles false it reads no file: TLS is a stand-in. It also returns the
// consumer options of the delivery and limit sections alone, which
// Validate checks when no source is set.
func (c *Config) libraries(ps *problems, readFiles bool) (*Libraries, consumer.Options) {
	l := &c.Limit
	lib := &Libraries{Bucket: l.bucketConfig(), Limiter: l.limiterOptions(ps)}
	lib.Layers = l.layers(ps)
	lib.Limit = l.limitOptions(ps, lib.Limiter.Priority)
	lib.Fair = l.fair(ps, &lib.Limit)
	if h := c.Sink.HTTP; h != nil {
		lib.Limiter.MaxPause = time.Duration(h.MaxPause)
		lib.PushBack = h.PushBackEnabled()
		hc := h.sinkConfig()
		lib.HTTP = &hc
	}
	if p := c.Sink.Postgres; p != nil {
		lib.Postgres = &postgres.Config{DSN: p.DSN, Table: p.Table, CreateTable: p.CreateTable, IDHeader: p.IDHeader}
	}
	lib.Stdout = c.Sink.Stdout != nil
	if t := c.Tracing; t.Enabled {
		o := telemetry.Options{SampleRatio: telemetry.DefaultSampleRatio}
		if t.SampleRatio != nil {
			o.SampleRatio = *t.SampleRatio
		}
		lib.Tracing = &o
	}

	d := &c.Delivery
	// A concurrency layer's lease defaults to the longest a message may
	// hold its slot: the sink's timeout times the attempts.
	if h := c.Sink.HTTP; h != nil {
		timeout := time.Duration(h.Timeout)
		if timeout <= 0 {
			timeout = httpsink.DefaultTimeout
		}
		attempts := d.MaxAttempts
		if attempts <= 0 {
			attempts = consumer.DefaultMaxAttempts
		}
		for i := range lib.Layers {
			if ly := &lib.Layers[i]; ly.Concurrency > 0 && ly.Lease == 0 {
				ly.Lease = timeout * time.Duration(attempts)
			}
		}
	}
	opts := consumer.Options{
		Cost:         l.costFunc(ps),
		Retry:        consumer.RetryPolicy{MaxAttempts: d.MaxAttempts, Backoff: time.Duration(d.Backoff), MaxBackoff: time.Duration(d.MaxBackoff)},
		DrainTimeout: time.Duration(d.DrainTimeout),
		MaxSetAside:  time.Duration(d.MaxSetAside),
		// A layer of limit.extra with on_exceed delay sets messages
		// aside, in the delay topic or queues.
		SetAside: slices.ContainsFunc(lib.Layers, limiter.Layer.SetsAside),
	}
	if dd := d.Dedupe; dd != nil {
		opts.Dedupe = dd.consumerDedupe(ps, c.Sink)
		lib.DedupeStore = &redisdedupe.Config{Namespace: l.Bucket}
	}
	if lib.Fair != nil {
		// A tenant over its fair share beyond limit.fair.max_waiting is
		// set aside, but where the order of a partition must hold.
		if k := c.Source.Kafka; k != nil && k.Ordering != consumer.OrderKey && k.Ordering != consumer.OrderNone {
			lib.Limit.TenantWaiting = -1
		} else {
			opts.SetAside = true
		}
	}
	if k := c.Source.Kafka; k != nil {
		kc := k.consumerConfig(ps, opts, readFiles)
		lib.Kafka = &kc
	}
	if q := c.Source.RabbitMQ; q != nil {
		rc := q.consumerConfig(ps, opts, readFiles)
		lib.RabbitMQ = &rc
	}
	return lib, opts
}

// consumerDedupe maps delivery.dedupe onto the consumer's Dedupe, the
// Store left to the caller: the send timeout is sink.http.timeout's
// (zero: the consumer's default).
func (d *Dedupe) consumerDedupe(ps *problems, sink Sink) *consumer.Dedupe {
	const key = "delivery.dedupe.key"
	out := &consumer.Dedupe{
		Window:       time.Duration(d.Window),
		ClaimTTL:     time.Duration(d.ClaimTTL),
		OnStoreError: limiter.Mode(d.OnStoreError),
		RequireKey:   d.RequireKey,
	}
	if h := sink.HTTP; h != nil {
		out.SendTimeout = time.Duration(h.Timeout)
	}
	if d.Key == "" {
		return out // the consumer says that Key is required
	}
	f, err := msgtmpl.DedupeKeyFunc(key, d.Key)
	if err != nil {
		ps.add(key, "%s", err)
	}
	out.Key = f
	return out
}

// bucketConfig maps limit onto the Redis store's configuration.
func (l *Limit) bucketConfig() redislimiter.Config {
	return redislimiter.Config{Bucket: l.Bucket, Rate: l.Rate, Burst: l.Burst, Warmup: time.Duration(l.Warmup)}
}

// limiterOptions maps limit onto the limiter's options, all but MaxPause
// (sink.http.max_pause). A class that limiter.ParsePriority rejects, in
// priority or as a key of min_share, is a problem and left out.
func (l *Limit) limiterOptions(ps *problems) limiter.Options {
	o := limiter.Options{
		OnStoreError:  limiter.Mode(l.OnStoreError),
		FallbackRate:  l.FallbackRate,
		ProbeInterval: time.Duration(l.ProbeInterval),
		Shadow:        l.Shadow,
	}
	o.Lease.Calls = l.LeaseCalls
	switch l.Lease {
	case "", LeaseAuto:
	case LeaseOff:
		o.Lease.Disabled = true
		if l.LeaseCalls != 0 {
			ps.add("limit.lease_calls", "has no effect with limit.lease off")
		}
	default:
		ps.add("limit.lease", "must be one of auto, off, got %q", l.Lease)
	}
	if a := l.Adaptive; a != nil {
		o.Adaptive = &limiter.Adaptive{MinRate: a.MinRate, Decrease: a.Decrease, Increase: a.Increase, Interval: time.Duration(a.Interval)}
	}
	if p, err := limiter.ParsePriority(l.Priority); err != nil {
		ps.library(limiterKeys, err)
	} else {
		o.Priority = p
	}
	for _, class := range slices.Sorted(maps.Keys(l.MinShare)) {
		p, err := limiter.ParsePriority(class)
		if err != nil {
			ps.add("limit.min_share", "a key %s", paramMessage(err))
			continue
		}
		o.MinShare[p] = l.MinShare[class]
	}
	return o
}

// limitOptions maps limit onto what the consumer waits on: the keys of
// limit.extra, the class of priority_header (class when a message has
// none) and max_wait.
func (l *Limit) limitOptions(ps *problems, class limiter.Priority) consumer.LimitOptions {
	o := consumer.LimitOptions{WaitTimeout: time.Duration(l.MaxWait)}
	if l.PriorityHeader != "" {
		o.Priority = consumer.PriorityFromHeader(l.PriorityHeader, class)
	}
	var keys []msgtmpl.LayerKey
	for i, x := range l.Extra {
		if x.Key == "" {
			continue
		}
		name := "limit.extra[" + strconv.Itoa(i) + "].key"
		if _, err := msgtmpl.Parse(name, x.Key); err != nil {
			ps.add(name, "%s", err)
			continue
		}
		keys = append(keys, msgtmpl.LayerKey{Layer: x.Name, Name: name, Text: x.Key})
	}
	if f, err := msgtmpl.KeysFunc(keys); err == nil { // each parsed above
		o.Keys = f
	}
	l.priceOptions(ps, &o)
	return o
}

// fair maps limit.fair onto the limiter's fair shares, and its key and
// max_waiting onto o; nil without.
func (l *Limit) fair(ps *problems, o *consumer.LimitOptions) *limiter.Fair {
	f := l.Fair
	if f == nil {
		return nil
	}
	const name = "limit.fair.key"
	if f.Key == "" {
		ps.add(name, "is required: the template that gives a message's tenant")
	} else if _, err := msgtmpl.Parse(name, f.Key); err != nil {
		ps.add(name, "%s", err)
	} else if keys, err := msgtmpl.KeysFunc([]msgtmpl.LayerKey{{Layer: limiter.FairLayer, Name: name, Text: f.Key}}); err == nil {
		o.Tenant = func(m consumer.Message) (string, error) {
			k, err := keys(m)
			return k[limiter.FairLayer], err
		}
	}
	o.TenantWaiting = f.MaxWaiting
	return &limiter.Fair{Weights: f.Weights, DefaultWeight: f.DefaultWeight, Horizon: time.Duration(f.Horizon)}
}

// validateFair records the problems limiter.Fair.Validate finds in fair,
// mapped from limit.fair, each under its YAML key.
func (l *Limit) validateFair(ps *problems, fair *limiter.Fair) {
	if fair == nil {
		return
	}
	f := *fair
	for _, err := range leaves(f.Validate()) {
		var pe *limiter.ParamError
		if !errors.As(err, &pe) {
			ps.add("limit.fair", "%s", err)
			continue
		}
		key := "limit.fair." + map[string]string{"DefaultWeight": "default_weight", "Horizon": "horizon"}[pe.Param]
		if t, ok := strings.CutPrefix(pe.Param, "Weights"); ok {
			key = "limit.fair.weights" + strings.Trim(t, "[]")
			if t != "" {
				key = "limit.fair.weights." + strings.Trim(t, "[]")
			}
		}
		ps.add(key, "%s", paramMessage(pe))
	}
	if l.Fair.MaxWaiting < 0 {
		ps.add("limit.fair.max_waiting", "must be >= 0, got %d", l.Fair.MaxWaiting)
	}
}

// costFunc maps cost_template or cost_header onto the consumer's cost of
// a message: nil (one token per message) when neither is set.
func (l *Limit) costFunc(ps *problems) consumer.CostFunc {
	switch {
	case l.CostTemplate != "":
		if l.CostHeader != "" {
			ps.add("limit.cost_template", "set either limit.cost_header or limit.cost_template, not both")
		}
		f, err := msgtmpl.CostFunc("limit.cost_template", l.CostTemplate)
		if err != nil {
			ps.add("limit.cost_template", "%s", err)
		}
		return f
	case l.CostHeader != "":
		return consumer.CostFromHeader(l.CostHeader)
	}
	return nil
}

// consumerConfig maps source.kafka onto the Kafka consumer's
// configuration, with opts, the options of the other sections.
func (k *Kafka) consumerConfig(ps *problems, opts consumer.Options, readFiles bool) kafka.Config {
	const key = "source.kafka"
	opts.Ordering = k.Ordering
	opts.OrderingKey = orderingKey(ps, key+".ordering_key", k.OrderingKey)
	// The consumer's one bound, the messages handled at once: concurrency
	// under ordering partition, max_in_flight under key and none.
	opts.Concurrency = k.Concurrency
	switch k.Ordering {
	case consumer.OrderKey, consumer.OrderNone:
		opts.Concurrency = k.MaxInFlight
	default:
		if k.MaxInFlight != 0 {
			ps.add(key+".max_in_flight", "has no effect with ordering %q; it bounds ordering %q and %q (partition is bounded by the concurrency)",
				consumer.OrderPartition, consumer.OrderKey, consumer.OrderNone)
		}
	}
	kc := kafka.Config{
		Options:         opts,
		Brokers:         k.Brokers,
		Topic:           k.Topic,
		Group:           k.Group,
		DeadLetterTopic: k.DeadLetterTopic,
		DelayTopic:      k.DelayTopic,
		Dialer:          k.dialer(ps, readFiles),
	}
	switch k.StartOffset {
	case "", StartFirst:
		kc.StartOffset = kafkago.FirstOffset
	case StartLast:
		kc.StartOffset = kafkago.LastOffset
	default:
		ps.add(key+".start_offset", "must be one of first, last, got %q", k.StartOffset)
	}
	return kc
}

// dialer maps the TLS and SASL of source.kafka onto a kafka-go dialer, or
// nil (kafka-go's default dialer) when neither is set.
func (k *Kafka) dialer(ps *problems, readFiles bool) *kafkago.Dialer {
	const key = "source.kafka"
	tlsConf := k.TLS.clientConfig(ps, key+".tls", readFiles)
	switch k.SASL.Mechanism {
	case SASLNone:
		if k.SASL.Username != "" || k.SASL.Password != "" {
			ps.add(key+".sasl", "username and password have no effect unless %s.sasl.mechanism is set", key)
		}
		if tlsConf == nil {
			return nil
		}
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		if k.SASL.Username == "" {
			ps.add(key+".sasl.username", "required when mechanism is %s", k.SASL.Mechanism)
		}
	default:
		ps.add(key+".sasl.mechanism", "must be one of plain, scram-sha-256, scram-sha-512 or empty, got %q", k.SASL.Mechanism)
		return nil
	}
	d := *kafkago.DefaultDialer // kafka-go's defaults, with TLS and SASL
	d.TLS = tlsConf
	switch k.SASL.Mechanism {
	case SASLPlain:
		d.SASLMechanism = plain.Mechanism{Username: k.SASL.Username, Password: k.SASL.Password}
	case SASLScramSHA256, SASLScramSHA512:
		algo := scram.SHA256
		if k.SASL.Mechanism == SASLScramSHA512 {
			algo = scram.SHA512
		}
		m, err := scram.Mechanism(algo, k.SASL.Username, k.SASL.Password)
		if err != nil {
			// The error is about the user name or password: do not echo it.
			ps.add(key+".sasl", "%s credentials are not usable (check the user name and password for SASLprep)", k.SASL.Mechanism)
		}
		d.SASLMechanism = m
	}
	return &d
}

// consumerConfig maps source.rabbitmq onto the RabbitMQ consumer's
// configuration, with opts, the options of the other sections.
func (r *RabbitMQ) consumerConfig(ps *problems, opts consumer.Options, readFiles bool) rabbitmq.Config {
	const key = "source.rabbitmq"
	opts.Ordering = r.Ordering
	opts.OrderingKey = orderingKey(ps, key+".ordering_key", r.OrderingKey)
	opts.Concurrency = r.Concurrency
	return rabbitmq.Config{
		URL:                r.URL,
		TLS:                r.TLS.clientConfig(ps, key+".tls", readFiles),
		Queue:              r.Queue,
		Prefetch:           r.Prefetch,
		AckDelay:           time.Duration(r.AckDelay),
		Declare:            r.Declare,
		DeadLetterExchange: r.DeadLetterExchange,
		Options:            opts,
	}
}

// orderingKey maps the ordering_key template text at key onto the
// consumer's key of a message, or nil for an empty text (the consumer's
// default key). A message the template fails on fails permanently
// (consumer.KeyFunc's contract).
func orderingKey(ps *problems, key, text string) consumer.KeyFunc {
	if text == "" {
		return nil
	}
	t, err := msgtmpl.Parse(key, text)
	if err != nil {
		ps.add(key, "%v", err)
		return nil
	}
	return func(m consumer.Message) (string, error) {
		b, err := msgtmpl.Render(t, msgtmpl.NewData(m))
		return string(b), err
	}
}

// clientConfig maps the TLS section at key onto a *tls.Config, nil when
// it is off. Without readFiles it reads no file and returns a stand-in.
func (t *TLS) clientConfig(ps *problems, key string, readFiles bool) *tls.Config {
	if !t.validate(ps, key) {
		return nil
	}
	if !readFiles {
		return &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	}
	c, err := t.ClientConfig()
	if err != nil {
		ps.add(key, "%s", strings.TrimPrefix(err.Error(), "tls: "))
	}
	return c
}

// sinkConfig maps sink.http onto the HTTP sink's configuration; the
// binary sets MaxRetryAfter (see Libraries.HTTP).
func (h *HTTP) sinkConfig() httpsink.Config {
	var rules []httpsink.Rule
	for _, r := range h.Classify {
		hr := httpsink.Rule{
			Name:          r.Name,
			Status:        r.Status,
			Action:        httpsink.Action(r.Action),
			Delay:         time.Duration(r.Delay),
			RecipientGone: r.RecipientGone,
		}
		if r.Headers != nil {
			hr.Headers = make(map[string][]string, len(r.Headers))
			for k, v := range r.Headers {
				hr.Headers[k] = v
			}
		}
		if r.Body != nil {
			hr.Body = make(map[string][]string, len(r.Body))
			for k, v := range r.Body {
				hr.Body[k] = v
			}
		}
		rules = append(rules, hr)
	}
	return httpsink.Config{
		URL:          h.URL,
		Method:       h.Method,
		Headers:      h.Headers,
		Timeout:      time.Duration(h.Timeout),
		BodyTemplate: h.BodyTemplate,
		ContentType:  h.ContentType,
		MaxConns:     h.MaxConns,
		Preset:       h.Preset,
		Credentials:  httpsink.Credentials(h.Credentials),
		Rules:        rules,
	}
}
