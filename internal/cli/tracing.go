package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/throttlehq/throttle/internal/telemetry"
)

// tracingShutdownTimeout bounds the export of the spans still buffered
// when the replica stops.
const tracingShutdownTimeout = 5 * time.Second

// exportErrorEvery is the least time between two "exporting spans failed"
// lines while the collector is unreachable.
const exportErrorEvery = time.Minute

// startTracing returns the TracerProvider of tracing.* (lib.Tracing; nil
// when tracing is off) and the function that flushes and stops it: an
// OTLP/HTTP exporter configured by the standard OTEL_EXPORTER_OTLP_*
// variables, batching (OTEL_BSP_*), parent-based sampling at o.SampleRatio
// unless OTEL_TRACES_SAMPLER names the sampler, and a resource with
// service.name "throttle" (OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
// win), the version and the replica's ID. OTEL_SDK_DISABLED=true turns
// tracing off. An OTLP protocol other than http/protobuf is a
// configuration error: only OTLP/HTTP is built in. A collector that cannot
// be reached does not stop the replica: its spans are dropped, with a warn
// line at most once a minute.
func startTracing(ctx context.Context, o *telemetry.Options, replica string, log *slog.Logger) (trace.TracerProvider, func(), error) {
	if o == nil {
		return nil, func() {}, nil
	}
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		log.Info("tracing is off: OTEL_SDK_DISABLED is true")
		return nil, func() {}, nil
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if v := strings.TrimSpace(os.Getenv(name)); v != "" {
			if v != "http/protobuf" {
				return nil, nil, &configError{err: fmt.Errorf("tracing: %s=%s is not supported: spans are exported over OTLP/HTTP (http/protobuf)", name, v)}
			}
			break // the signal's own variable wins
		}
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, &configError{err: fmt.Errorf("tracing: the OTLP exporter: %w", err)}
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName("throttle"), semconv.ServiceVersion(version), semconv.ServiceInstanceID(replica)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, nil, &configError{err: fmt.Errorf("tracing: OTEL_RESOURCE_ATTRIBUTES: %w", err)}
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithBatcher(exp), sdktrace.WithResource(res)}
	sampler := "OTEL_TRACES_SAMPLER=" + os.Getenv("OTEL_TRACES_SAMPLER")
	if os.Getenv("OTEL_TRACES_SAMPLER") == "" {
		opts = append(opts, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.SampleRatio))))
		sampler = fmt.Sprintf("parent-based, ratio %g", o.SampleRatio)
	}
	otel.SetErrorHandler(newExportErrorLog(log))
	tp := sdktrace.NewTracerProvider(opts...)
	log.Info("tracing", "sampler", sampler, "exporter", "otlp/http")
	stop := func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tracingShutdownTimeout)
		defer cancel()
		if err := tp.Shutdown(sctx); err != nil {
			log.Warn("tracing: flushing the last spans failed", "err", err)
		}
	}
	return tp, stop, nil
}

// exportErrorLog logs the SDK's errors (a failed export, mostly) at warn
// level, at most once per exportErrorEvery, with the number left out.
type exportErrorLog struct {
	log *slog.Logger

	mu      sync.Mutex
	last    time.Time
	dropped int
}

func newExportErrorLog(log *slog.Logger) *exportErrorLog { return &exportErrorLog{log: log} }

// Handle implements otel.ErrorHandler.
func (l *exportErrorLog) Handle(err error) {
	l.mu.Lock()
	now := time.Now()
	if !l.last.IsZero() && now.Sub(l.last) < exportErrorEvery {
		l.dropped++
		l.mu.Unlock()
		return
	}
	dropped := l.dropped
	l.last, l.dropped = now, 0
	l.mu.Unlock()
	l.log.Warn("tracing: exporting spans failed; spans are dropped until the collector answers", "err", err, "errors_not_logged", dropped)
}
