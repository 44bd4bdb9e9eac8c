// Package telemetry is what the binary's tracing section (YAML key
// "tracing") means, with its default and its validation, once: config maps
// the YAML onto Options and reports Validate's problems under the YAML
// key; internal/cli builds the OpenTelemetry SDK from Options. The
// libraries take a trace.TracerProvider (consumer.Options.TracerProvider)
// and never import the SDK.
package telemetry

import (
	"fmt"
	"math"
)

// DefaultSampleRatio is the default of Options.SampleRatio: every trace
// that starts at a replica is sampled.
const DefaultSampleRatio = 1.0

// Options configure the binary's tracing. The exporter is configured by the
// standard OTEL_EXPORTER_OTLP_* variables (OTLP over HTTP). Options is a
// plain value, safe to copy.
type Options struct {
	// SampleRatio is the share of the traces that start at a replica
	// (messages without a traceparent) that are sampled, in [0, 1]. A
	// message whose traceparent is sampled is traced whatever the ratio,
	// and one whose traceparent is not sampled is not (parent-based
	// sampling), so that a trace is whole or absent. OTEL_TRACES_SAMPLER
	// (with OTEL_TRACES_SAMPLER_ARG), when set, replaces it.
	SampleRatio float64
}

// Validate returns nil or the problem of o: a SampleRatio outside [0, 1].
func (o Options) Validate() error {
	if math.IsNaN(o.SampleRatio) || o.SampleRatio < 0 || o.SampleRatio > 1 {
		return fmt.Errorf("%v must be within [0, 1]", o.SampleRatio)
	}
	return nil
}
