package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/throttlehq/throttle/sinks/httpsink"
)

// e2eMarkdown is the end-to-end report.
func e2eMarkdown(cfg e2eConfig, machine, load string, runs []e2eRun) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("Command: `cd integration/bench && go run .%s`\n\n", cfg.flags)
	p("Machine: %s. Load average (1, 5, 15 min): %s.\n\n", machine, load)
	answers := "at once"
	if cfg.sinkLatency > 0 {
		answers = "after " + cfg.sinkLatency.String() + ", as a provider's API would"
	}
	p("Each run fills a fresh queue or topic with the messages, then consumes them into an HTTP sink "+
		"that answers 200 "+answers+" (a child process of the benchmark, on loopback); the rate is the "+
		"messages at the sink over the time from the first to the last. `throttle` is `throttle run` "+
		"(the same `cli.Run` as the binary, metrics on, leasing auto) on a private redis-server; "+
		"`bare` is a plain client loop. The runs alternate, %d of each, and the other work on the "+
		"machine makes single figures noisy: compare the ratios of one run.\n\n", cfg.rounds)
	if cfg.maxConns > 0 {
		p("throttle's `sink.http.max_conns`: %d (the default is %d).\n\n", cfg.maxConns, httpsink.DefaultMaxConns)
	}
	p("- RabbitMQ (127.0.0.1:5672): prefetch %d, %d handlers; bare: amqp091, one POST per message "+
		"with a keep-alive client of %d idle connections, ack after a 2xx.\n", rabbitPrefetch, rabbitHandlers, rabbitHandlers)
	p("- Kafka (kfake, in the child process): %d partitions, one worker per partition; bare: kafka-go "+
		"reader (1 s fetch wait, 32 queued; each worker queues up to %d of its own), one POST per message, "+
		"the highest handled offset of each "+
		"partition committed after handling, batched while a commit is in flight.\n\n", kafkaPartitions, cfg.bareQueue)

	p("Limit out of reach (1,000,000/s, burst 1,000,000), %d messages per run:\n\n", cfg.messages)
	base := consBare
	if cfg.againstThrottle() {
		base = consThrottle
	}
	p("| source | consumer | msg/s (median) | runs, msg/s | ÷ %s | consumer CPU µs/msg | allocs/msg | Redis calls/msg | left in broker |\n", base)
	p("|---|---|--:|---|--:|--:|--:|--:|--:|\n")
	for _, src := range cfg.scenarios {
		var bareMed float64
		for _, c := range []string{consBare, consThrottle, consLayer, consDedupe, consWindow, consConc, consReadme, consReadmePlain} {
			var rates []float64
			var sel []e2eRun
			for _, r := range runs {
				if r.source == src && r.consumer == c && r.round > 0 {
					rates = append(rates, r.perSecond())
					sel = append(sel, r)
				}
			}
			if len(sel) == 0 {
				continue
			}
			med := median(rates)
			ratio := "—"
			if c == base {
				bareMed = med
			} else if bareMed > 0 {
				ratio = fmt.Sprintf("**%.2f×**", med/bareMed)
			}
			var each []string
			var cpu, allocs, calls, left float64
			var n float64
			for _, r := range sel {
				each = append(each, fmt.Sprintf("%.0f", r.perSecond()))
				cpu += float64(r.cpu.Microseconds())
				allocs += float64(r.mallocs)
				calls += float64(r.redis.calls)
				left += float64(r.left)
				n += float64(r.n)
			}
			p("| %s | %s | %.0f | %s | %s | %.1f | %.0f | %.4f | %.0f |\n",
				src, c, med, strings.Join(each, ", "), ratio, cpu/n, allocs/n, calls/n, left)
		}
	}
	for _, c := range []string{consThrottle, consLayer, consReadme, consReadmePlain} {
		if (c == consLayer && !cfg.layer) || ((c == consReadme || c == consReadmePlain) && !cfg.readme) || cfg.againstThrottle() {
			continue
		}
		p("\nPer round, %s ÷ the bare run of the same round:", c)
		for _, src := range cfg.scenarios {
			p(" %s %s;", src, strings.Join(perRound(cfg, runs, src, c, consBare), ", "))
		}
	}
	for _, c := range []struct{ name, what string }{{consDedupe, "dedupe"}, {consWindow, "a send window"}, {consConc, "a concurrency layer"}} {
		if (c.name == consDedupe && !cfg.dedupe) || (c.name == consWindow && !cfg.window) || (c.name == consConc && !cfg.concurrency) {
			continue
		}
		p("\nPer round, %s ÷ %s of the same round (the cost of %s):", c.name, consThrottle, c.what)
		for _, src := range cfg.scenarios {
			p(" %s %s;", src, strings.Join(perRound(cfg, runs, src, c.name, consThrottle), ", "))
		}
		var meds []string
		for _, src := range cfg.scenarios {
			v := perRoundRatios(cfg, runs, src, c.name, consThrottle)
			meds = append(meds, fmt.Sprintf("%s **%.2f×**", src, median(v)))
		}
		p(" median %s.", strings.Join(meds, ", "))
	}
	if cfg.concurrency {
		p("\n\nRedis (the private server) per message, over the rounds:")
		for _, src := range cfg.scenarios {
			for _, c := range []string{consThrottle, consConc} {
				var cpu time.Duration
				var scripts, cmds, n int64
				for _, r := range runs {
					if r.source == src && r.consumer == c && r.round > 0 {
						cpu, scripts, cmds, n = cpu+r.redis.cpu, scripts+r.redis.scripts, cmds+r.redis.cmds, n+int64(r.n)
					}
				}
				if n > 0 {
					p(" %s, %s: %.1f µs CPU, %.3f scripts, %.2f commands;", src, c, float64(cpu.Nanoseconds())/1e3/float64(n), float64(scripts)/float64(n), float64(cmds)/float64(n))
				}
			}
		}
	}
	if cfg.againstThrottle() {
		p("\n\nLoad average (1, 5, 15 min) at the end of each run:\n\n")
		p("| source | round | consumer | msg/s | load |\n|---|--:|---|--:|---|\n")
		for _, r := range runs {
			p("| %s | %d | %s | %.0f | %s |\n", r.source, r.round, r.consumer, r.perSecond(), r.load)
		}
	}
	p("\n\n")
	if cfg.dedupe {
		p("`%s`: delivery.dedupe keyed by the recipient (`key: '{{.JSON.to}}'`, window 1h); every message has its own, so each is claimed and marked once: two operations a message, those of concurrent handlers batched into one script call.\n\n", consDedupe)
	}
	if cfg.window {
		p("`%s`: limit.extra holds a send window by number (`key: '{{e164 .JSON.to}}'`, `timezone: e164`, open 00:00 to 24:00 every day), so none is set aside; a leased message well inside the window asks Redis nothing, others are decided in one layers script call (batched with the other leased messages); every message has its own recipient.\n\n", consWindow)
	}
	if cfg.concurrency {
		p("`%s`: limit.extra holds a concurrency layer, 3 slots per key (`key: '{{slice .JSON.to 8}}'`, the recipient's last 4 digits: %s keys; the default lease), so each message takes a slot with its grant and gives it back when its sink call returned. Each key has a message every %s, so the cap never makes one wait: this is the layer's cost.\n\n", consConc, fmtThousands(concKeys), fmtThousands(concKeys))
	}
	if cfg.readme {
		p("`%s`: the configuration of README.md's \"Run the binary\" with the benchmark's Redis, bucket, limit (out of reach), source and sink: `cost_template: '{{sms_segments .JSON.text}}'`, the per-recipient layer (`rate: 5/h, burst: 5, on_exceed: dead_letter`; every message has its own recipient, so it refuses none), an `Authorization` header, a form body from `body_template`, and the defaults for the rest (metrics on a free port, log level info). `%s`: the same without the layer.\n\n", consReadme, consReadmePlain)
	}
	if cfg.layer {
		p("`%s`: limit.extra holds a keyed layer, one bucket per recipient (`key: '{{.JSON.to}}'`, rate 1000, burst 1000), and every message has its own recipient, so each run creates as many layer keys in Redis as it has messages.\n\n", consLayer)
	}

	if cfg.tracing {
		tracingMarkdown(p, cfg, runs)
	}

	if cfg.againstThrottle() {
		return b.String()
	}
	p("Limit in reach (%s/s, burst %d), throttle only, about %v of messages:\n\n", fmtThousands(cfg.inReach), int(cfg.inReach/10), cfg.inReachFor)
	p("| source | messages | rate after the first second | accuracy | max 1 s window (bound rate + burst) | Redis calls/msg | left in broker |\n")
	p("|---|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range runs {
		if r.round != 0 || r.consumer != consThrottle || r.rate == 1e6 {
			continue
		}
		p("| %s | %d | %.0f/s | %+.2f%% | %d (%d) | %.4f | %d |\n", r.source, r.n, r.steadyRate(),
			(r.steadyRate()/r.rate-1)*100, r.maxWindow(), int(r.rate)+r.burst, float64(r.redis.calls)/float64(r.n), r.left)
	}
	p("\n- consumer CPU: user + system time of the benchmark process over the run (the sink and kfake run in the child process, Redis and RabbitMQ in their own), per message.\n")
	p("- allocs/msg: heap allocations of the benchmark process over the run, per message.\n")
	p("- Redis calls/msg: commands the private Redis counted (INFO commandstats, without INFO and the commands scripts run), over the whole run including start-up, heartbeats and the replica's 5 s bucket reads, per message.\n")
	p("- left in broker: messages still ready in the queue, or the group's lag, after the consumer stopped (0: every message was acked or committed).\n")
	p("- accuracy: the rate at the sink from 1 s after the first message to the last, against the limit.\n")
	return b.String()
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func fmtThousands(f float64) string {
	s := fmt.Sprintf("%.0f", f)
	var out []byte
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

// tracingMarkdown is the section of the tracing runs: each against
// throttle with tracing off, the runs of the same rounds.
func tracingMarkdown(p func(string, ...any), cfg e2eConfig, runs []e2eRun) {
	p("Tracing (`tracing.enabled: true`, OTLP/HTTP to an exporter endpoint in the child process that decodes and counts the spans; the batch processor's defaults), against `throttle` with tracing off, same rounds; the messages carry no `traceparent`, so every trace starts at the replica and the ratio decides:\n\n")
	p("| source | consumer | msg/s (median) | runs, msg/s | ÷ tracing off | consumer CPU µs/msg | allocs/msg | spans exported/msg |\n")
	p("|---|---|--:|---|--:|--:|--:|--:|\n")
	for _, src := range cfg.scenarios {
		var offMed float64
		for _, c := range []string{consThrottle, consTrace1, consTrace001} {
			var each []string
			var vals []float64
			var cpu, allocs, spans, n float64
			for _, r := range runs {
				if r.source != src || r.consumer != c || r.round == 0 {
					continue
				}
				vals = append(vals, r.perSecond())
				each = append(each, fmt.Sprintf("%.0f", r.perSecond()))
				cpu += float64(r.cpu.Microseconds())
				allocs += float64(r.mallocs)
				spans += float64(r.spans)
				n += float64(r.n)
			}
			if len(vals) == 0 {
				continue
			}
			med := median(vals)
			ratio, sp := "—", "—"
			if c == consThrottle {
				offMed = med
			} else {
				ratio = fmt.Sprintf("**%.2f×**", med/offMed)
				sp = fmt.Sprintf("%.3f", spans/n)
			}
			p("| %s | %s | %.0f | %s | %s | %.1f | %.0f | %s |\n", src, c, med, strings.Join(each, ", "), ratio, cpu/n, allocs/n, sp)
		}
	}
	p("\nPer round, ÷ throttle with tracing off in the same round:")
	for _, c := range []string{consTrace1, consTrace001} {
		for _, src := range cfg.scenarios {
			ratios := perRound(cfg, runs, src, c, consThrottle)
			p(" %s, %s: %s;", c, src, strings.Join(ratios, ", "))
		}
	}
	p("\n\nspans exported/msg: spans the receiver decoded over the run, per message (a traced message makes 3: its consumer span, its wait, its POST; fewer at ratio 1 means the batch processor's queue was full and dropped some).\n\n")
}

// perRoundRatios returns, for each round of src that ran both, the rate of
// consumer c over the rate of consumer base in that round.
func perRoundRatios(cfg e2eConfig, runs []e2eRun, src, c, base string) []float64 {
	var out []float64
	for round := 1; round <= cfg.rounds; round++ {
		var x, y float64
		for _, r := range runs {
			if r.source == src && r.round == round {
				switch r.consumer {
				case c:
					x = r.perSecond()
				case base:
					y = r.perSecond()
				}
			}
		}
		if x > 0 && y > 0 {
			out = append(out, x/y)
		}
	}
	return out
}

// perRound is perRoundRatios formatted.
func perRound(cfg e2eConfig, runs []e2eRun, src, c, base string) []string {
	var out []string
	for _, r := range perRoundRatios(cfg, runs, src, c, base) {
		out = append(out, fmt.Sprintf("%.2f", r))
	}
	return out
}
