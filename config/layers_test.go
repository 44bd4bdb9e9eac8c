package config

import (
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/sinks/httpsink"
)

// layersDoc is the layered example: a per-recipient bucket, a
// per-sender bucket and a daily cap in New York.
const layersDoc = `
limit:
  bucket: sms-outbound
  rate: 100
  burst: 200
  extra:
    - name: per-recipient
      key: '{{.JSON.to}}'
      rate: 5/h
      burst: 5
      on_exceed: dead_letter
    - name: per-sender
      key: '{{index .Headers "x-from"}}'
      rate: 1/s
      burst: 1
    - name: daily-cap
      quota: 200000
      per: day
      timezone: America/New_York
      on_exceed: delay
source:
  kafka:
    brokers: ["127.0.0.1:9092"]
    topic: sms
    group: g
sink:
  stdout: {}
`

func TestLimitExtraMapsOntoLayers(t *testing.T) {
	cfg := mustParse(t, layersDoc, nil)
	layers, err := cfg.Limit.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if lib := libs(t, cfg); len(lib.Layers) != len(layers) || !lib.Kafka.SetAside {
		t.Errorf("Libraries: %d layers, Kafka.SetAside %v; want %d and true (daily-cap delays)", len(lib.Layers), lib.Kafka.SetAside, len(layers))
	}
	ny, _ := time.LoadLocation("America/New_York")
	want := []limiter.Layer{
		{Name: "per-recipient", Keyed: true, Rate: 5.0 / 3600, Burst: 5, OnExceed: limiter.ActionDeadLetter},
		{Name: "per-sender", Keyed: true, Rate: 1, Burst: 1},
		{Name: "daily-cap", Quota: 200000, Per: limiter.PerDay, Location: ny, OnExceed: limiter.ActionDelay},
	}
	if len(layers) != len(want) {
		t.Fatalf("layers = %+v", layers)
	}
	for i := range want {
		g, w := layers[i], want[i]
		if g.Name != w.Name || g.Keyed != w.Keyed || g.Rate != w.Rate || g.Burst != w.Burst || g.Quota != w.Quota ||
			g.Per != w.Per || g.OnExceed != w.OnExceed || (w.Location != nil && g.Location.String() != w.Location.String()) {
			t.Errorf("layer %d = %+v, want %+v", i, g, w)
		}
	}
	keys := libs(t, cfg).Limit.Keys
	got, err := keys(consumer.Message{Body: []byte(`{"to":"+15551234567"}`), Headers: map[string]string{"x-from": "+15550000001"}})
	if err != nil || got["per-recipient"] != "+15551234567" || got["per-sender"] != "+15550000001" || len(got) != 2 {
		t.Errorf("keys = %v, %v", got, err)
	}
	// A key that renders empty, or fails, is a permanent error naming the layer.
	_, err = keys(consumer.Message{Body: []byte(`{"to":"+15551234567"}`)})
	if !consumer.IsPermanent(err) || !strings.Contains(err.Error(), `"per-sender"`) || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty sender key: %v, want a permanent error naming per-sender", err)
	}
	_, err = keys(consumer.Message{Body: []byte(`not json`), Headers: map[string]string{"x-from": "a"}})
	if !consumer.IsPermanent(err) || !strings.Contains(err.Error(), `"per-recipient"`) {
		t.Errorf("no JSON body: %v, want a permanent error naming per-recipient", err)
	}
}

// TestLayerKeysNullAndNotJSON: a recipient that is JSON null, or missing,
// is a permanent error naming the layer, its YAML key and the field, never
// the key "<no value>", which stays a recipient of its own; a body that is
// not JSON says so.
func TestLayerKeysNullAndNotJSON(t *testing.T) {
	keys := libs(t, mustParse(t, layersDoc, nil)).Limit.Keys
	hdr := map[string]string{"x-from": "+15550000001"}
	for _, body := range []string{`{"to":null}`, `{"to":null,"x":1}`} {
		got, err := keys(consumer.Message{Body: []byte(body), Headers: hdr})
		if !consumer.IsPermanent(err) || !strings.Contains(err.Error(), `"per-recipient" (limit.extra[0].key)`) ||
			!strings.Contains(err.Error(), "{{.JSON.to}} has no value") {
			t.Errorf("%s: keys = %q, %v; want a permanent error naming per-recipient, its key and .JSON.to", body, got, err)
		}
	}
	got, err := keys(consumer.Message{Body: []byte(`{"to":"<no value>"}`), Headers: hdr})
	if err != nil || got["per-recipient"] != "<no value>" {
		t.Errorf(`"<no value>" as a recipient: %q, %v`, got, err)
	}
	_, err = keys(consumer.Message{Body: []byte(`to=+1555`), Headers: hdr})
	if !consumer.IsPermanent(err) || !strings.Contains(err.Error(), `"per-recipient"`) || !strings.Contains(err.Error(), "message body is not JSON: invalid character") {
		t.Errorf("a body that is not JSON: %v", err)
	}
}

func TestLimitExtraBadInputs(t *testing.T) {
	layer := func(s string) string {
		return strings.Replace(minimal, "rate: 10\n", "rate: 10\n  extra:\n    - name: l\n"+s, 1)
	}
	cases := []struct {
		name, doc, key, want string
	}{
		{"bad rate string", layer("      rate: 5/week\n"), "limit.extra[0].rate", "5/week"},
		{"unknown on_exceed", layer("      rate: 1\n      on_exceed: drop\n"), "limit.extra[0].on_exceed", "wait, dead_letter or delay"},
		{"template that does not parse", layer("      rate: 1\n      key: '{{.JSON.to'\n"), "limit.extra[0].key", "limit.extra[0].key"},
		{"quota together with rate", layer("      rate: 1\n      quota: 5\n      per: day\n"), "limit.extra[0].quota", "no Rate or Burst"},
		{"unknown time zone", layer("      quota: 5\n      per: day\n      timezone: Mars/Olympus\n"), "limit.extra[0].timezone", "Mars/Olympus"},
		{"unknown period", layer("      quota: 5\n      per: week\n"), "limit.extra[0].per", "hour, day or month"},
		{"neither rate nor quota", layer("      key: '{{.Key}}'\n"), "limit.extra[0].rate", "needs a rate (Rate, a token bucket) or a quota"},
		{"concurrency with rate", layer("      rate: 1\n      concurrency: 3\n"), "limit.extra[0].concurrency", "no Rate, Burst, Quota or Per"},
		{"negative concurrency", layer("      concurrency: -1\n"), "limit.extra[0].concurrency", ">= 1"},
		{"lease without concurrency", layer("      lease: 10s\n"), "limit.extra[0].concurrency", ">= 1"},
		{"max_wait with wait", layer("      rate: 1\n      max_wait: 1s\n"), "limit.extra[0].max_wait", "dead_letter or delay"},
		{"duplicate names", strings.Replace(layer("      rate: 1\n"), "    - name: l\n      rate: 1\n", "    - name: l\n      rate: 1\n    - name: l\n      rate: 2\n", 1), "limit.extra[1].name", "another layer"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc), env(nil))
			if err == nil {
				t.Fatalf("Parse succeeded:\n%s", tc.doc)
			}
			for _, p := range problemsOf(t, err) {
				if p.Key == tc.key && strings.Contains(p.Message, tc.want) {
					return
				}
			}
			t.Errorf("problems %v; want one under %s containing %q", problemsOf(t, err), tc.key, tc.want)
		})
	}
}

// TestConcurrencyLeaseDefault: a concurrency layer's lease is what the YAML
// says, else the HTTP sink's timeout times the attempts, else the
// library's default.
func TestConcurrencyLeaseDefault(t *testing.T) {
	t.Parallel()
	layer := "  extra:\n    - name: per-endpoint\n      key: '{{.JSON.endpoint}}'\n      concurrency: 3\n"
	cases := []struct {
		name, extra, sink string
		want              time.Duration
	}{
		{"given", "      lease: 30s\n", "sink: {http: {url: 'http://127.0.0.1/', timeout: 2s}}\ndelivery: {max_attempts: 3}\n", 30 * time.Second},
		{"timeout × attempts", "", "sink: {http: {url: 'http://127.0.0.1/', timeout: 2s}}\ndelivery: {max_attempts: 3}\n", 6 * time.Second},
		{"default timeout × default attempts", "", "sink: {http: {url: 'http://127.0.0.1/'}}\n", httpsink.DefaultTimeout * consumer.DefaultMaxAttempts},
		{"no HTTP sink: the library's default", "", "sink: {stdout: {}}\n", limiter.DefaultLease},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			doc := strings.Replace(minimal, "rate: 10\n", "rate: 10\n"+layer+tc.extra, 1)
			doc = strings.Replace(doc, "sink:\n  stdout: {}\n", tc.sink, 1)
			cfg, err := Parse([]byte(doc), env(nil))
			if err != nil {
				t.Fatalf("%v\n%s", err, doc)
			}
			lib, err := cfg.Libraries()
			if err != nil {
				t.Fatal(err)
			}
			if err := limiter.Layers(lib.Layers).Validate(); err != nil {
				t.Fatal(err)
			}
			if got := lib.Layers[0].Lease; got != tc.want || lib.Layers[0].Concurrency != 3 {
				t.Errorf("lease %v concurrency %d, want %v and 3", got, lib.Layers[0].Concurrency, tc.want)
			}
		})
	}
}
