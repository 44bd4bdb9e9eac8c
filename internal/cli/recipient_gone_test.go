package cli

import (
	"errors"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/throttlehq/throttle/consumer"
	"github.com/throttlehq/throttle/sinks/httpsink"
)

// TestRecipientGoneCounted: a dead letter whose error says the recipient is
// gone counts once under the sink's preset; other dead letters do not.
func TestRecipientGoneCounted(t *testing.T) {
	m := newMetrics("rabbitmq")
	m.setPreset("fcm")
	series := m.recipientGone.WithLabelValues("fcm")
	if got := testutil.ToFloat64(series); got != 0 {
		t.Fatalf("start: %v", got)
	}
	obs := m.consumerObserver()
	msg := consumer.Message{Source: consumer.Source{Broker: "rabbitmq"}}
	gone := consumer.Permanent(fmt.Errorf("send: %w", &httpsink.StatusError{StatusCode: 404, RecipientGone: true}))
	obs.DeadLettered(msg, gone)
	obs.DeadLettered(msg, consumer.Permanent(&httpsink.StatusError{StatusCode: 400}))
	obs.DeadLettered(msg, errors.New("out of attempts"))
	if got := testutil.ToFloat64(series); got != 1 {
		t.Errorf("throttle_sink_recipient_gone_total{preset=fcm} = %v, want 1", got)
	}
	none := newMetrics("kafka")
	none.setPreset("")
	if got := testutil.ToFloat64(none.recipientGone.WithLabelValues("none")); got != 0 {
		t.Errorf("no preset: %v", got)
	}
}
