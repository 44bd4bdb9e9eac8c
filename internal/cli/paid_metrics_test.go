package cli

import (
	"testing"

	"github.com/throttlehq/throttle/limiter"
)

// TestPaidRefusedMetric: a paid slot refused for its signature counts in
// throttle_paid_slots_refused_total by its layer, or "other" when the
// limiter names none (a layer that is not configured), so that a producer's
// made-up layer names add no series.
func TestPaidRefusedMetric(t *testing.T) {
	m := newMetrics("rabbitmq")
	o := layerObserver(m, m.limiterObserver(), []limiter.Layer{{Name: "per-recipient"}}, false, false)
	o.PaidRefused("per-recipient")
	o.PaidRefused("per-recipient")
	o.PaidRefused("")
	families, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "throttle_paid_slots_refused_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				got[l.GetName()+"="+l.GetValue()] = s.GetCounter().GetValue()
			}
		}
	}
	if len(got) != 2 || got["layer=per-recipient"] != 2 || got["layer=other"] != 1 {
		t.Errorf("throttle_paid_slots_refused_total = %v, want per-recipient 2 and other 1", got)
	}
}
