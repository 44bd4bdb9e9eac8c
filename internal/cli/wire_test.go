package cli

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttlehq/throttle/config"
	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/internal/backend"
	"github.com/throttlehq/throttle/internal/testenv"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/sinks/postgres"
)

// TestDocsPushWebhookStartsAndRenders is a regression test on the
// binary's path: the documented push-webhook template (docs/configuration.md) made
// `throttle run` exit 2 with `function "json" not defined`, because config
// parsed templates without the sink's functions. Loading the file (what
// run does first) and building the sink from it (what run does next) must
// both succeed, and the sink must render the template.
func TestDocsPushWebhookStartsAndRenders(t *testing.T) {
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- r.Header.Get("Authorization") + " " + string(b)
	}))
	defer srv.Close()
	t.Setenv("PUSH_TOKEN", "p$$sw0rd") // expanded once: "$$" reaches the sink as is
	path := writeConfig(t, `
limit: {bucket: push, rate: 240/min}
source: {kafka: {brokers: ["127.0.0.1:9092"], topic: push, group: g}}
sink:
  http:
    url: "`+srv.URL+`/v1/send"
    headers: {Authorization: "Bearer ${PUSH_TOKEN}"}
    body_template: '{"token":{{json .JSON.device}}}'
`)
	cfg, err := loadConfig(path)
	if err != nil {
		t.Fatalf("loading the documented push-webhook configuration: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, closeSink, err := testBuilder(t, cfg).sink(ctx, testBucket(t), io.Discard)
	if err != nil {
		t.Fatalf("starting the sink: %v", err)
	}
	defer closeSink()
	if err := s.Send(ctx, consumer.Message{Body: []byte(`{"device":"tok-1"}`)}); err != nil {
		t.Fatal(err)
	}
	if req, want := <-got, `Bearer p$$sw0rd {"token":"tok-1"}`; !strings.Contains(req, want) {
		t.Errorf("request %q, want %q", req, want)
	}
}

// TestPostgresMissingTableNamesTheKey checks that the sink's error, which
// names its Go field, reaches the user with the YAML key to set.
func TestPostgresMissingTableNamesTheKey(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b := builder{lib: &config.Libraries{Postgres: &postgres.Config{DSN: dsn, Table: "surely_missing_table_wire_test"}}}
	_, _, err := b.sink(ctx, testBucket(t), io.Discard)
	if err != nil && strings.Contains(err.Error(), "connecting") {
		testenv.Missing(t, "PostgreSQL", "check PGHOST/PGPORT or DATABASE_URL", err)
	}
	if err == nil || !strings.Contains(err.Error(), "sink.postgres.create_table: true creates it") {
		t.Fatalf("sink = %v, want the create_table hint", err)
	}
}

// takeRecorder is a store on the in-process memory stores that records
// the class and keys of every request, plain or layered.
type takeRecorder struct {
	*backend.LayeredMemory
	mu  sync.Mutex
	got []limiter.Request
}

func (r *takeRecorder) Take(ctx context.Context, req backend.TakeRequest) (backend.TakeResult, error) {
	r.record(limiter.Request{Cost: req.Cost, Priority: req.Priority})
	return r.LayeredMemory.Take(ctx, req)
}

func (r *takeRecorder) TakeLayers(ctx context.Context, req backend.LayerRequest) (backend.LayerResult, error) {
	r.record(limiter.Request{Cost: req.Cost, Priority: req.Priority, Keys: req.Keys})
	return r.LayeredMemory.TakeLayers(ctx, req)
}

func (r *takeRecorder) record(req limiter.Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, req)
}

// TestWaitLimiterClass: the consumer's limiter fills every request's class:
// limit.priority_header's value when a message carries it, limit.priority
// otherwise, with and without layers; a value that is not a class is a
// permanent error (dead-lettered with the reason) and takes no tokens.
func TestWaitLimiterClass(t *testing.T) {
	for _, extra := range []string{"", "\n  extra: [{name: per-recipient, rate: 1/s, key: '{{.Key}}'}]"} {
		cfg, err := config.Parse([]byte(`
limit: {bucket: b, rate: 10, priority: low, priority_header: x-priority`+strings.ReplaceAll(extra, "\n  ", ", ")+`}
source: {kafka: {brokers: ["127.0.0.1:9092"], topic: t, group: g}}
sink: {stdout: {}}
`), nil)
		if err != nil {
			t.Fatal(err)
		}
		lib, err := cfg.Libraries()
		if err != nil {
			t.Fatal(err)
		}
		layers := lib.Layers
		// A token short of full, refilled at one a second: a grant that
		// came back late still fits (a full bucket's would ask again,
		// Stats.Retimed, and the recorder would see its class twice).
		shared, err := backend.NewMemory(1, 10)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := shared.Take(t.Context(), backend.TakeRequest{Cost: 1}); err != nil {
			t.Fatal(err)
		}
		lm, err := backend.NewLayeredMemory(shared, layers)
		if err != nil {
			t.Fatal(err)
		}
		rec := &takeRecorder{LayeredMemory: lm}
		opts := lib.Limiter
		opts.Lease.Disabled = true
		b, err := limiter.New(rec, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		lim, err := consumerLimiter(lib.Limit, b, newMetrics("kafka"))
		if err != nil {
			t.Fatal(err)
		}
		ml := lim
		ctx := t.Context()
		msg := func(class string) consumer.Message {
			m := consumer.Message{Key: []byte("+15550001"), Headers: map[string]string{}}
			if class != "" {
				m.Headers["x-priority"] = class
			}
			return m
		}
		_ = ml.WaitMessage(ctx, msg("high"), 2)
		_ = ml.WaitMessage(ctx, msg(""), 1)
		_ = ml.Wait(ctx, 1)
		err = ml.WaitMessage(ctx, msg("urgent"), 1)
		if !consumer.IsPermanent(err) || !strings.Contains(err.Error(), `"urgent"`) {
			t.Errorf("extra %q: a header that is not a class: %v, want a permanent error naming the value", extra, err)
		}
		want := []limiter.Priority{limiter.PriorityHigh, limiter.PriorityLow, limiter.PriorityLow}
		if len(rec.got) != len(want) {
			t.Fatalf("extra %q: %d requests %+v, want %d", extra, len(rec.got), rec.got, len(want))
		}
		for i, req := range rec.got {
			if req.Priority != want[i] {
				t.Errorf("extra %q: request %d in class %v, want %v", extra, i, req.Priority, want[i])
			}
		}
		if extra != "" && rec.got[0].Keys["per-recipient"] != "+15550001" {
			t.Errorf("the layered request lost its key: %+v", rec.got[0])
		}
		if rec.got[0].Cost != 2 {
			t.Errorf("cost %d, want 2", rec.got[0].Cost)
		}
	}
}

// TestPriorityConfigErrorsExit2: an unknown class or a share out of range
// stops the start with exit 2, each problem under its YAML key.
func TestPriorityConfigErrorsExit2(t *testing.T) {
	path := writeConfig(t, `
limit: {bucket: b, rate: 10, priority: urgent, min_share: {low: 1.5, bulk: 0.1}}
source: {kafka: {brokers: ["127.0.0.1:9"], topic: t, group: g}}
sink: {stdout: {}}
metrics: {listen: "off"}
`)
	code, _, stderr := runCLI(t, "run", "--config", path)
	if code != ExitUsage {
		t.Errorf("exit code %d, want %d; stderr:\n%s", code, ExitUsage, stderr)
	}
	for _, want := range []string{
		`limit.priority: must be high, normal or low, got "urgent"`,
		"limit.min_share.low: must be a fraction >= 0 and < 1, got 1.5",
		`limit.min_share: a key must be high, normal or low, got "bulk"`,
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
}

// testBuilder returns the builder of cfg, as run makes it.
func testBuilder(t *testing.T, cfg *config.Config) builder {
	t.Helper()
	lib, err := cfg.Libraries()
	if err != nil {
		t.Fatal(err)
	}
	return builder{lib: lib, m: newMetrics("kafka"), log: slog.New(slog.DiscardHandler)}
}

// testBucket returns an in-process bucket, closed with the test.
func testBucket(t *testing.T) *limiter.Bucket {
	t.Helper()
	b, err := limiter.NewLocal(1000, 100)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}
