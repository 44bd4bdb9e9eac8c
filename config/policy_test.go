package config

import (
	"strings"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/limiter"
)

// policyDoc is the contract's example: a send window by number and a daily
// budget.
const policyDoc = `
limit:
  bucket: sms
  rate: 100
  cost_template: '{{sms_segments .JSON.text}}'
  prices: {currency: USD, default: 0.0079, per_segment: true, countries: {GB: 0.04}}
  extra:
    - name: quiet-hours
      key: '{{e164 .JSON.to}}'
      window: {from: "08:00", to: "21:00", days: mon-sun}
      timezone: e164
      default_timezone: UTC
      countries: {FR: {from: "08:00", to: "20:00", days: mon-sat}}
      exempt: [high]
    - name: daily-spend
      budget: 500.00
      per: day
      timezone: UTC
source:
  rabbitmq: {url: "amqp://guest:guest@127.0.0.1:5672/", queue: sms}
sink:
  stdout: {}
`

func TestPolicyMapsOntoLayers(t *testing.T) {
	cfg := mustParse(t, policyDoc, nil)
	lib := libs(t, cfg)
	if len(lib.Layers) != 2 || !lib.RabbitMQ.SetAside {
		t.Fatalf("layers %+v, SetAside %v; want 2 and true (a window sets aside by default)", lib.Layers, lib.RabbitMQ.SetAside)
	}
	w := lib.Layers[0].Window
	if w == nil || !lib.Layers[0].Keyed || !w.ByNumber || w.From != 8*time.Hour || w.To != 21*time.Hour || w.Days != limiter.EveryDay ||
		w.DefaultLocation.String() != "UTC" || len(w.Exempt) != 1 || w.Exempt[0] != limiter.PriorityHigh {
		t.Errorf("window = %+v", w)
	}
	fr := w.Countries["FR"]
	if fr.To != 20*time.Hour || fr.Days.Has(time.Sunday) || !fr.Days.Has(time.Saturday) {
		t.Errorf("FR = %+v", fr)
	}
	b := lib.Layers[1]
	if b.Budget != 500_000_000 || b.Per != limiter.PerDay || b.Location.String() != "UTC" {
		t.Errorf("budget = %+v", b)
	}
	p := lib.Limit.Prices
	if p == nil || p.Default != 7900 || p.Countries["GB"] != 40_000 || !p.PerSegment || p.Currency != "USD" {
		t.Fatalf("prices = %+v", p)
	}
	// The recipient is the window's key, normalised.
	to, err := lib.Limit.Recipient(consumer.Message{Body: []byte(`{"to":"+44 20 7946 0000"}`)})
	if err != nil || to != "+442079460000" {
		t.Errorf("recipient = %q, %v", to, err)
	}
	if price, err := p.Price(to, 3, "daily-spend"); err != nil || price != 120_000 {
		t.Errorf("3 segments to GB = %v, %v; want 0.12", price, err)
	}
	keys, err := lib.Limit.Keys(consumer.Message{Body: []byte(`{"to":"12125550100"}`)})
	if err != nil || keys["quiet-hours"] != "+12125550100" {
		t.Errorf("keys = %v, %v", keys, err)
	}
	if _, err := lib.Limit.Keys(consumer.Message{Body: []byte(`{"to":"call me"}`)}); !consumer.IsPermanent(err) || !strings.Contains(err.Error(), "e164") {
		t.Errorf("a recipient that is not a number: %v, want a permanent error from e164", err)
	}
}

func TestPolicyBadInputs(t *testing.T) {
	layer := func(s string) string {
		return strings.Replace(minimal, "rate: 10\n", "rate: 10\n  extra:\n    - name: l\n"+s, 1)
	}
	win := "      key: '{{.JSON.to}}'\n      window: {from: \"08:00\", to: \"21:00\"}\n"
	cases := []struct {
		name, doc, key, want string
	}{
		{"bad clock", layer("      window: {from: \"8am\", to: \"21:00\"}\n"), "limit.extra[0].window.from", "HH:MM"},
		{"bad days", layer("      window: {from: \"08:00\", to: \"21:00\", days: weekdays}\n"), "limit.extra[0].window.days", "mon-fri"},
		{"from equals to", layer("      window: {from: \"08:00\", to: \"08:00\"}\n"), "limit.extra[0].window", "differ"},
		{"unknown zone", layer(win + "      timezone: Mars/Olympus\n"), "limit.extra[0].timezone", "Mars/Olympus"},
		{"e164 without key", layer("      window: {from: \"08:00\", to: \"21:00\"}\n      timezone: e164\n"), "limit.extra[0].key", "keyed"},
		{"unknown exempt class", layer(win + "      exempt: [urgent]\n"), "limit.extra[0].exempt[0]", "urgent"},
		{"countries without window", layer("      rate: 1\n      countries: {FR: {from: \"08:00\", to: \"20:00\"}}\n"), "limit.extra[0].countries", "only to a window"},
		{"window with rate", layer(win + "      rate: 1\n"), "limit.extra[0].window", "no Rate"},
		{"budget with seven decimals", layer("      budget: 0.0000001\n      per: day\n"), "limit.extra[0].budget", "6 decimals"},
		{"budget without period", layer("      budget: 5\n"), "limit.extra[0].per", "hour, day or month"},
		{"budget without prices", layer("      budget: 5\n      per: day\n"), "limit.prices", "budget"},
		{"prices by country without recipient", strings.Replace(layer("      budget: 5\n      per: day\n"), "  extra:", "  prices: {countries: {GB: 0.04}}\n  extra:", 1), "limit.prices.recipient", "required"},
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
