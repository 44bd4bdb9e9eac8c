package msgtmpl

import (
	"fmt"
	"testing"
	"time"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/internal/backend"
)

// BenchmarkWindowMessage is the replica's work of a send window by number
// for one message, as a consumer does it: the key template
// `{{e164 .JSON.to}}` by the fast path, then the window layer's zone,
// country and open intervals for that key (backend.WindowSpans). New:
// every message its own recipient (the numbers of the end-to-end
// benchmark, +1 555 0xx xxxx, 131,072 of them in turn, more than the
// country cache holds); Same: one recipient again and again. Zones: the
// window by number alone (timezone: e164); Countries: with a calendar of
// its own for FR (which a +1 number cannot be in); CountriesUS: with one
// for US, so that every +1 number's country is needed (libphonenumber's
// validation against each country of +1).
func BenchmarkWindowMessage(b *testing.B) {
	const distinct = 1 << 17
	fresh := make([]consumer.Message, distinct)
	for i := range fresh {
		fresh[i] = consumer.Message{Body: fmt.Appendf(nil, `{"to":"+15550%06d","text":"message %d"}`, i, i)}
	}
	same := []consumer.Message{{Body: []byte(`{"to":"+12125550100","text":"message 1"}`)}}
	c, err := compile("key", `{{e164 .JSON.to}}`)
	if err != nil || c.fast == nil {
		b.Fatal("no fast path", err)
	}
	day := backend.Calendar{From: 0, To: 24 * time.Hour}
	at := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	for _, w := range []struct {
		name string
		win  backend.Window
	}{
		{"Zones", backend.Window{Calendar: day, ByNumber: true, DefaultLocation: time.UTC}},
		{"Countries", backend.Window{Calendar: day, ByNumber: true, DefaultLocation: time.UTC,
			Countries: map[string]backend.Calendar{"FR": {From: 8 * time.Hour, To: 20 * time.Hour}}}},
		{"CountriesUS", backend.Window{Calendar: day, ByNumber: true, DefaultLocation: time.UTC,
			Countries: map[string]backend.Calendar{"US": day}}},
	} {
		layer := backend.Layer{Name: "quiet-hours", Keyed: true, Window: &w.win}
		for _, src := range []struct {
			name string
			msgs []consumer.Message
		}{{"New", fresh}, {"Same", same}} {
			b.Run(src.name+"/"+w.name, func(b *testing.B) {
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					var d *Data
					key, err := c.render(src.msgs[i%len(src.msgs)], &d)
					if err != nil {
						b.Fatal(err)
					}
					spans, err := backend.WindowSpans(layer, key, backend.PriorityNormal, at)
					if err != nil || len(spans) == 0 {
						b.Fatal(spans, err)
					}
					i++
				}
			})
		}
	}
}
